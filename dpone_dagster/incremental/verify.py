"""The final batch's verdicts: which keys to delete, and whether the target now equals the
source at or below the run's mark.

Both come from the final batch's source snapshot and target transaction (after its merge): a
verified run compares whole rows (:func:`.compare.compare`), which also finds the deletes;
otherwise the deletes come from counting key ranges (:mod:`.ranges`, for an integer key) or from
comparing the key sets' digests. A difference is explained when the source row's cursor lies
above the mark (changed or inserted since: the next run's) or when the target holds a key the
source lost (deleted now, or kept under ``ignore``); any other difference fails the
verification.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.postgres.connection import Connection

from .compare import Comparison, Key, compare
from .deletes import apply_deletes
from .plan import above
from .ranges import range_scan
from .shape import StreamShape
from .state import Verification


@dataclass(frozen=True)
class FinalCheck:
    """What the final batch found and did: rows deleted, keys compared, the verification."""

    deleted: int = 0
    keys_compared: int = 0
    verification: Verification | None = None


def _without_jit(*conns: Connection) -> None:
    """Turns JIT off for the current transactions: compiling costs more than these scans take."""
    for conn in conns:
        conn.execute("SELECT set_config('jit', 'off', true)")


def _verdict(
    src: Connection, shape: StreamShape, found: Comparison, mark: str | None, *, kept: bool
) -> Verification:
    candidates = {**found.source_only, **found.differing}
    keys = list(candidates)
    later = above(src, shape, [candidates[k] for k in keys], mark)
    unexplained: list[Key] = [k for k, is_later in zip(keys, later, strict=True) if not is_later]
    return Verification(
        ok=not unexplained,
        keys_compared=found.keys_compared,
        ranges_differing=found.ranges_differing,
        changed_since_mark=len(keys) - len(unexplained),
        deleted_kept=len(found.target_only) if kept else 0,
        unexplained=len(unexplained),
        examples=tuple(sorted(unexplained)[:20]),
    )


def final_check(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    *,
    deletes: Deletes,
    verify: bool,
    mark: str | None,
    at: datetime,
) -> FinalCheck:
    """Finds (and applies) the deletes and verifies the run, as asked.

    Args:
        src: The source session, in the final batch's snapshot.
        tgt: The target session, in the final batch's transaction (after the merge).
        shape: The stream.
        deletes: ``ignore``, ``hard`` or ``soft``.
        verify: Compare whole rows and judge the differences.
        mark: The run's mark.
        at: The time a ``soft`` delete records (the snapshot's).
    """
    if deletes is Deletes.IGNORE and not verify:
        return FinalCheck()
    _without_jit(src, tgt)
    verification, keys_compared = None, 0
    if verify:
        found = compare(src, tgt, shape, rows=True)
        gone, keys_compared = sorted(found.target_only), found.keys_compared
        verification = _verdict(src, shape, found, mark, kept=deletes is Deletes.IGNORE)
    else:
        scan = None if mark is None else range_scan(src, tgt, shape, mark)
        if scan is None:
            found = compare(src, tgt, shape, rows=False)
            gone, keys_compared = sorted(found.target_only), found.keys_compared
        else:
            gone, keys_compared = scan.deleted, scan.keys_compared
    deleted = 0 if deletes is Deletes.IGNORE else apply_deletes(tgt, shape, gone, at)
    return FinalCheck(deleted, keys_compared, verification)


def check_target(
    src: Connection, tgt: Connection, shape: StreamShape, lower: str | None
) -> Verification:
    """Compares whole rows of both sides without changing anything: every source row with a
    cursor at or below ``lower`` (where the next run starts reading) must be in the target,
    equal; target rows whose key the source lost are counted in ``deleted_kept`` (the next run
    deletes them under ``hard``).

    Args:
        src: The source session, inside the snapshot to compare with.
        tgt: The target session, inside its transaction.
        shape: The stream.
        lower: Rows above it are the next run's (``None``: every row is).
    """
    _without_jit(src, tgt)
    return _verdict(src, shape, compare(src, tgt, shape, rows=True), lower, kept=True)
