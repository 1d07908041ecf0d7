"""The replication slot and the publication: an operational object of the source server.

A group's slot (logical, ``pgoutput``) retains the source's WAL from its position on; its
publication names the tables it decodes. This module moves the slot forward
(:func:`advance_slot`, never backwards), creates it with the snapshot the initial copy imports
(:func:`create_slot`), makes the publication match the group's tables exactly
(:func:`ensure_publication`) and drops both (:func:`drop_replication`). Every name is composed
with :mod:`psycopg.sql`; none comes into SQL text unquoted. The slot's state, what holds its
WAL back and the wait for a held slot are :mod:`.slot_health`'s (importable from here too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection, ConnectionOptions, connect
from dpone_dagster.postgres.identifiers import TableName

from .changes import Lsn, lsn_text, parse_lsn
from .slot_health import SlotStatus, slot_status, wait_for_slot

__all__ = [  # the slot's state and its wait live in .slot_health; importable from here too
    "PLUGIN",
    "CreatedSlot",
    "Dropped",
    "PublicationChange",
    "SlotStatus",
    "advance_slot",
    "create_slot",
    "current_lsn",
    "drop_replication",
    "ensure_publication",
    "publication_tables",
    "slot_creation_error",
    "slot_status",
    "wait_for_slot",
]

PLUGIN = "pgoutput"
"""The output plugin of every dpone slot (built into PostgreSQL since version 10)."""


def current_lsn(conn: Connection) -> Lsn:
    """The source's current WAL write position (``pg_current_wal_lsn()``)."""
    row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetchone()
    assert row is not None
    return int(row[0])


def advance_slot(conn: Connection, slot: str, lsn: Lsn) -> Lsn:
    """Moves ``slot``'s confirmed position forward to ``lsn``; never backwards.

    Advance to a transaction's :attr:`~.changes.Commit.end_lsn` to never read it again: a peek
    skips the transactions whose commit record starts before the confirmed position, so one
    confirmed at its own ``commit_lsn`` is read once more.

    Args:
        conn: A session of the slot's database (autocommit, or idle).
        slot: The logical slot.
        lsn: The new position; one at or before the slot's confirmed position is a no-op.

    Returns:
        The slot's confirmed position afterwards.

    Raises:
        EngineError: ``replication_slot_missing`` when there is no such slot,
            ``replication_slot_active`` when another session holds it.
    """
    try:
        row = conn.execute(_ADVANCE, {"slot": slot, "lsn": lsn_text(lsn)}).fetchone()
    except psycopg.errors.ObjectInUse as exc:
        raise engine_error(
            "replication_slot_active", f"Replication slot {slot!r} is in use ({exc})."
        ) from exc
    if row is None:
        raise engine_error(
            "replication_slot_missing", f"The source has no replication slot {slot!r}."
        )
    return int(row[0])


# One round trip: the slot's confirmed position, advanced only when ``lsn`` is ahead of it (the
# server refuses a move backwards; a CASE branch's subquery runs only when the branch is taken).
_ADVANCE = """
SELECT CASE WHEN s.confirmed < %(lsn)s::pg_lsn
            THEN (SELECT (a.end_lsn - '0/0'::pg_lsn)::int8
                  FROM pg_catalog.pg_replication_slot_advance(%(slot)s, %(lsn)s::pg_lsn) AS a)
            ELSE (s.confirmed - '0/0'::pg_lsn)::int8 END
FROM (SELECT coalesce(confirmed_flush_lsn, '0/0') AS confirmed
      FROM pg_catalog.pg_replication_slots WHERE slot_name = %(slot)s) AS s
"""


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    """A slot just created, and the snapshot of its start.

    Attributes:
        slot: Its name.
        consistent_point: The LSN from which it decodes: every transaction that committed
            before it is in :attr:`snapshot`, every later one is in the slot's changes.
        snapshot: The exported snapshot's token, for ``SET TRANSACTION SNAPSHOT`` (valid while
            the ``create_slot`` block runs).
    """

    slot: str
    consistent_point: Lsn
    snapshot: str


@contextlib.contextmanager
def create_slot(
    dsn: str, slot: str, options: ConnectionOptions | None = None
) -> Iterator[CreatedSlot]:
    """Creates the logical slot ``slot`` (``pgoutput``) with an exported snapshot.

    The replication session that created it stays open and idle while the block runs, so that
    other sessions can import the snapshot
    (:class:`~dpone_dagster.postgres.snapshot.SnapshotSession`); it is closed when the block
    exits, and the slot stays (inactive). The slot belongs to the DSN's database.

    Args:
        dsn: The source database's DSN (its role needs ``REPLICATION``).
        slot: The new slot's name.
        options: The session's options.

    Yields:
        The slot's consistent point and snapshot token.

    Raises:
        EngineError: ``replication_slots_exhausted`` when ``max_replication_slots`` are all in
            use, ``replication_privilege_missing`` when the role may not replicate,
            ``replication_slot_foreign`` when a slot of that name already exists.
        SessionError: the replication session could not be opened.
    """
    base = options or ConnectionOptions()
    options = ConnectionOptions(
        application_name=base.application_name,
        connect_timeout=base.connect_timeout,
        statement_timeout_ms=base.statement_timeout_ms,
        lock_wait=base.lock_wait,
        extra={**base.extra, "replication": "database"},
    )
    with connect(dsn, options, side="source", autocommit=True) as conn:
        # The snapshot option's spelling since PostgreSQL 15; before, a bare keyword.
        mode = "(SNAPSHOT 'export')" if conn.info.server_version >= 150000 else "EXPORT_SNAPSHOT"
        statement = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} " + mode).format(
            sql.Identifier(slot), sql.Identifier(PLUGIN)
        )
        try:
            row = conn.execute(statement).fetchone()
        except psycopg.Error as exc:
            raise slot_creation_error(slot, exc) from exc
        assert row is not None
        yield CreatedSlot(slot, parse_lsn(str(row[1])), str(row[2]))


def slot_creation_error(slot: str, exc: psycopg.Error) -> Exception:
    """The coded error of a failed slot creation (``exc`` itself when no code names it)."""
    state = exc.sqlstate
    if state == "53400":  # configuration_limit_exceeded: all replication slots are in use
        return engine_error(
            "replication_slots_exhausted",
            f"Slot {slot!r} could not be created: {exc.diag.message_primary or exc}.",
        )
    if state == "42710":  # duplicate_object
        return engine_error(
            "replication_slot_foreign", f"A replication slot named {slot!r} already exists."
        )
    if state == "42501":  # insufficient_privilege
        return engine_error(
            "replication_privilege_missing",
            f"Slot {slot!r} could not be created: {exc.diag.message_primary or exc}.",
        )
    return exc


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


def publication_tables(conn: Connection, publication: str) -> list[TableName] | None:
    """The tables of ``publication`` in ``conn``'s database, or None when it does not exist
    (one round trip)."""
    row = conn.execute(
        "SELECT array(SELECT ARRAY[t.schemaname::text, t.tablename::text]"
        " FROM pg_catalog.pg_publication_tables AS t WHERE t.pubname = p.pubname ORDER BY 1)"
        " FROM pg_catalog.pg_publication AS p WHERE p.pubname = %s",
        (publication,),
    ).fetchone()
    if row is None:
        return None
    return [TableName(schema, name) for schema, name in row[0]]


def ensure_publication(
    conn: Connection,
    publication: str,
    tables: Sequence[TableName],
    *,
    comment: str | None = None,
) -> PublicationChange:
    """Makes ``publication`` publish exactly ``tables``: creates it ``FOR TABLE ...``, or adds and
    removes tables. All of it in one transaction of ``conn``.

    Args:
        conn: A session of the source database (its role owns the tables).
        publication: The publication's name.
        tables: The group's tables.
        comment: Written on a publication created here (``COMMENT ON PUBLICATION``): the mark
            by which :mod:`.setup` knows the group's own slot and publication.

    Returns:
        What was created, added and removed.

    Raises:
        psycopg.errors.InsufficientPrivilege: the role does not own a table (callers check
            first: :func:`~.setup.check_replication_setup`).
    """
    if not tables:
        raise ValueError("a publication needs at least one table")
    name = sql.Identifier(publication)
    existing = publication_tables(conn, publication)
    if existing is not None and sorted(existing) == sorted(set(tables)):
        return PublicationChange(False, (), ())  # as it should be: one read, no transaction
    with conn.transaction():
        existing = publication_tables(conn, publication)
        if existing is None:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    name, sql.SQL(", ").join(t.ident for t in tables)
                )
            )
            if comment is not None:
                conn.execute(
                    sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(name, sql.Literal(comment))
                )
            return PublicationChange(True, tuple(tables), ())
        wanted = set(tables)
        added = tuple(t for t in tables if t not in set(existing))
        removed = tuple(t for t in existing if t not in wanted)
        if added:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    name, sql.SQL(", ").join(t.ident for t in added)
                )
            )
        if removed:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                    name, sql.SQL(", ").join(t.ident for t in removed)
                )
            )
        return PublicationChange(False, added, removed)


@dataclass(frozen=True, slots=True)
class Dropped:
    """What :func:`drop_replication` dropped (False: there was nothing of that name).

    Attributes:
        slot: The slot was dropped.
        publication: The publication was dropped.
    """

    slot: bool
    publication: bool


def drop_replication(conn: Connection, *, slot: str, publication: str) -> Dropped:
    """Drops the group's slot and publication; what is already gone is skipped (idempotent).

    A dropped slot no longer retains WAL: this is what ends a group for good (a later run starts
    over with an initial copy).

    Args:
        conn: An autocommit session of the source database.
        slot: The slot.
        publication: The publication.

    Raises:
        EngineError: ``replication_slot_active`` (nothing dropped) when another session is using
            the slot, naming its pid; ``replication_slot_foreign`` (nothing dropped) when the slot
            decodes another database or with another plugin.
    """
    status = slot_status(conn, slot)
    if status is not None:
        database = conn.info.dbname
        if status.database != database or status.plugin != PLUGIN:
            raise engine_error(
                "replication_slot_foreign",
                f"Replication slot {slot!r} decodes database {status.database!r} with plugin "
                f"{status.plugin!r}, not {database!r} with {PLUGIN!r}: it is not this group's; "
                "nothing was dropped.",
            )
        if status.active and status.active_pid != conn.info.backend_pid:
            raise engine_error(
                "replication_slot_active",
                f"Replication slot {slot!r} is in use by the session of pid {status.active_pid}; "
                "nothing was dropped.",
            )
    dropped_slot = False
    if status is not None:
        try:
            conn.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", (slot,))
            dropped_slot = True
        except psycopg.errors.UndefinedObject:
            pass  # dropped meanwhile
        except psycopg.errors.ObjectInUse as exc:
            raise engine_error(
                "replication_slot_active",
                f"Replication slot {slot!r} is in use ({exc}); nothing was dropped.",
            ) from exc
    existed = publication_tables(conn, publication) is not None
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
    return Dropped(dropped_slot, existed)
