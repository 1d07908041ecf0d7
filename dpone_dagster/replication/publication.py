"""The group's publication: the tables whose changes the slot sends, and nothing else.

A dpone publication names exactly the group's tables (``FOR TABLE``) and publishes through the
partition root (``publish_via_partition_root = true``): a partitioned table's changes arrive as
its own, whichever partition holds the row, and the publication's tables are read from
``pg_publication_rel`` (the tables it names) rather than ``pg_publication_tables`` (which lists a
parent's partitions when the option is off). :func:`ensure_publication` makes it so in one
transaction; each server error of creating, altering or dropping it is raised as a coded error
(:func:`publication_error`): a table the role does not own, a publication another role owns, a
table dropped at the source.

PostgreSQL decodes a change with the catalog as of the change's place in the WAL: a table added
to the publication is sent from that ``ALTER`` on, a table dropped from it up to the ``ALTER``, and
the changes made while the publication did not exist are lost to the slot (PostgreSQL 15 fails
the slot's read there, 16 and later skip them). So a group never makes its publication again
under a streaming slot (:mod:`.follow` refuses with ``replication_publication_missing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName


@dataclass(frozen=True, slots=True)
class Publication:
    """A publication as the source's catalog has it.

    Attributes:
        name: Its name.
        comment: Its comment (a dpone publication's says which group made it), or None.
        owned: The session's role owns it (directly or through a role it is a member of).
        via_root: ``publish_via_partition_root`` is on.
        tables: The tables it names, sorted.
        entries: Each table's ``pg_publication_rel`` row OID: a table dropped from the
            publication and added again (or a publication made again) has a new one.
    """

    name: str
    comment: str | None
    owned: bool
    via_root: bool
    tables: tuple[TableName, ...]
    entries: Mapping[TableName, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PublicationChange:
    """What :func:`ensure_publication` changed.

    Attributes:
        created: The publication did not exist and was created.
        added: Tables added to it.
        removed: Tables removed from it.
    """

    created: bool
    added: tuple[TableName, ...]
    removed: tuple[TableName, ...]

    @property
    def changed(self) -> bool:
        """Whether anything was created, added or removed."""
        return self.created or bool(self.added or self.removed)


_READ = (
    "SELECT pg_catalog.obj_description(p.oid, 'pg_publication'),"
    " pg_catalog.pg_has_role(current_user, p.pubowner, 'USAGE'), p.pubviaroot,"
    " array(SELECT ARRAY[n.nspname::text, c.relname::text, r.oid::text]"
    "  FROM pg_catalog.pg_publication_rel AS r"
    "  JOIN pg_catalog.pg_class AS c ON c.oid = r.prrelid"
    "  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
    "  WHERE r.prpubid = p.oid ORDER BY 1)"
    " FROM pg_catalog.pg_publication AS p WHERE p.pubname = %s"
)


def read_publication(conn: Connection, publication: str) -> Publication | None:
    """``publication`` of ``conn``'s database, or None when it does not exist (one round
    trip)."""
    row = conn.execute(_READ, (publication,)).fetchone()
    if row is None:
        return None
    comment, owned, via_root, tables = row
    entries = {TableName(schema, name): int(oid) for schema, name, oid in tables}
    return Publication(publication, comment, bool(owned), bool(via_root), tuple(entries), entries)


def publication_tables(conn: Connection, publication: str) -> list[TableName] | None:
    """The tables ``publication`` names in ``conn``'s database, sorted, or None when it does
    not exist (one round trip)."""
    found = read_publication(conn, publication)
    return None if found is None else list(found.tables)


def ensure_publication(
    conn: Connection,
    publication: str,
    tables: Sequence[TableName],
    *,
    comment: str | None = None,
) -> PublicationChange:
    """Makes ``publication`` publish exactly ``tables``, through the partition root: creates it
    ``FOR TABLE ... WITH (publish_via_partition_root = true)``, or adds and removes tables and
    turns the option on when a table of the group is partitioned. All of it in one transaction
    of ``conn``; nothing when it is as it should be.

    Args:
        conn: A session of the source database (its role owns the tables).
        publication: The publication's name.
        tables: The group's tables.
        comment: Written on a publication created here (``COMMENT ON PUBLICATION``): the mark
            by which :mod:`.setup` knows the group's own slot and publication.

    Returns:
        What was created, added and removed.

    Raises:
        EngineError: the server refused a statement (:func:`publication_error`):
            ``publication_not_permitted``, ``replication_table_dropped``,
            ``replication_publication_missing``.
    """
    if not tables:
        raise ValueError("a publication needs at least one table")
    found = read_publication(conn, publication)
    if found is not None and set(found.tables) == set(tables) and _rooted(conn, found, tables):
        return PublicationChange(False, (), ())  # as it should be: no transaction
    with conn.transaction():
        found = read_publication(conn, publication)
        if found is None:
            for statement in _creation(publication, tables, comment):
                _run(conn, publication, statement)
            return PublicationChange(True, tuple(tables), ())
        added = tuple(t for t in tables if t not in set(found.tables))
        removed = tuple(t for t in found.tables if t not in set(tables))
        rooted = _rooted(conn, found, tables)
        for statement in _changes(found, added, removed, rooted=rooted):
            _run(conn, publication, statement)
        return PublicationChange(False, added, removed)


def _creation(
    publication: str, tables: Sequence[TableName], comment: str | None
) -> list[sql.Composed]:
    """The statements that create ``publication`` (and its comment)."""
    name = sql.Identifier(publication)
    create = sql.SQL(
        "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)"
    ).format(name, sql.SQL(", ").join(t.ident for t in tables))
    if comment is None:
        return [create]
    return [create, sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(name, sql.Literal(comment))]


_PARTITIONED = (
    "SELECT EXISTS (SELECT 1 FROM unnest(%s::text[], %s::text[]) AS t(schema, name)"
    " JOIN pg_catalog.pg_namespace AS n ON n.nspname = t.schema"
    " JOIN pg_catalog.pg_class AS c ON c.relnamespace = n.oid AND c.relname = t.name"
    " WHERE c.relkind = 'p')"
)


def _rooted(conn: Connection, found: Publication, tables: Sequence[TableName]) -> bool:
    """Whether ``found`` publishes the group's partitioned tables through their root: it has the
    option on, or the group has none (a publication its tables' owner made without the option
    serves a group of plain tables as it is)."""
    if found.via_root:
        return True
    row = conn.execute(_PARTITIONED, ([t.schema for t in tables], [t.name for t in tables]))
    return not bool(row.fetchone()[0])  # type: ignore[index]


def _changes(
    found: Publication, added: Sequence[TableName], removed: Sequence[TableName], *, rooted: bool
) -> list[sql.Composed]:
    """The statements that turn ``found`` into the group's publication."""
    name = sql.Identifier(found.name)
    statements = []
    if not rooted:
        statements.append(
            sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(name)
        )
    for verb, tables in (("ADD", added), ("DROP", removed)):
        if tables:
            statements.append(
                sql.SQL("ALTER PUBLICATION {} " + verb + " TABLE {}").format(
                    name, sql.SQL(", ").join(t.ident for t in tables)
                )
            )
    return statements


def drop_publication(conn: Connection, publication: str) -> bool:
    """Drops ``publication`` if it exists; whether it did.

    Raises:
        EngineError: ``publication_not_permitted`` when another role owns it.
    """
    existed = read_publication(conn, publication) is not None
    statement = sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication))
    _run(conn, publication, statement)
    return existed


def _run(conn: Connection, publication: str, statement: sql.Composed) -> None:
    """Runs ``statement``; a server error is raised as :func:`publication_error`."""
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        raise publication_error(publication, statement.as_string(conn), exc) from exc


def publication_error(publication: str, statement: str, exc: psycopg.Error) -> Exception:
    """The coded error of the server's refusal of ``statement`` on ``publication`` (``exc``
    itself for a failure no code names: the run's guard gives it its database code).

    - ``42501`` (must be owner of a table or of the publication): ``publication_not_permitted``,
      naming the statement that a role owning both may run;
    - ``42P01`` (no such table): ``replication_table_dropped``;
    - ``42704`` (no such publication, dropped meanwhile): ``replication_publication_missing``.
    """
    reason = exc.diag.message_primary or str(exc).strip()
    state = exc.sqlstate
    if state == "42501":
        return engine_error(
            "publication_not_permitted",
            f"The source refused {statement}: {reason}.",
            [f"Have a superuser, or a role that owns both publication {publication!r} and the "
             f"tables it names, run: {statement}; or make the group's role own the tables "
             "(ALTER TABLE ... OWNER TO ...). Then run again: a run that finds the publication "
             "as it needs it changes nothing in it."],
        )  # fmt: skip
    if state == "42P01":
        return engine_error(
            "replication_table_dropped", f"The source refused {statement}: {reason}."
        )
    if state == "42704" and "publication" in reason:
        return engine_error(
            "replication_publication_missing", f"The source refused {statement}: {reason}."
        )
    return exc
