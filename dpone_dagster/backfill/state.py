"""What the ledger says of one backfill scope (a partition), and whether its source moved on.

:meth:`~dpone_dagster.backfill.Backfill.state` reads it without scanning anything: the run's row
and the newest batch commit and range check times from the ledger, and one index probe of the
source (the cursor leads an index, a backfill's rule) for a row of the range above the run's
high-water mark: a row that arrived after the mark, which the target does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.core.sessions import Sessions
from dpone_dagster.cursor.backfill_documents import BackfillStatus, MissingBoundary
from dpone_dagster.cursor.cursor_ledger import RunLedger

from .shape import TableShape


@dataclass(frozen=True)
class ScopeState:
    """One scope's state, from the ledger and one source index probe.

    Attributes:
        run_id: The scope's run id.
        status: The run's status, ``None`` before its first plan.
        high_water_mark: The cursor value the run copies up to (``None``: no run, or the range
            was empty at the mark).
        last_batch_at: When the newest batch committed (the ledger's clock).
        proved_at: When the newest range check of the run was recorded (its reconciliation).
        rows_past_mark: The source now holds a row of the range whose cursor is above the
            high-water mark (arrived, or moved into the range, after the mark): the target
            lacks it. ``False`` before the first plan.
    """

    run_id: str
    status: BackfillStatus | None
    high_water_mark: str | None
    last_batch_at: datetime | None
    proved_at: datetime | None
    rows_past_mark: bool

    @property
    def as_of(self) -> datetime | None:
        """The newest time the target's range was copied from or proved equal to the source."""
        times = [t for t in (self.last_batch_at, self.proved_at) if t is not None]
        return max(times) if times else None


def scope_state(
    sessions: Sessions,
    ledger: RunLedger,
    shape: TableShape,
    run_id: str,
    bounds: tuple[str | None, str | None],
) -> ScopeState:
    """The state of the run ``run_id`` of the range ``bounds`` (``(lower, upper]``, canonical)."""
    run = ledger.fetch(sessions.ledger, run_id)
    if run is None:
        return ScopeState(run_id, None, None, None, None, rows_past_mark=False)
    mark = (
        None if isinstance(run.boundary, MissingBoundary) else run.boundary.source_high_water_mark
    )
    last_batch_at, proved_at = ledger.times(sessions.ledger, run_id)
    # The mark lies in the range: above it and at most the range's upper bound.
    where, params = shape.where(mark if mark is not None else bounds[0], bounds[1])
    probe = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {})").format(shape.source.ident, where)
    past = sessions.source.execute(probe, params).fetchone()
    return ScopeState(
        run_id, run.status, mark, last_batch_at, proved_at, rows_past_mark=bool(past and past[0])
    )
