"""The replication slot and the publication: an operational object of the source server.

A group's slot (logical, ``pgoutput``) retains the source's WAL from its position on; its
publication names the tables it decodes. This module reads the slot's state
(:func:`slot_status`: its positions, ``wal_status``, ``safe_wal_size`` and lag), moves it forward
(:func:`advance_slot`, never backwards), creates it with the snapshot the initial copy imports
(:func:`create_slot`; a temporary one for a table that joins a streaming group) and drops it with
the group's publication (:func:`drop_replication`; the publication itself is
:mod:`.publication`'s). Every name is composed with :mod:`psycopg.sql`; none comes into SQL text
unquoted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import (
    Connection,
    ConnectionOptions,
    SessionError,
    connect,
)

from .changes import Lsn, lsn_text, parse_lsn
from .publication import drop_publication

PLUGIN = "pgoutput"
"""The output plugin of every dpone slot (built into PostgreSQL since version 10)."""


@dataclass(frozen=True, slots=True)
class SlotStatus:
    """A replication slot's state, read in one statement with the server's current LSN.

    Attributes:
        slot: Its name.
        plugin: Its output plugin (``pgoutput`` for dpone's; None for a physical slot).
        active: Whether a session is using it now.
        active_pid: That session's pid, or None.
        wal_status: ``reserved``, ``extended``, ``unreserved`` (WAL it needs is about to be
            removed) or ``lost`` (removed: the slot can no longer be read); None when unknown.
        safe_wal_size: Bytes of WAL that can still be written before the slot is in danger of
            ``lost`` (``max_slot_wal_keep_size``); None when unlimited.
        confirmed_flush_lsn: The position the consumer confirmed (a peek starts after it).
        restart_lsn: The oldest WAL position the slot retains (0 when it retains none).
        current_lsn: The server's ``pg_current_wal_lsn()`` when this was read.
        lag_bytes: ``current_lsn - confirmed_flush_lsn`` (WAL not consumed yet, in bytes).
        retained_bytes: ``current_lsn - restart_lsn``: the WAL the slot keeps on the server's
            disk (0 when it retains none).
        database: The database the slot decodes (None for a physical slot).
    """

    slot: str
    plugin: str | None
    active: bool
    wal_status: str | None
    safe_wal_size: int | None
    confirmed_flush_lsn: Lsn
    restart_lsn: Lsn
    current_lsn: Lsn
    lag_bytes: int
    active_pid: int | None = None
    retained_bytes: int = 0
    database: str | None = None


_STATUS = sql.SQL(
    "SELECT slot_name::text, plugin::text, active, active_pid, wal_status, safe_wal_size,"
    " (coalesce(confirmed_flush_lsn, '0/0') - '0/0'::pg_lsn)::int8,"
    " (coalesce(restart_lsn, '0/0') - '0/0'::pg_lsn)::int8,"
    " (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8, database::text"
    " FROM pg_catalog.pg_replication_slots WHERE slot_name = %s"
)


def slot_status(conn: Connection, slot: str) -> SlotStatus | None:
    """The state of ``slot`` on ``conn``'s server, or None when there is no such slot."""
    row = conn.execute(_STATUS, (slot,)).fetchone()
    if row is None:
        return None
    name, plugin, active, pid, wal_status, safe, confirmed, restart, current, database = row
    return SlotStatus(
        slot=name,
        plugin=plugin,
        active=bool(active),
        wal_status=wal_status,
        safe_wal_size=None if safe is None else int(safe),
        confirmed_flush_lsn=int(confirmed),
        restart_lsn=int(restart),
        current_lsn=int(current),
        lag_bytes=max(0, int(current) - int(confirmed)) if confirmed else 0,
        active_pid=pid,
        retained_bytes=max(0, int(current) - int(restart)) if restart else 0,
        database=database,
    )


def wait_for_slot(conn: Connection, slot: str, timeout: float) -> SlotStatus | None:
    """The state of ``slot`` once no session holds it, read again every 0.1 s for at most
    ``timeout`` seconds.

    A run of the group holds the slot while it reads it; a run killed inside its read leaves its
    server process decoding until it next writes to its dead client (seconds, in a long
    decode). The next run waits for either rather than failing at once.

    Returns:
        The last state read: inactive, or still held when the wait ran out (the caller's read
        then fails with ``replication_slot_active``, naming the holder); None when there is no
        such slot.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = slot_status(conn, slot)
        if status is None or not status.active or time.monotonic() >= deadline:
            return status
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


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
    dsn: str, slot: str, options: ConnectionOptions | None = None, *, temporary: bool = False
) -> Iterator[CreatedSlot]:
    """Creates the logical slot ``slot`` (``pgoutput``) with an exported snapshot.

    The replication session that created it stays open and idle while the block runs, so that
    other sessions can import the snapshot
    (:class:`~dpone_dagster.postgres.snapshot.SnapshotSession`); it is closed when the block
    exits, and the slot stays (inactive), unless it is ``temporary``: then the server drops it
    with the session (also when the process holding it is killed).

    Args:
        dsn: The source database's DSN (its role needs ``REPLICATION``).
        slot: The new slot's name.
        options: The session's options.
        temporary: A ``TEMPORARY`` slot, for its snapshot and consistent point alone.

    Yields:
        The slot's consistent point and snapshot token.

    Raises:
        EngineError: ``replication_slots_exhausted`` when ``max_replication_slots`` are all in
            use, ``replication_privilege_missing`` when the role may not replicate,
            ``replication_slot_foreign`` when a slot of that name already exists,
            ``replication_senders_exhausted`` when ``max_wal_senders`` are all in use.
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
    try:
        session = connect(dsn, options, side="source", autocommit=True)
    except SessionError as exc:
        if "max_wal_senders" not in exc.message:
            raise
        raise engine_error(
            "replication_senders_exhausted", f"Slot {slot!r} could not be created: {exc.message}"
        ) from exc
    with session as conn:
        # The snapshot option's spelling since PostgreSQL 15; before, a bare keyword.
        mode = "(SNAPSHOT 'export')" if conn.info.server_version >= 150000 else "EXPORT_SNAPSHOT"
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        statement = sql.SQL("CREATE_REPLICATION_SLOT {} " + kind + " {} " + mode).format(
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
    return Dropped(dropped_slot, drop_publication(conn, publication))
