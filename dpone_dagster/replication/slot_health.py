"""A replication slot's health: its state, what holds its WAL back, and the wait for a slot
another session holds.

A logical slot keeps the source's WAL from its ``restart_lsn`` on. A run moves it forward (its
confirmed position to the run's LSN, even when the group's tables were quiet), but the server
moves the restart point only past WAL no open transaction still needs: every transaction open
on the source *server* (any database: logical decoding reads the whole server's WAL) that wrote
before the slot's last recorded point keeps it there, however often the group runs.
:func:`slot_status` reads the slot's positions, ``wal_status`` and lag in one statement, and
names those transactions (:class:`SlotHolder`) in a second one, read only when the oldest
transaction running may hold the slot (most runs find none and skip the scan of the sessions).

How a holder is found, as the server decides it: each time the slot's position is recorded at
one of the server's running-transactions records, its ``catalog_xmin`` becomes the oldest
transaction id running then, and its ``restart_lsn`` the start of the oldest of those
transactions that had written. So a backend whose transaction id (``backend_xid``) is at or
before the slot's ``catalog_xmin`` was open at that point and still is: it holds the slot's
``catalog_xmin`` and, from its first write on, its restart point. A session that only reads
(``backend_xmin`` without a ``backend_xid``, a long report under ``REPEATABLE READ``) holds
neither (``tests/replication/test_slot_wal.py`` proves both on a real server).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from dpone_dagster.lifecycle import redact
from dpone_dagster.postgres.connection import Connection

from .changes import Lsn

QUERY_START_CHARS = 120
"""How much of a holder's query its report keeps (string literals masked)."""


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """An open transaction on the source that holds a slot's WAL back (see the module).

    Attributes:
        pid: The backend's process id (``pg_terminate_backend(pid)`` ends it).
        database: The database it is connected to (any database of the server holds the slot).
        user: Its role.
        application_name: Its ``application_name`` (None when empty).
        state: ``active``, ``idle in transaction``, ...; None when the role reading it may not
            see other roles' activity (``pg_read_all_stats``).
        xact_start: When its transaction began (None, as ``state``).
        seconds: How long its transaction has been open, by the server's clock (None, as
            ``state``).
        query: The start of its last statement, whitespace collapsed and string literals
            masked (``'…'``); None, as ``state``.
    """

    pid: int
    database: str | None
    user: str | None
    application_name: str | None
    state: str | None
    xact_start: datetime | None
    seconds: float | None
    query: str | None

    def describe(self) -> str:
        """The holder in one phrase, for a message or a log line."""
        parts = [f"pid {self.pid}", f"database {self.database}"]
        if self.user:
            parts.append(f"user {self.user}")
        if self.application_name:
            parts.append(f"application {self.application_name!r}")
        if self.state:
            parts.append(self.state)
        if self.seconds is not None:
            parts.append(f"its transaction open {self.seconds:.0f} s")
        if self.query:
            parts.append(f"last statement {self.query!r}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """The holder as JSON values (the time as ISO 8601)."""
        return {
            "pid": self.pid,
            "database": self.database,
            "user": self.user,
            "application_name": self.application_name,
            "state": self.state,
            "xact_start": None if self.xact_start is None else self.xact_start.isoformat(),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "query": self.query,
        }


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
        held_by: The open transactions that hold the slot back, oldest first (see the
            module); empty when none does.
        failover: It is a failover slot, synchronized to the standbys set up for it
            (:mod:`.failover`); None on a server before PostgreSQL 17.
        synchronized_standbys: The physical slots the server's ``synchronized_standby_slots``
            names (a failover slot's reader receives only what their standbys confirmed);
            empty when none.
        missing_standbys: Those of them the server has no valid physical slot of: a failover
            slot's reader would wait for them forever (a promoted standby that kept its old
            primary's setting).
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
    held_by: tuple[SlotHolder, ...] = ()
    failover: bool | None = None
    synchronized_standbys: tuple[str, ...] = ()
    missing_standbys: tuple[str, ...] = ()


_STATUS = sql.SQL(
    "SELECT s.slot_name::text, s.plugin::text, s.active, s.active_pid, s.wal_status,"
    " s.safe_wal_size, (coalesce(s.confirmed_flush_lsn, '0/0') - '0/0'::pg_lsn)::int8,"
    " (coalesce(s.restart_lsn, '0/0') - '0/0'::pg_lsn)::int8,"
    " (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8, s.database::text, {held}, {failover}"
    " FROM pg_catalog.pg_replication_slots AS s WHERE s.slot_name = %s"
)
"""A slot's state; ``held`` is :data:`_MAY_BE_HELD` (whether a transaction open now may hold
it), or false where no caller reads the holders (a wait on the slot, a read's check that no
session holds it); ``failover`` is :data:`_FAILOVER` on PostgreSQL 17+, NULLs before."""

_MAY_BE_HELD = sql.SQL(
    "s.catalog_xmin IS NOT NULL AND age(pg_catalog.xid(pg_catalog.pg_snapshot_xmin("
    "pg_catalog.pg_current_snapshot()))) >= age(s.catalog_xmin)"
)
"""Whether the oldest transaction id running now is at or before the slot's ``catalog_xmin``:
no backend's ``backend_xid`` is older than the oldest running one, so when this is false no
transaction holds the slot, and :data:`_HOLDERS` (a scan of the server's sessions, the dearer
half of the status) is not read."""

# The failover column, the names synchronized_standby_slots lists, and those of them without a
# valid physical slot on this server (PostgreSQL 17+).
_NAMES = sql.SQL(
    "array_remove(string_to_array(replace(current_setting('synchronized_standby_slots'),"
    " ' ', ''), ','), '')"
)
_FAILOVER = sql.SQL(
    "s.failover, {names}, (SELECT coalesce(array_agg(m ORDER BY m), '{{}}')"
    " FROM unnest({names}) AS m WHERE NOT EXISTS (SELECT 1"
    "  FROM pg_catalog.pg_replication_slots AS p WHERE p.slot_name = m"
    "  AND p.slot_type = 'physical' AND p.invalidation_reason IS NULL))"
).format(names=_NAMES)
_NO_FAILOVER = sql.SQL("NULL::bool, '{}'::text[], '{}'::text[]")

# The holders: backends whose transaction id is at or before the slot's catalog_xmin (age()
# counts back from the server's next transaction id, so it orders ids across wraparound).
_HOLDERS = (
    "SELECT coalesce(json_agg(json_build_object('pid', a.pid, 'database', a.datname,"
    "   'user', a.usename, 'application_name', nullif(a.application_name, ''),"
    "   'state', a.state, 'xact_start', a.xact_start,"
    "   'seconds', extract(epoch FROM clock_timestamp() - a.xact_start), 'query', a.query)"
    "   ORDER BY a.xact_start NULLS LAST, a.pid), '[]')"
    " FROM pg_catalog.pg_replication_slots AS s, pg_catalog.pg_stat_activity AS a"
    " WHERE s.slot_name = %s AND s.catalog_xmin IS NOT NULL AND a.backend_xid IS NOT NULL"
    " AND age(a.backend_xid) >= age(s.catalog_xmin) AND a.pid <> pg_backend_pid()"
)


FAILOVER_VERSION = 170000
"""The first server version with failover slots (``server_version_num``)."""


def failover_supported(conn: Connection) -> bool:
    """The server can synchronize a slot to its standbys (PostgreSQL 17+)."""
    return conn.info.server_version >= FAILOVER_VERSION


def slot_status(conn: Connection, slot: str, *, holders: bool = True) -> SlotStatus | None:
    """The state of ``slot`` on ``conn``'s server, or None when there is no such slot;
    without ``holders``, :attr:`SlotStatus.held_by` is empty and the holders are never read
    (with it, they are read only when a transaction running now may hold the slot)."""
    failover = _FAILOVER if failover_supported(conn) else _NO_FAILOVER
    query = _STATUS.format(held=_MAY_BE_HELD if holders else sql.SQL("false"), failover=failover)
    row = conn.execute(query, (slot,)).fetchone()
    if row is None:
        return None
    name, plugin, active, pid, wal_status, safe, confirmed, restart, current, database = row[:10]
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
        held_by=_holders(conn, slot) if row[10] else (),
        failover=row[11],
        synchronized_standbys=tuple(row[12]),
        missing_standbys=tuple(row[13]),
    )


def _holders(conn: Connection, slot: str) -> tuple[SlotHolder, ...]:
    """The transactions that hold ``slot`` back, oldest first (see the module)."""
    row = conn.execute(_HOLDERS, (slot,)).fetchone()
    return () if row is None else tuple(_holder(h) for h in row[0])


def _holder(row: dict[str, Any]) -> SlotHolder:
    """A holder from its JSON object (see :data:`_HOLDERS`)."""
    started = row.get("xact_start")
    seconds = row.get("seconds")
    return SlotHolder(
        pid=int(row["pid"]),
        database=row.get("database"),
        user=row.get("user"),
        application_name=row.get("application_name"),
        state=row.get("state"),
        xact_start=None if started is None else datetime.fromisoformat(started),
        seconds=None if seconds is None else float(seconds),
        query=query_start(row.get("query")),
    )


_LITERAL = re.compile(r"(?:[eE]|[uU]&)?'(?:[^']|'')*(?:'|$)|\$(\w*)\$.*?(?:\$\1\$|$)", re.DOTALL)
"""A string literal (``'...'``, ``E'...'``, ``U&'...'``, dollar-quoted), also one cut short."""


def query_start(query: str | None) -> str | None:
    """The start of a statement as a holder's report shows it: whitespace collapsed, every
    string literal masked (a statement of another application may carry a secret or a
    person's data), a connection string's password redacted, cut at
    :data:`QUERY_START_CHARS`.

    Examples:
        >>> query_start("UPDATE accounts\\n  SET note = 'card 4111' WHERE id = 7")
        "UPDATE accounts SET note = '…' WHERE id = 7"
        >>> query_start("<insufficient privilege>") is None
        True
    """
    if not query or query == "<insufficient privilege>":
        return None
    masked = " ".join(_LITERAL.sub("'…'", query).split())
    text = redact(masked)
    return text if len(text) <= QUERY_START_CHARS else text[: QUERY_START_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class SlotWait:
    """A run's wait for a slot another session holds, as :func:`wait_for_slot` reports it.

    Attributes:
        slot: The slot.
        holder_pid: The pid of the session holding it (None when it was not known).
        timeout: How long the run waits at most, in seconds.
        waited: Seconds waited so far (0 when the wait begins).
        done: The wait ended: the slot is free, or the wait ran out (``released`` says which).
        released: The slot was let go within the wait.
    """

    slot: str
    holder_pid: int | None
    timeout: float
    waited: float = 0.0
    done: bool = False
    released: bool = False


def wait_for_slot(
    conn: Connection,
    slot: str,
    timeout: float,
    on_wait: Callable[[SlotWait], None] | None = None,
) -> SlotStatus | None:
    """The state of ``slot`` once no session holds it, read again every 0.1 s for at most
    ``timeout`` seconds.

    A run of the group holds the slot while it reads it; a run killed inside its read leaves its
    server process decoding until it next writes to its dead client (seconds, in a long
    decode). The next run waits for either rather than failing at once.

    Args:
        conn: A session of the slot's database.
        slot: The slot.
        timeout: Seconds to wait at most.
        on_wait: Called when a wait begins (the slot is held: its holder's pid, the timeout)
            and when it ends (how long it took, whether the slot was let go); not called when
            the slot is free at once.

    Returns:
        The last state read: inactive, or still held when the wait ran out (the caller's read
        then fails with ``replication_slot_active``, naming the holder); None when there is no
        such slot.
    """
    started = time.monotonic()
    deadline = started + timeout
    status = slot_status(conn, slot, holders=False)
    if status is None or not status.active:
        return status
    wait = SlotWait(slot, status.active_pid, timeout)
    if on_wait is not None:
        on_wait(wait)
    while status is not None and status.active and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        status = slot_status(conn, slot, holders=False)
    if on_wait is not None:
        released = status is None or not status.active
        on_wait(SlotWait(slot, wait.holder_pid, timeout, time.monotonic() - started, True,
                         released))  # fmt: skip
    return status
