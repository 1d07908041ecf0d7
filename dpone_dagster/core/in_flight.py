"""Evidence of transactions in flight: who had a transaction open when a mark was read.

The trap every cursor-based copy meets: a writer reserves cursor value 1001 (``nextval``,
``now()``), a second writer takes 1002 and commits, a mark reads 1002, the range up to it is
copied, and only then does the first writer commit. Its row is below the mark and behind the
checkpoint. The engines read their mark inside one ``REPEATABLE READ`` snapshot and, in the same
snapshot, list the virtual transaction ids of every other client session of the source database
with a transaction open (every PostgreSQL transaction holds the lock on its own virtual xid for
its whole life, whether or not it has written yet, which is what ``CREATE INDEX CONCURRENTLY``
waits on too). They then wait those transactions out before reading the range, so every row they
commit below the mark is visible to the read that covers it. What an engine does with a
transaction that outlives its wait is the engine's rule (the backfill refuses, the stream reads
that range again later).

One kind of transaction is not waited for: an engine batch's own read of the source (another
partition's, another job's). It is ``READ ONLY`` and can commit no row, and it holds the shared
advisory lock :data:`READER_LOCK` for its whole life (taken by
:func:`~dpone_dagster.core.read_window.open_read_window`, in the statement that takes its
snapshot), which is how the listing tells it apart. Without that, a partition's mark would wait
on every batch read of the partitions running beside it, and be refused when one of them is held
open longer than the wait (a batch whose ``COPY`` waits on a row lock in the target).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpone_dagster.postgres.connection import Connection

from .waits import wait_while

READER_LOCK = 0x64_706F6E65
"""The key of the shared advisory lock an engine batch's ``READ ONLY`` read of the source holds
until its transaction ends (``b"dpone"`` as a number): the marks do not wait for it."""

_IN_FLIGHT = """
SELECT l.virtualxid, a.pid, coalesce(a.application_name, ''), coalesce(a.state, '')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND a.datname = current_database() AND a.backend_type = 'client backend'
  AND l.pid <> pg_backend_pid()
  AND NOT EXISTS (SELECT 1 FROM pg_locks r WHERE r.pid = l.pid AND r.locktype = 'advisory'
                  AND r.classid = %s::bigint::oid AND r.objid = %s::bigint::oid
                  AND r.objsubid = 1 AND r.mode = 'ShareLock' AND r.granted)
"""

_STILL_RUNNING = """
SELECT l.virtualxid, l.pid FROM pg_locks l
WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.virtualxid = ANY(%s)
"""


@dataclass(frozen=True)
class Settled:
    """How the wait for the transactions in flight ended.

    Attributes:
        waited_seconds: How long it waited.
        running: ``(virtualxid, pid)`` of each transaction still open when the wait ran out
            (empty when every one ended).
    """

    waited_seconds: float
    running: tuple[tuple[str, int], ...] = ()


def in_flight_transactions(conn: Connection) -> list[str]:
    """The virtual transaction ids of every other client session of the database with a
    transaction open (written or not), read in ``conn``'s current snapshot; an engine batch's
    read of the source (holding :data:`READER_LOCK`) is left out."""
    # pg_locks shows a bigint advisory key as its high and low 32 bits.
    key = (READER_LOCK >> 32, READER_LOCK & 0xFFFFFFFF)
    return [str(r[0]) for r in conn.execute(_IN_FLIGHT, key).fetchall()]


def still_running(conn: Connection, in_flight: Sequence[str]) -> list[tuple[str, int]]:
    """``(virtualxid, pid)`` of each transaction of ``in_flight`` that has not ended yet."""
    rows = conn.execute(_STILL_RUNNING, (list(in_flight),)).fetchall()
    return [(str(r[0]), int(str(r[1]))) for r in rows]


class _StillOpenError(Exception):
    def __init__(self, running: Sequence[tuple[str, int]]) -> None:
        super().__init__("still open")
        self.running = tuple(running)


def wait_out(
    conn: Connection, in_flight: Sequence[str], *, timeout: float, interval: float
) -> Settled:
    """Waits until every transaction of ``in_flight`` has ended, at most ``timeout`` seconds.

    Args:
        conn: An autocommit session of the source database (outside any transaction).
        in_flight: Virtual xids from :func:`in_flight_transactions`.
        timeout: Seconds to wait.
        interval: Seconds between two looks at ``pg_locks``.

    Returns:
        The seconds waited and the transactions still open when the wait ran out.
    """
    if not in_flight:
        return Settled(0.0)
    try:
        waited = wait_while(
            lambda: still_running(conn, in_flight),
            timeout=timeout,
            interval=interval,
            timed_out=_StillOpenError,
        )
    except _StillOpenError as open_:
        return Settled(timeout, open_.running)
    return Settled(waited)
