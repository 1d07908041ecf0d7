"""How a cursor copy's upper bound is taken: its two mark policies, as values.

Both read the mark the same way (:func:`~.marks.read_mark`: the largest cursor value in one
snapshot, the transactions in flight in that snapshot waited out before the first batch reads
its range). They differ in when the mark is taken and in what they do with a transaction still
open when the wait runs out.

:class:`FixedMark` (the backfill's): the mark is taken once, when a run is planned, and stays
the run's boundary. The trap it guards against (a writer that reserved a cursor value below the
mark commits after its range was copied; neither pgcopydb nor Debezium's incremental snapshots
guard against it) is :mod:`dpone_dagster.core.in_flight`'s. A transaction that does not end
within the settle timeout makes the plan fail with ``backfill_high_water_mark_unsettled``,
naming it. What remains outside the guarantee (and is why the boundary says "trustworthy
cursor"): a cursor a writer can set below the mark in a transaction that begins after the mark,
such as a sequence with ``CACHE > 1`` handing out pre-fetched values. The final reconciliation
catches such a row and repairs its range.

:class:`MovingMark` (the stream's): every run takes a mark again and copies ``(lower, mark]``.
``lower`` is the stream's mark, or, while transactions that were open at an earlier mark are
still open, the bound the stream kept for them (``rescan_from``), minus the ``lookback`` for
time cursors; the mark never moves backwards (if the newest rows were deleted, it stays where
it was). A session that stays open past the settle timeout (an idle-in-transaction session,
often unrelated) does not stall the stream: the run goes ahead, names it in its notices with
the stable code ``incremental_mark_unsettled``, and the stream keeps the bound it read from.
Every later run reads again from that bound (so rows such a transaction commits below the mark
are copied by the first run after it ends) until a mark is taken with none of them open; the
cost is reading that range again on every run meanwhile, which
``idle_in_transaction_session_timeout`` on the source bounds. The limit, stated: this holds for
a cursor that a writer takes from the server while its transaction is open (``now()``,
``clock_timestamp()``, a sequence without ``CACHE``). A cursor set from a client clock that runs
behind the server's, or a cached sequence, can land below a mark in a transaction that began
after it: the ``lookback`` option reads that much below the mark again on every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from psycopg import sql

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection

from .backfill_documents import BackfillEvidence, BoundedWritePause, TrustworthyCursor
from .marks import Mark, read_mark
from .stream_documents import RunInProgress, StreamState
from .table_check import FIXED_MARK_CHECK, CursorTables

Where = tuple[sql.Composable, list[str]]
"""A ``WHERE`` condition and its parameters."""


@dataclass(frozen=True)
class BoundaryReading:
    """A fixed mark, planned: the run's boundary, its evidence and the scope's rows at the mark.

    Attributes:
        boundary: What the run copies up to (and why that is safe).
        evidence: The mark's snapshot, clock and wait, as the run stores them.
        rows: Rows of the scope at the mark.
    """

    boundary: TrustworthyCursor | BoundedWritePause
    evidence: BackfillEvidence
    rows: int


@dataclass(frozen=True)
class FixedMark:
    """The mark taken once, when a run is planned (the backfill's policy).

    Attributes:
        settle_timeout: Seconds to wait for the transactions in flight at the mark.
        write_pause: The reference of a bounded write pause (nobody writes: nothing to wait
            for), else ``None``.
        poll_interval: Seconds between two looks at ``pg_locks``.
    """

    settle_timeout: float
    write_pause: str | None = None
    poll_interval: float = 0.05

    def take(self, conn: Connection, tables: CursorTables, scope: Where) -> BoundaryReading:
        """Reads the scope's mark in one snapshot (refusing a NULL cursor there, before any
        wait), then waits out the transactions in flight at that moment.

        Args:
            conn: An autocommit source session (pinned by
                :func:`dpone_dagster.core.sessions.prepared_session`).
            tables: The job's checked tables.
            scope: The partition's range, as a condition on the source.

        Raises:
            EngineError: ``plan_invalid`` when a row's cursor is NULL;
                ``backfill_high_water_mark_unsettled`` when a transaction outlives the timeout.
        """
        settle = None if self.write_pause is not None else self.settle_timeout
        mark, rows = read_mark(
            conn, tables, scope, refusal=FIXED_MARK_CHECK, count=True,
            settle_timeout=settle, poll_interval=self.poll_interval,
        )  # fmt: skip
        if mark.unsettled:
            raise engine_error(
                "backfill_high_water_mark_unsettled",
                f"{len(mark.unsettled)} transaction(s) open since the mark was taken are still "
                f"running after {self.settle_timeout:g}s (backend pids "
                f"{', '.join(map(str, mark.unsettled_pids))}).",
            )
        boundary: TrustworthyCursor | BoundedWritePause
        if self.write_pause is not None:
            boundary = BoundedWritePause(
                cursor=tables.cursor.name, source_high_water_mark=mark.mark,
                pause_reference=self.write_pause,
            )  # fmt: skip
        else:
            boundary = TrustworthyCursor(
                cursor=tables.cursor.name, source_high_water_mark=mark.mark
            )
        evidence = BackfillEvidence(
            kind="source_boundary",
            subject=str(mark.mark),
            digest=mark.snapshot_token_digest,
            detail=f"Mark read at {mark.taken_at.isoformat()} (postgresql.clock_timestamp) over "
            f"{rows} rows; {mark.awaited} in-flight transaction(s) waited out in "
            f"{mark.waited_seconds:.3f}s.",
        )
        return BoundaryReading(boundary, evidence, rows or 0)


@dataclass(frozen=True)
class MovingMark:
    """The mark each run takes again (the stream's policy).

    Attributes:
        settle_timeout: Seconds to wait for the transactions in flight at the mark.
        lookback: How far below its lower bound a time cursor is read again on every run.
        poll_interval: Seconds between two looks at ``pg_locks``.
    """

    settle_timeout: float
    lookback: timedelta | None = None
    poll_interval: float = 0.05

    def take(self, conn: Connection, tables: CursorTables) -> Mark:
        """Reads the mark in one snapshot, then waits out the transactions in flight at that
        moment (those still open past the timeout are the mark's ``unsettled``).

        A NULL cursor was refused when the run was planned (the one table check's probe); one
        written since is below no mark, so no run copies it until the next plan refuses it.
        """
        mark, _ = read_mark(
            conn, tables, None, settle_timeout=self.settle_timeout,
            poll_interval=self.poll_interval,
        )  # fmt: skip
        return mark

    def next_lower(self, src: Connection, tables: CursorTables, state: StreamState) -> str | None:
        """Where the stream's next run starts reading: the mark, or below it where transactions
        were still open at the mark (``rescan_from``), less the lookback."""
        lower = state.rescan_from if state.unsettled else state.mark
        if self.lookback is not None and lower is not None:
            row = src.execute(
                sql.SQL("SELECT (CAST(%s::text AS {}) - %s::interval)::text").format(
                    sql.SQL(tables.cursor.type_sql)
                ),
                (lower, self.lookback),
            ).fetchone()
            assert row is not None
            lower = str(row[0])
        return lower

    def plan_run(
        self, src: Connection, tables: CursorTables, state: StreamState, mark: Mark
    ) -> RunInProgress:
        """The next run of ``state`` (no run in progress) up to the fresh ``mark``."""
        kept = state.rescan_from if state.unsettled else state.mark
        rescan_from = None
        if mark.unsettled:  # still open: read from below them again next time
            rescan_from = kept if set(mark.unsettled) & set(state.unsettled) else state.mark
        return RunInProgress(
            number=state.runs + 1,
            lower=self.next_lower(src, tables, state),
            mark=greatest(src, tables, [state.mark, mark.mark]),
            taken_at=mark.taken_at,
            snapshot_token_digest=mark.snapshot_token_digest,
            unsettled=mark.unsettled,
            rescan_from=rescan_from,
            awaited=mark.awaited,
        )


def nothing_to_do(state: StreamState, run: RunInProgress, deletes: Deletes) -> bool:
    """True when a moving mark's run would neither copy, re-read nor compare anything: no state
    is written (``sweep`` deletes: a slice of the sweep may still find some, and then a run
    begins)."""
    return (
        deletes in (Deletes.IGNORE, Deletes.SWEEP)  # a sweep's slice needs no batch
        and not state.unsettled
        and not run.unsettled
        and run.mark == state.mark
        and run.lower == state.mark
    )


def greatest(src: Connection, tables: CursorTables, values: list[str | None]) -> str | None:
    """The largest of ``values`` as the cursor's type (``None`` when all are ``None``)."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return present[0] if present else None
    row = src.execute(
        sql.SQL("SELECT max(CAST(v AS {}))::text FROM unnest(%s::text[]) AS v").format(
            sql.SQL(tables.cursor.type_sql)
        ),
        (present,),
    ).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


def above(src: Connection, tables: CursorTables, values: list[str], mark: str | None) -> list[bool]:
    """For each cursor value (text), whether it lies above ``mark`` (every one, without a
    mark)."""
    if mark is None or not values:
        return [True] * len(values)
    rows = src.execute(
        sql.SQL(
            "SELECT CAST(v AS {t}) > CAST(%s::text AS {t}) FROM unnest(%s::text[])"
            " WITH ORDINALITY AS u(v, n) ORDER BY n"
        ).format(t=sql.SQL(tables.cursor.type_sql)),
        (mark, values),
    ).fetchall()
    return [bool(r[0]) for r in rows]
