"""Taking the high-water mark so that no transaction in flight at that moment is lost.

The trap (a writer that reserved a cursor value below the mark commits after its range was
copied; neither pgcopydb nor Debezium's incremental snapshots guard against it) and its evidence
are :mod:`dpone_dagster.core.in_flight`'s. The mark is read inside a ``REPEATABLE READ READ
ONLY`` snapshot together with the transactions in flight; the plan then waits until each of
them has ended. Only after that is the first batch read, in a later snapshot, so every row those
transactions committed below the mark is visible to the batch that covers it. A transaction that
does not end within the settle timeout makes the plan fail with
``backfill_high_water_mark_unsettled``, naming it.

What remains outside the guarantee (and is why the boundary says "trustworthy cursor"): a
cursor a writer can set below the mark in a transaction that begins after the mark, such as a
sequence with ``CACHE > 1`` handing out pre-fetched values. The final reconciliation catches
such a row and repairs its range.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.core.errors import RefusalColumn, engine_error
from dpone_dagster.core.marks import Mark, mark_snapshot, settle_mark
from dpone_dagster.cursor.backfill_documents import (
    BackfillEvidence,
    BoundedWritePause,
    TrustworthyCursor,
)
from dpone_dagster.cursor.table_check import refuse_null_cursor
from dpone_dagster.postgres.connection import Connection

from .shape import TableShape


@dataclass(frozen=True)
class MarkReading:
    """The high-water mark with its evidence, and the scope's rows at the mark.

    Attributes:
        mark: The mark (its value is the largest cursor value of the scope, ``None``: no row).
        rows: Rows of the scope at the mark.
    """

    mark: Mark
    rows: int

    @property
    def high_water_mark(self) -> str | None:
        """The largest cursor value in the scope (``None``: no row)."""
        return self.mark.mark


def take_high_water_mark(
    conn: Connection,
    shape: TableShape,
    lower: str | None,
    upper: str | None,
    *,
    settle_timeout: float | None = 60.0,
    poll_interval: float = 0.05,
) -> MarkReading:
    """Reads the mark in one snapshot, then waits out the transactions in flight at that moment.

    Args:
        conn: An autocommit source session (pinned by
            :func:`dpone_dagster.core.sessions.prepared_session`).
        shape: The resolved tables.
        lower: The partition's exclusive lower bound.
        upper: The partition's inclusive upper bound.
        settle_timeout: Seconds to wait for in-flight transactions; ``None`` under a bounded
            write pause (nobody writes, nothing to wait for).
        poll_interval: Seconds between checks.

    Raises:
        EngineError: ``plan_invalid`` when a row's cursor is NULL (the one table check's
            last step, :func:`~dpone_dagster.cursor.table_check.refuse_null_cursor`);
            ``backfill_high_water_mark_unsettled`` when a transaction outlives the timeout.
    """
    where, params = shape.where(lower, upper)
    cursor, table = shape.cursor.ident, shape.source.ident
    with mark_snapshot(conn) as snapshot:
        found = conn.execute(
            sql.SQL("SELECT max({c})::text, count(*) FROM {t} WHERE {w}").format(
                c=cursor, t=table, w=where
            ),
            params,
        ).fetchone()
        refuse_null_cursor(conn, shape, RefusalColumn.FIXED_MARK)  # before the settle wait
    assert found is not None
    hwm = None if found[0] is None else str(found[0])
    mark = settle_mark(
        conn, snapshot, hwm, settle_timeout=settle_timeout, poll_interval=poll_interval
    )
    if mark.unsettled:
        raise engine_error(
            "backfill_high_water_mark_unsettled",
            f"{len(mark.unsettled)} transaction(s) open since the mark was taken are still "
            f"running after {settle_timeout:g}s (backend pids "
            f"{', '.join(map(str, mark.unsettled_pids))}).",
        )
    return MarkReading(mark, int(str(found[1])))


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
        digest=mark.mark.snapshot_token_digest,
        detail=f"Mark read at {mark.mark.taken_at.isoformat()} (postgresql.clock_timestamp) over "
        f"{mark.rows} rows; {mark.mark.awaited} in-flight transaction(s) waited out in "
        f"{mark.mark.waited_seconds:.3f}s.",
    )
    return boundary, evidence
