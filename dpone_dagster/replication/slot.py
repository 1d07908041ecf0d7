"""The replication slot and the publication: an operational object of the source server.

A group's slot (logical, ``pgoutput``) retains the source's WAL from its position on; its
publication names the tables it decodes. This module moves the slot forward
(:func:`advance_slot`, never backwards), creates it with the snapshot the initial copy imports
(:func:`create_slot`; a temporary one for a table that joins a streaming group) and drops it with
the group's publication (:func:`drop_replication`; the publication itself is
:mod:`.publication`'s). Every name is composed with :mod:`psycopg.sql`; none comes into SQL text
unquoted. The slot's state, what holds its WAL back and the wait for a held slot are
:mod:`.slot_health`'s (importable from here too).
"""

from __future__ import annotations

import contextlib
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
from .slot_health import SlotStatus, failover_supported, slot_status, wait_for_slot

__all__ = [  # the slot's state and its wait live in .slot_health; importable from here too
    "PLUGIN",
    "CreatedSlot",
    "Dropped",
    "SlotStatus",
    "advance_slot",
    "create_slot",
    "current_lsn",
    "drop_replication",
    "failover_supported",
    "mark_restart_point",
    "replication_options",
    "set_failover",
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
RESTART_LAG_BYTES = 1 << 20
"""WAL between a slot's restart point and its confirmed position past which a run marks a new
restart point (:func:`mark_restart_point`): what every later read would decode again."""

STANDBY_SNAPSHOT_VERSION = 160000
"""The first server version with ``pg_log_standby_snapshot()`` (``server_version_num``)."""

_MARK = (
    "SELECT pg_catalog.pg_log_standby_snapshot() WHERE NOT pg_catalog.pg_is_in_recovery()"
    " AND pg_catalog.has_function_privilege('pg_catalog.pg_log_standby_snapshot()', 'EXECUTE')"
)


def mark_restart_point(conn: Connection, status: SlotStatus) -> bool:
    """Writes a running-transactions record (``pg_log_standby_snapshot()``) after a run that
    left ``status``'s slot with its restart point more than :data:`RESTART_LAG_BYTES` behind
    its confirmed position, and no transaction holding it there.

    A slot's restart point moves only to such a record, once a read of the slot has decoded
    it and its position is confirmed past it. The server's background writer writes one every
    15 s of activity; until then every run decodes again everything since the restart point (a
    large run's changes, run after run) and the slot retains that WAL. The record written here
    lets the next run move the restart point past it. Nothing is written on a server before
    PostgreSQL 16, on a standby, or for a role that may not execute the function (a superuser's
    by default: ``GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO ...`` allows it).

    Args:
        conn: An autocommit session of the slot's server.
        status: The slot's state after the run's advance.

    Returns:
        Whether a record was written.
    """
    lag = status.confirmed_flush_lsn - status.restart_lsn
    if not status.restart_lsn or lag <= RESTART_LAG_BYTES or status.held_by:
        return False
    if conn.info.server_version < STANDBY_SNAPSHOT_VERSION:
        return False
    return conn.execute(_MARK).fetchone() is not None


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
    dsn: str,
    slot: str,
    options: ConnectionOptions | None = None,
    *,
    temporary: bool = False,
    failover: bool = False,
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
        failover: A failover slot (PostgreSQL 17+, :func:`failover_supported`): the server
            synchronizes it to the standbys set up for it.

    Yields:
        The slot's consistent point and snapshot token.

    Raises:
        EngineError: ``replication_slots_exhausted`` when ``max_replication_slots`` are all in
            use, ``replication_privilege_missing`` when the role may not replicate,
            ``replication_slot_foreign`` when a slot of that name already exists,
            ``replication_senders_exhausted`` when ``max_wal_senders`` are all in use.
        SessionError: the replication session could not be opened.
    """
    try:
        session = connect(dsn, replication_options(options), side="source", autocommit=True)
    except SessionError as exc:
        if "max_wal_senders" not in exc.message:
            raise
        raise engine_error(
            "replication_senders_exhausted", f"Slot {slot!r} could not be created: {exc.message}"
        ) from exc
    with session as conn:
        # The snapshot option's spelling since PostgreSQL 15; before, a bare keyword.
        mode = "(SNAPSHOT 'export')" if conn.info.server_version >= 150000 else "EXPORT_SNAPSHOT"
        if failover:
            mode = "(SNAPSHOT 'export', FAILOVER true)"
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


def replication_options(options: ConnectionOptions | None) -> ConnectionOptions:
    """``options`` for a replication connection of the database (``replication=database``):
    the one that creates a slot, alters it, or reads the timeline history."""
    base = options or ConnectionOptions()
    return ConnectionOptions(
        application_name=base.application_name,
        connect_timeout=base.connect_timeout,
        statement_timeout_ms=base.statement_timeout_ms,
        lock_wait=base.lock_wait,
        extra={**base.extra, "replication": "database"},
    )


def set_failover(dsn: str, slot: str, options: ConnectionOptions | None = None) -> None:
    """Makes ``slot`` a failover slot (``ALTER_REPLICATION_SLOT``, PostgreSQL 17+): a slot
    created before the server supported them keeps going, now synchronized to the standbys.

    Raises:
        EngineError: ``replication_slot_active`` when another session holds the slot.
    """
    statement = sql.SQL("ALTER_REPLICATION_SLOT {} (FAILOVER true)").format(sql.Identifier(slot))
    with connect(dsn, replication_options(options), side="source", autocommit=True) as conn:
        try:
            conn.execute(statement)
        except psycopg.errors.ObjectInUse as exc:
            raise engine_error(
                "replication_slot_active", f"Replication slot {slot!r} is in use ({exc})."
            ) from exc


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
