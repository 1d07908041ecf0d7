"""The backfill's error codes: one stable code, one message and the next actions for each.

The codes are those of the ``lenso.extraction-backfill.v1`` contract, so an operator who knows
another implementation of it knows this one, plus ``backfill_high_water_mark_unsettled``: a
transaction in flight when the high-water mark was taken did not finish in time
(:mod:`.boundary` waits them out so that none of their rows is lost).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dpone_dagster.lifecycle import DponeError


class BackfillError(DponeError):
    """A deliberate backfill failure with a stable code (see :data:`BACKFILL_ERRORS`)."""


RECORD_CHANGED_ACTIONS: Final[tuple[str, ...]] = (
    "Inspect the differing ranges (ledger table backfill_range_checks): if the target is wrong, "
    "fix it and reconcile again (Backfill.reconcile, or run the partition again).",
    "If the source table changes under the backfill (rows updated or deleted after they were "
    'copied), run the partition again with on_changed="repair" (Backfill, backfill_asset, '
    "the ledger resource's backfill): the differing ranges are rewritten from one source "
    "snapshot, and the partition is labelled repaired_to_one_snapshot.",
    "To keep a changing table current after its backfill, use incremental_asset.",
)
"""The next actions of ``backfill_record_changed``: fix a wrong target, or repair from the
source, or keep a changing table current incrementally."""

BACKFILL_ERRORS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "plan_invalid": (
        "The backfill plan is invalid.",
        ("Fix the source table, cursor or partition range and plan again.",),
    ),
    "destination_expansion_incomplete": (
        "The target table is not ready to receive the backfill.",
        (
            "Create the target table with the source's columns and types, the same primary "
            "key and an index whose first column is the cursor, then plan again.",
        ),
    ),
    "backfill_cursor_missing": (
        "An online backfill needs a trustworthy cursor or a bounded write pause.",
        (
            "Declare a trustworthy cursor column (monotonic, indexed) or run inside a "
            "bounded write pause.",
        ),
    ),
    "backfill_high_water_mark_unsettled": (
        "Transactions that were in flight when the high-water mark was taken did not finish.",
        (
            "End or wait out the listed sessions, then plan again; a transaction that reserved "
            "a cursor value below the mark could otherwise commit after its batch was copied.",
        ),
    ),
    "backfill_batch_unordered": (
        "The batch does not advance strictly beyond the durable checkpoint in cursor order.",
        ("Resume the source query strictly after the checkpoint's cursor value.",),
    ),
    "backfill_checkpoint_stale": (
        "The expected checkpoint is stale: newer durable progress exists for this run.",
        ("Reload the durable run (Backfill.load) and resume from its current checkpoint.",),
    ),
    "backfill_batch_changed": (
        "A committed batch id was reused with different contents.",
        ("Resume with the original batch or allocate the next ordered batch id.",),
    ),
    "backfill_record_changed": (
        "A copied record differs from the source.",
        RECORD_CHANGED_ACTIONS,
    ),
    "backfill_schema_changed": (
        "The source's copied columns changed during the run; it does not evolve mid-run, because "
        "the batches it already committed hold the old columns.",
        (
            "Either restore the source's columns as they were and run again: the run resumes "
            "after its last durable checkpoint.",
            "Or start the partition over under the new columns: change the target table to "
            "the source's new columns, delete the partition's rows from the target, and run "
            "again (a new run, with its own id, copies the partition from its start).",
        ),
    ),
    "backfill_run_invalid": (
        "The backfill run failed its integrity validation.",
        ("Resume from the last integrity-valid durable revision; do not edit ledger rows.",),
    ),
    "backfill_persistence_failed": (
        "PostgreSQL failed; the last durable checkpoint is intact.",
        (
            "Restore PostgreSQL availability and run again: it resumes after the last durable "
            "checkpoint.",
        ),
    ),
}
"""Every code with its default message and next actions."""


def backfill_error(
    code: str, detail: str | None = None, next_actions: Sequence[str] | None = None
) -> BackfillError:
    """Builds the error for ``code`` with its catalogued message and next actions.

    Args:
        code: A key of :data:`BACKFILL_ERRORS`.
        detail: A sentence appended to the message (what exactly was found).
        next_actions: Replaces the catalogued next actions when given.

    Returns:
        The error, ready to raise.

    Raises:
        KeyError: for a code that is not catalogued (a programming error).
    """
    return BackfillError.from_catalog(BACKFILL_ERRORS, code, detail, next_actions)
