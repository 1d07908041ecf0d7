"""Taking the high-water mark so that no transaction in flight at that moment is lost.

The trap: a writer reserves cursor value 1001 (``nextval``, ``now()``), a second writer takes
1002 and commits, the mark reads 1002, the batch covering 1001 is copied, and only then does the
first writer commit. Its row is below the mark, behind the checkpoint, and lost for good. Neither
pgcopydb nor Debezium's incremental snapshots guard against it.

The mark here is read inside a ``REPEATABLE READ READ ONLY`` snapshot; in the same transaction
the virtual transaction ids of every client session of the source database that has a
transaction open are listed (every PostgreSQL transaction holds the lock on its own virtual xid
for its whole life, whether or not it has written yet, which is what ``CREATE INDEX
CONCURRENTLY`` waits on too). The plan then waits until each of them has ended. Only after that
is the first batch read, in a later snapshot, so every row those transactions committed below
the mark is visible to the batch that covers it. A transaction that does not end within the
settle timeout makes the plan fail with ``backfill_high_water_mark_unsettled``, naming it.

What remains outside the guarantee (and is why the boundary says "trustworthy cursor"): a
cursor a writer can set below the mark in a transaction that begins after the mark, such as a
sequence with ``CACHE > 1`` handing out pre-fetched values. The final reconciliation catches
such a row and repairs its range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import IsolationLevel, sql

from dpone_dagster.lifecycle import token_digest

from .errors import BackfillError, backfill_error
from .protocol import BackfillEvidence, BoundedWritePause, TrustworthyCursor
from .sessions import transaction
from .shape import TableShape
from .waits import wait_while

Conn = psycopg.Connection[tuple[object, ...]]

_IN_FLIGHT = """
SELECT l.virtualxid, a.pid, coalesce(a.application_name, ''), coalesce(a.state, '')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND a.datname = current_database() AND a.backend_type = 'client backend'
  AND l.pid <> pg_backend_pid()
"""

_STILL_RUNNING = """
SELECT l.virtualxid, l.pid FROM pg_locks l
WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.virtualxid = ANY(%s)
"""


@dataclass(frozen=True)
class MarkReading:
    """The high-water mark and its evidence.

    Attributes:
        high_water_mark: The largest cursor value in the scope (``None``: no row).
        rows: Rows of the scope at the mark.
        snapshot_token_digest: Digest of the mark's snapshot (``pg_current_snapshot()``).
        taken_at: The server's clock when the mark's snapshot was taken.
        awaited: How many in-flight transactions were waited out.
        waited_seconds: How long that took.
    """

    high_water_mark: str | None
    rows: int
    snapshot_token_digest: str
    taken_at: datetime
    awaited: int
    waited_seconds: float


@dataclass(frozen=True)
class _Snapshot:
    """What the mark's snapshot read: its token and clock, the mark, and who was in flight."""

    token: str
    taken_at: datetime
    high_water_mark: str | None
    rows: int
    null_cursor: bool
    in_flight: list[str]


def take_high_water_mark(
    conn: Conn,
    shape: TableShape,
    lower: str | None,
    upper: str | None,
    *,
    settle_timeout: float | None = 60.0,
    poll_interval: float = 0.05,
) -> MarkReading:
    """Reads the mark in one snapshot, then waits out the transactions in flight at that moment.

    Args:
        conn: An autocommit source session (pinned by :func:`shape.prepare_session`).
        shape: The resolved tables.
        lower: The partition's exclusive lower bound.
        upper: The partition's inclusive upper bound.
        settle_timeout: Seconds to wait for in-flight transactions; ``None`` under a bounded
            write pause (nobody writes, nothing to wait for).
        poll_interval: Seconds between checks.

    Raises:
        BackfillError: ``plan_invalid`` when a row's cursor is NULL;
            ``backfill_high_water_mark_unsettled`` when a transaction outlives the timeout.
    """
    snap = _read_mark(conn, shape, lower, upper)
    if snap.null_cursor:
        raise backfill_error(
            "plan_invalid",
            f"Rows of {shape.source} have a NULL cursor {shape.cursor.name!r}: no keyset range "
            "holds them, so they would never be copied.",
            ["Fill the NULL cursor values (or choose a NOT NULL cursor), then plan again."],
        )
    awaited, waited = 0, 0.0
    if settle_timeout is not None and snap.in_flight:
        awaited = len(snap.in_flight)
        waited = _settle(conn, snap.in_flight, settle_timeout, poll_interval)
    return MarkReading(
        high_water_mark=snap.high_water_mark,
        rows=snap.rows,
        snapshot_token_digest=token_digest(snap.token),
        taken_at=snap.taken_at,
        awaited=awaited,
        waited_seconds=waited,
    )


def _read_mark(conn: Conn, shape: TableShape, lower: str | None, upper: str | None) -> _Snapshot:
    """The mark, the scope's row count, any NULL cursor and the transactions in flight, all read
    in one ``REPEATABLE READ READ ONLY`` snapshot."""
    where, params = shape.where(lower, upper)
    cursor, table = shape.cursor.ident, shape.source.ident
    with transaction(conn, IsolationLevel.REPEATABLE_READ, read_only=True):
        snap = conn.execute("SELECT pg_current_snapshot()::text, clock_timestamp()").fetchone()
        mark = conn.execute(
            sql.SQL("SELECT max({c})::text, count(*) FROM {t} WHERE {w}").format(
                c=cursor, t=table, w=where
            ),
            params,
        ).fetchone()
        nulls = conn.execute(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {t} WHERE {c} IS NULL)").format(c=cursor, t=table)
        ).fetchone()
        in_flight = in_flight_transactions(conn)
    assert snap is not None
    assert mark is not None
    return _Snapshot(
        token=str(snap[0]),
        taken_at=snap[1],  # type: ignore[arg-type]
        high_water_mark=None if mark[0] is None else str(mark[0]),
        rows=int(mark[1]),  # type: ignore[call-overload]
        null_cursor=bool(nulls is not None and nulls[0]),
        in_flight=in_flight,
    )


def in_flight_transactions(conn: Conn) -> list[str]:
    """The virtual transaction ids of every other client session of the database with a
    transaction open (written or not), read in ``conn``'s current snapshot."""
    return [str(r[0]) for r in conn.execute(_IN_FLIGHT).fetchall()]


def still_running(conn: Conn, in_flight: Sequence[str]) -> list[tuple[object, ...]]:
    """``(virtualxid, pid)`` of each transaction of ``in_flight`` that has not ended yet."""
    return conn.execute(_STILL_RUNNING, (list(in_flight),)).fetchall()


def _settle(conn: Conn, in_flight: list[str], timeout: float, interval: float) -> float:
    """Waits until every virtual transaction id of ``in_flight`` has ended; the seconds waited.

    Raises:
        BackfillError: ``backfill_high_water_mark_unsettled`` naming the backends still running
            after ``timeout`` seconds.
    """

    def running() -> list[tuple[object, ...]]:
        return still_running(conn, in_flight)

    def unsettled(running: Sequence[tuple[object, ...]]) -> BackfillError:
        pids = ", ".join(str(r[1]) for r in running)
        return backfill_error(
            "backfill_high_water_mark_unsettled",
            f"{len(running)} transaction(s) open since the mark was taken are still "
            f"running after {timeout:g}s (backend pids {pids}).",
        )

    return wait_while(running, timeout=timeout, interval=interval, timed_out=unsettled)


def mark_boundary(
    mark: MarkReading, cursor: str, write_pause: str | None
) -> tuple[TrustworthyCursor | BoundedWritePause, BackfillEvidence]:
    """The run's boundary from a mark reading, and the evidence that backs it."""
    boundary: TrustworthyCursor | BoundedWritePause
    if write_pause is not None:
        boundary = BoundedWritePause(
            cursor=cursor,
            source_high_water_mark=mark.high_water_mark,
            pause_reference=write_pause,
        )
    else:
        boundary = TrustworthyCursor(cursor=cursor, source_high_water_mark=mark.high_water_mark)
    evidence = BackfillEvidence(
        kind="source_boundary",
        subject=str(mark.high_water_mark),
        digest=mark.snapshot_token_digest,
        detail=f"Mark read at {mark.taken_at.isoformat()} (postgresql.clock_timestamp) over "
        f"{mark.rows} rows; {mark.awaited} in-flight transaction(s) waited out in "
        f"{mark.waited_seconds:.3f}s.",
    )
    return boundary, evidence
