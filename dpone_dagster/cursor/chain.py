"""The checkpoint chain: every receipt links to the one before it, from the first to the run."""

from __future__ import annotations

from collections.abc import Sequence

from dpone_dagster.core.errors import engine_error

from .backfill_documents import BackfillRun, BatchReceipt
from .cursor_sql import cursor_is_strictly_before
from .run_rules import checkpoint_for, require_valid


def verify_chain(run: BackfillRun, receipts: Sequence[BatchReceipt]) -> None:
    """Checks that ``receipts`` (in sequence order) are exactly the run's checkpoint chain.

    Raises:
        EngineError: ``backfill_run_invalid`` naming the first broken link.
    """
    require_valid(run)
    previous: str | None = None
    after = run.scope.lower
    copied = duplicates = 0
    for index, receipt in enumerate(receipts, start=1):
        seen = receipt.observation
        recomputed = checkpoint_for(run.run_id, previous, receipt.batch_digest, seen)
        if (
            receipt.sequence != index
            or receipt.run_id != run.run_id
            or receipt.previous_checkpoint != previous
            or receipt.checkpoint != recomputed
            or receipt.after != after
            or (
                seen.first_cursor is not None
                and after is not None
                and not cursor_is_strictly_before(after, seen.first_cursor)
            )
        ):
            raise engine_error(
                "backfill_run_invalid", f"The checkpoint chain breaks at batch {index}."
            )
        previous = receipt.checkpoint
        after = seen.upper if seen.upper is not None else after
        copied += seen.copied_count
        duplicates += seen.duplicate_count
    p = run.progress
    if (previous, len(receipts), copied, duplicates) != (
        p.checkpoint,
        p.batch_count,
        p.copied_count,
        p.duplicate_count,
    ):
        raise engine_error(
            "backfill_run_invalid", "The receipts do not add up to the run's progress."
        )
