"""The rules a copied batch keeps before its receipt is written, each one named.

The copier reports what it saw (:class:`BatchObservation`); :func:`check_observation` holds it
against every rule below, in order, and the first rule that does not hold refuses the batch with
its stable code and a message that names the rule. The order rules keep batches strictly
advancing in cursor order inside the mark, so no row is copied twice or skipped between two
checkpoints; the count rule binds the snapshot's count to what both COPY commands and the target
report; the receipt rule binds the batch to a completed read under one snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpone_dagster.core.errors import engine_error

from .backfill_documents import BatchObservation, BatchRequest
from .cursor_sql import cursor_at_most, cursor_is_strictly_before

_Holds = Callable[[BatchRequest, BatchObservation], bool]
_Shows = Callable[[BatchRequest, BatchObservation], str]


def _positions(request: BatchRequest, seen: BatchObservation) -> str:
    final = " (final)" if seen.final else ""
    return (
        f"rows {seen.first_cursor!r}..{seen.last_cursor!r} up to {seen.upper!r}{final}, after "
        f"{request.after!r}, mark {request.source_high_water_mark!r}"
    )


@dataclass(frozen=True)
class BatchRule:
    """One rule of a copied batch.

    Attributes:
        name: What the rule says, as the refusal names it.
        code: The stable error code a batch that breaks it is refused with.
        holds: True when the request and what the copier saw keep the rule.
        shows: What the refusal reports of the batch.
    """

    name: str
    code: str
    holds: _Holds
    shows: _Shows = _positions


def _cursors_match_rows(_: BatchRequest, seen: BatchObservation) -> bool:
    rows = seen.source_count > 0
    return (seen.first_cursor is not None) == rows == (seen.last_cursor is not None)


def _before(low: str | None, high: str | None) -> bool:
    """``low`` sorts strictly before ``high``; holds when either is absent."""
    return low is None or high is None or cursor_is_strictly_before(low, high)


def _not_after(low: str | None, high: str | None) -> bool:
    """``low`` sorts before ``high`` or equals it; holds when either is absent."""
    return low is None or high is None or cursor_at_most(low, high)


def _within(value: str | None, bound: str | None) -> bool:
    """``value`` is absent, or ``bound`` is present and ``value`` does not sort after it."""
    return value is None or (bound is not None and cursor_at_most(value, bound))


def _counts(seen: BatchObservation) -> dict[str, int]:
    return {
        "read inside the snapshot": seen.source_count,
        "COPY TO tag": seen.copy_out_count,
        "COPY FROM tag": seen.copy_in_count,
        "target count": seen.target_count,
        "copied + duplicates": seen.copied_count + seen.duplicate_count,
    }


def _counts_agree(_: BatchRequest, seen: BatchObservation) -> bool:
    return len(set(_counts(seen).values())) == 1


def _show_counts(_: BatchRequest, seen: BatchObservation) -> str:
    return ", ".join(f"{name} {count}" for name, count in _counts(seen).items())


def _receipt_read_the_rows(_: BatchRequest, seen: BatchObservation) -> bool:
    receipt = seen.extraction
    return receipt.has_snapshot and receipt.row_count == seen.copy_out_count


def _show_receipt(_: BatchRequest, seen: BatchObservation) -> str:
    snapshot = "a snapshot" if seen.extraction.has_snapshot else "no snapshot"
    return (
        f"the receipt has {snapshot} and {seen.extraction.row_count} rows, the COPY TO tag "
        f"{seen.copy_out_count}"
    )


_UNORDERED = "backfill_batch_unordered"

BATCH_RULES: tuple[BatchRule, ...] = (
    BatchRule(
        "first and last cursors are set exactly when the batch has rows",
        _UNORDERED,
        _cursors_match_rows,
    ),
    BatchRule(
        "first cursor not after the last cursor",
        _UNORDERED,
        lambda _, seen: _not_after(seen.first_cursor, seen.last_cursor),
    ),
    BatchRule(
        "first cursor strictly after the checkpoint",
        _UNORDERED,
        lambda request, seen: _before(request.after, seen.first_cursor),
    ),
    BatchRule(
        "last cursor within the batch's upper bound",
        _UNORDERED,
        lambda _, seen: _within(seen.last_cursor, seen.upper),
    ),
    BatchRule(
        "upper bound strictly after the checkpoint",
        _UNORDERED,
        lambda request, seen: _before(request.after, seen.upper),
    ),
    BatchRule(
        "upper bound within the mark",
        _UNORDERED,
        lambda request, seen: _within(seen.upper, request.source_high_water_mark),
    ),
    BatchRule(
        "the final batch ends at the mark",
        _UNORDERED,
        lambda request, seen: not seen.final or seen.upper == request.source_high_water_mark,
    ),
    BatchRule(
        "a non-final batch has rows and stops before the mark",
        _UNORDERED,
        lambda request, seen: (
            seen.final or (seen.source_count > 0 and seen.upper != request.source_high_water_mark)
        ),
    ),
    BatchRule(
        "the snapshot's count, both COPY tags, the target's count and copied + duplicates agree",
        "backfill_record_changed",
        _counts_agree,
        _show_counts,
    ),
    BatchRule(
        "the extraction receipt is a completed snapshot read of the copied rows",
        "backfill_run_invalid",
        _receipt_read_the_rows,
        _show_receipt,
    ),
)
"""Every rule of a copied batch, in the order they are checked."""


def check_observation(request: BatchRequest, seen: BatchObservation) -> None:
    """Refuses a batch that breaks a rule of :data:`BATCH_RULES`, naming the first it breaks.

    Raises:
        EngineError: the rule's code (``backfill_batch_unordered``,
            ``backfill_record_changed`` or ``backfill_run_invalid``); the message names the rule
            and what the batch saw.
    """
    for rule in BATCH_RULES:
        if not rule.holds(request, seen):
            raise engine_error(
                rule.code,
                f'Batch {request.batch_id} breaks the rule "{rule.name}" '
                f"({rule.shows(request, seen)}).",
            )
