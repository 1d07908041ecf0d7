"""Whether a source can replicate a group, and the group's first slot and publication.

:func:`check_replication_setup` reads, before anything is created, everything a group needs of
its source and refuses with a stable code naming the setting or privilege and what to run:
``wal_level`` (``replication_wal_level``), the ``REPLICATION`` attribute
(``replication_privilege_missing``), a free slot (``replication_slots_exhausted``), the tables'
ownership for the publication (``publication_not_permitted``), a slot or publication of the
group's name that is not the group's own (``replication_slot_foreign``), a table whose updates
cannot be identified (``replica_identity_missing``), a partitioned table named with one of its
own partitions (``replication_partition_overlap``) and, for a streaming group, a table of it that
no longer exists (``replication_table_dropped``).

A group's own publication carries a comment (the ``owner_comment`` the engine derives for the
group); a slot of the group's name is the group's own only if it decodes this database with
``pgoutput`` and its publication carries that comment. :func:`create_replication` creates the
publication (with the comment) and then the slot with its exported snapshot; when the slot cannot
be created, or the block that uses its snapshot fails, what it created is removed again: nothing
half-created stays behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.core.waits import wait_while
from dpone_dagster.postgres.catalog import table_catalog
from dpone_dagster.postgres.connection import Connection, ConnectionOptions, connect
from dpone_dagster.postgres.identifiers import TableName, quote_identifier

from .partitions import refuse_overlap
from .publication import Publication, ensure_publication, read_publication
from .slot import PLUGIN, CreatedSlot, SlotStatus, create_slot, slot_status

REPLICATION_ROLES = ("rds_replication",)
"""Roles of managed services that stand for the ``REPLICATION`` attribute (Amazon RDS)."""


@dataclass(frozen=True, slots=True)
class SetupState:
    """What a group has on its source already (after :func:`check_replication_setup`).

    Attributes:
        slot_exists: The group's own slot exists.
        publication_exists: The group's own publication exists.
        publication_tables: The tables the publication has now (empty when it does not exist).
    """

    slot_exists: bool
    publication_exists: bool
    publication_tables: tuple[TableName, ...]


_ROLE = sql.SQL(
    "SELECT current_user::text, r.rolsuper, r.rolreplication OR EXISTS ("
    "  SELECT 1 FROM pg_catalog.pg_roles m"
    "  WHERE m.rolname = ANY(%s) AND pg_catalog.pg_has_role(current_user, m.oid, 'MEMBER')),"
    " current_setting('wal_level'), current_setting('max_replication_slots')::int,"
    " (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,"
    " pg_catalog.has_database_privilege(current_database(), 'CREATE')"
    " FROM pg_catalog.pg_roles r WHERE r.rolname = current_user"
)

_TABLES = sql.SQL(
    "SELECT t.schema, t.name, c.oid IS NOT NULL, c.relreplident::text,"
    # A primary key the slot names the rows by: not under REPLICA IDENTITY USING INDEX of
    # another index (a delete would come with that index's columns, not the key's).
    " EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary"
    "  AND (c.relreplident <> 'i' OR i.indisreplident)),"
    " pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE'),"
    " pg_catalog.pg_get_userbyid(c.relowner)::text"
    " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(schema, name, n)"
    " LEFT JOIN pg_catalog.pg_namespace s ON s.nspname = t.schema"
    " LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = s.oid AND c.relname = t.name"
    "  AND c.relkind IN ('r', 'p')"
    " ORDER BY t.n"
)


def check_replication_setup(
    conn: Connection,
    *,
    slot: str,
    publication: str,
    tables: Sequence[TableName],
    owner_comment: str,
    replicated: Collection[TableName] = (),
    ledgers_slot: bool = False,
) -> SetupState:
    """Refuses, with a code and before anything is created, a source that cannot replicate the
    group; else says what of it exists already.

    Args:
        conn: A session of the source database, as the role the group replicates with.
        slot: The group's slot.
        publication: The group's publication.
        tables: The group's tables.
        owner_comment: The comment the group's own publication carries.
        replicated: The tables the group has replicated so far (a streaming group's).
        ledgers_slot: The group's ledger holds the slot (an unfinished copy, a resync): a slot
            of the group's name is the group's even when its publication is gone.

    Returns:
        Whether the group's slot and publication exist, and the publication's tables.

    Raises:
        EngineError: ``replication_wal_level``, ``replication_privilege_missing``,
            ``replica_identity_missing``, ``replication_slot_foreign``,
            ``replication_slots_exhausted``, ``publication_not_permitted``,
            ``replication_partition_overlap`` or ``replication_table_dropped`` (one of
            ``replicated`` no longer exists) (see the module).
        CatalogError: ``table_not_found`` for another table that does not exist.
    """
    role, superuser, max_slots, slots, may_create = _check_role(conn)
    described = _tables(conn, tables, replicated)
    refuse_overlap(conn, tables)
    unidentified = [
        str(t) for t, (_, identity, has_key, _, _) in described.items()
        if identity == "n" or (identity in ("d", "i") and not has_key)
    ]  # fmt: skip
    if unidentified:
        raise engine_error(
            "replica_identity_missing",
            "No primary key the slot names the rows by (none, or REPLICA IDENTITY USING INDEX "
            f"of another index) and no REPLICA IDENTITY FULL: {', '.join(unidentified)}.",
        )
    status = slot_status(conn, slot)
    pub = read_publication(conn, publication)
    if pub is not None and pub.comment != owner_comment:
        raise engine_error(
            "replication_slot_foreign",
            f"Publication {publication!r} exists and was not made by dpone for this group (its "
            f"comment is {pub.comment!r}, not {owner_comment!r}); it was left untouched.",
            [f"Name another publication for the group (publication=), or drop {publication!r} "
             "if nothing uses it (DROP PUBLICATION), then run again."],
        )  # fmt: skip
    if status is not None:
        _check_own_slot(conn, status, publication if pub is not None or ledgers_slot else None)
    elif slots >= max_slots:
        raise engine_error(
            "replication_slots_exhausted",
            f"The source server has {slots} replication slots of max_replication_slots = "
            f"{max_slots}.",
        )
    current = () if pub is None else pub.tables
    if set(current) == set(tables):
        return SetupState(status is not None, pub is not None, current)
    _check_publication_rights(conn, publication, pub, (role, superuser, may_create), described)
    return SetupState(status is not None, pub is not None, current)


def _check_publication_rights(
    conn: Connection,
    publication: str,
    pub: Publication | None,
    rights: tuple[str, bool, bool],
    described: dict[TableName, tuple[bool, str, bool, bool, str]],
) -> None:
    """Refuses a role that may not make the publication name the group's tables: create it,
    alter it, or add a table it does not own."""
    role, superuser, may_create = rights
    if pub is None and not (superuser or may_create):
        raise engine_error(
            "publication_not_permitted",
            f"Role {role!r} may not create publication {publication!r} in database "
            f"{conn.info.dbname!r}: GRANT CREATE ON DATABASE to it.",
        )
    if pub is not None and not pub.owned:
        raise engine_error(
            "publication_not_permitted", f"Role {role!r} does not own publication {publication!r}."
        )
    current = () if pub is None else pub.tables
    missing = [t for t in described if t not in current]
    foreign = [
        f"{t} (owned by {owner})"
        for t, (_, _, _, owns, owner) in described.items()
        if t not in current and not (owns or superuser)
    ]
    if not foreign:
        return
    names = ", ".join(str(t) for t in (missing if pub is not None else described))
    statement = (
        f"CREATE PUBLICATION {publication} FOR TABLE {names} WITH (publish_via_partition_root "
        "= true)"
        if pub is None
        else f"ALTER PUBLICATION {publication} ADD TABLE {names}"
    )
    raise engine_error(
        "publication_not_permitted",
        f"Role {role!r} does not own {', '.join(foreign)}: {statement} must be run by "
        "the tables' owner"
        + ("" if pub is None else " (and the publication's, or a superuser)")
        + ".",
    )


def _check_role(conn: Connection) -> tuple[str, bool, int, int, bool]:
    """The role's name and whether it is a superuser, ``max_replication_slots``, the slots in
    use and whether the role may create in the database; refuses a server without ``wal_level
    = logical`` and a role without ``REPLICATION``."""
    row = conn.execute(_ROLE, (list(REPLICATION_ROLES),)).fetchone()
    assert row is not None
    role, superuser, replication, wal_level, max_slots, slots, may_create = row
    if wal_level != "logical":
        raise engine_error(
            "replication_wal_level",
            f"The source server runs with wal_level = {wal_level}; logical replication needs "
            "wal_level = logical.",
        )
    if not (superuser or replication):
        raise engine_error(
            "replication_privilege_missing",
            f"Role {role!r} has no REPLICATION attribute (nor membership in "
            f"{', '.join(REPLICATION_ROLES)}): run ALTER ROLE "
            f"{quote_identifier(role)} WITH REPLICATION as a superuser.",
        )
    return str(role), bool(superuser), int(max_slots), int(slots), bool(may_create)


def _check_own_slot(conn: Connection, status: SlotStatus, publication: str | None) -> None:
    """Refuses a slot of the group's name that is not the group's own: another plugin, another
    database, or no publication of the group's (``publication`` None)."""
    reasons = []
    if status.plugin != PLUGIN:
        reasons.append(f"its plugin is {status.plugin!r}, not {PLUGIN!r}")
    if status.database != conn.info.dbname:
        reasons.append(f"it decodes database {status.database!r}, not {conn.info.dbname!r}")
    if not reasons and publication is None:
        reasons.append("the group's publication does not exist")
    if reasons:
        raise engine_error(
            "replication_slot_foreign",
            f"Replication slot {status.slot!r} exists and is not this group's: "
            f"{'; '.join(reasons)}. It was left untouched.",
        )


def _tables(
    conn: Connection, tables: Sequence[TableName], replicated: Collection[TableName]
) -> dict[TableName, tuple[bool, str, bool, bool, str]]:
    """Each table's (exists, replica identity, has a primary key the slot names its rows by,
    the role owns it, owner)."""
    rows = conn.execute(_TABLES, ([t.schema for t in tables], [t.name for t in tables])).fetchall()
    described = {}
    for table, (_, _, exists, identity, has_key, owns, owner) in zip(tables, rows, strict=True):
        if not exists and table in replicated:
            raise engine_error(
                "replication_table_dropped",
                f"Table {table} of the group does not exist at the source (database "
                f"{conn.info.dbname!r}).",
            )
        if not exists:
            table_catalog(conn, table)  # raises the catalog's own table_not_found
        described[table] = (bool(exists), str(identity), bool(has_key), bool(owns), str(owner))
    return described


@contextlib.contextmanager
def create_replication(
    dsn: str,
    *,
    slot: str,
    publication: str,
    tables: Sequence[TableName],
    owner_comment: str,
    options: ConnectionOptions | None = None,
    failover: bool = False,
) -> Iterator[CreatedSlot]:
    """Creates the group's publication and slot, after :func:`check_replication_setup`.

    The publication is made to publish exactly ``tables`` (created with ``owner_comment``, or
    its tables corrected), then the slot is created with an exported snapshot, which the block
    may import while it runs (:func:`~.slot.create_slot`). If the slot cannot be created, or the
    block raises, the slot is dropped again and so is the publication if it was created here.

    Args:
        dsn: The source database's DSN.
        slot: The new slot (one of that name must not exist).
        publication: The group's publication.
        tables: The group's tables.
        owner_comment: The mark of the group's own publication.
        options: The sessions' options.
        failover: A failover slot (PostgreSQL 17+).

    Yields:
        The new slot's consistent point and snapshot.

    Raises:
        EngineError: the codes of :func:`check_replication_setup`, and of
            :func:`~.slot.create_slot` when the server refuses the slot.
    """
    with connect(dsn, options, side="source", autocommit=True) as conn:
        state = check_replication_setup(
            conn, slot=slot, publication=publication, tables=tables, owner_comment=owner_comment
        )
        if state.slot_exists:
            raise engine_error(
                "replication_slot_foreign",
                f"Replication slot {slot!r} exists already: the group's first run creates it.",
            )
        change = ensure_publication(conn, publication, tables, comment=owner_comment)
        try:
            with create_slot(dsn, slot, options, failover=failover) as created:
                yield created
        except BaseException as exc:
            _undo(conn, slot, publication if change.created else None, exc)
            raise


def _undo(conn: Connection, slot: str, publication: str | None, failure: BaseException) -> None:
    """Drops what :func:`create_replication` created (the slot, the publication it created);
    what could not be dropped is named in a note on ``failure``, the error reported."""

    def active() -> list[tuple[object, ...]]:
        return conn.execute(
            "SELECT active_pid FROM pg_catalog.pg_replication_slots"
            " WHERE slot_name = %s AND active",
            (slot,),
        ).fetchall()

    try:
        # The replication session is closed; its server process ends a moment later.
        wait_while(
            active,
            timeout=30,
            interval=0.02,
            timed_out=lambda pids: engine_error(
                "replication_slot_active", f"Slot {slot!r} is still held by {pids}."
            ),
        )
        if slot_status(conn, slot) is not None:
            conn.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", (slot,))
        if publication is not None:
            conn.execute(
                sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication))
            )
    except (psycopg.Error, EngineError) as exc:
        failure.add_note(
            f"dpone could not remove slot {slot!r} / publication {publication!r} again: {exc}. "
            "Drop them with drop_replication."
        )
