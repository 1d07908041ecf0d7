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
from .sweep import CheckScope, Sweep, SweepLedger, run_keys, sweep_slices


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


@dataclass(frozen=True)
class RunCheck:
    """How a verified run checks itself (``scope`` ``run``: :mod:`.sweep`).

    Attributes:
        scope: ``run`` (the run's keys and a rolling slice) or ``full`` (both whole tables).
        sweep: The rolling slice's budget.
        sweeps: The ledger's sweep positions.
        stream_id: The stream.
        lower: The run's lower cursor bound (exclusive; ``None``: from the start).
    """

    scope: CheckScope
    sweep: Sweep
    sweeps: SweepLedger
    stream_id: str
    lower: str | None


def _find_deletes(
    src: Connection, tgt: Connection, shape: StreamShape, mark: str | None
) -> tuple[list[Key], int]:
    """The keys the target holds and the source lost, and the keys that crossed the wire."""
    scan = None if mark is None else range_scan(src, tgt, shape, mark)
    if scan is None:
        found = compare(src, tgt, shape, rows=False)
        return sorted(found.target_only), found.keys_compared
    return scan.deleted, scan.keys_compared


def _run_check(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    check: RunCheck,
    *,
    mark: str | None,
    at: datetime,
    deletes: Deletes,
) -> Verification | None:
    """The run's keys and this run's slice of the sweep (``None``: the run copied too many rows
    for its keys to be looked up; compare whole tables)."""
    own = run_keys(src, tgt, shape, check.lower, mark)
    if own.checked is None:
        return None
    position = check.sweeps.fetch(tgt, check.stream_id)
    swept = sweep_slices(src, tgt, shape, position, check.sweep, mark=mark, at=at,
                         gone_allowed=deletes is Deletes.IGNORE)  # fmt: skip
    check.sweeps.save(tgt, swept.position)
    unexplained = sorted({*own.found.unexplained, *swept.found.unexplained})
    pos = swept.position
    return Verification(
        ok=not unexplained, keys_compared=own.checked + swept.keys_compared,
        ranges_differing=0, changed_since_mark=own.later,
        deleted_kept=len(swept.found.gone), unexplained=len(unexplained),
        examples=tuple(unexplained[:20]), scope=CheckScope.RUN.value, keys_checked=own.checked,
        ranges_checked=swept.ranges, ranges_total=swept.ranges_total, rows_swept=swept.rows,
        sweep_started_at=pos.started_at, swept_at=pos.last_full_at,
        swept_from=pos.last_full_started_at, proved_at=at,
    )  # fmt: skip


def final_check(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    *,
    deletes: Deletes,
    verify: RunCheck | None,
    mark: str | None,
    at: datetime,
) -> FinalCheck:
    """Finds (and applies) the deletes and verifies the run, as asked.

    Args:
        src: The source session, in the final batch's snapshot.
        tgt: The target session, in the final batch's transaction (after the merge).
        shape: The stream.
        deletes: ``ignore``, ``hard`` or ``soft``.
        verify: How to verify the run (``None``: not at all). ``full`` compares whole rows of
            both tables (which also finds the deletes); ``run`` finds the deletes first, then
            checks the run's keys and a slice of the sweep, after them.
        mark: The run's mark.
        at: The snapshot's time: what a ``soft`` delete records, and ``proved_at``.
    """
    if deletes is Deletes.IGNORE and verify is None:
        return FinalCheck()
    _without_jit(src, tgt)
    verification, keys_compared = None, 0
    gone: list[Key] = []
    if verify is not None and verify.scope is CheckScope.RUN:
        if deletes is not Deletes.IGNORE:
            gone, keys_compared = _find_deletes(src, tgt, shape, mark)
        deleted = 0 if deletes is Deletes.IGNORE else apply_deletes(tgt, shape, gone, at)
        verification = _run_check(src, tgt, shape, verify, mark=mark, at=at, deletes=deletes)
        if verification is not None:
            keys = keys_compared + verification.keys_compared
            return FinalCheck(deleted, keys, verification)
        full = compare(src, tgt, shape, rows=True)  # deletes applied: none left to find
        verification = _verdict(src, shape, full, mark, kept=deletes is Deletes.IGNORE)
        verification = verification.model_copy(update={"proved_at": at})
        return FinalCheck(deleted, keys_compared + full.keys_compared, verification)
    if verify is not None:
        found = compare(src, tgt, shape, rows=True)
        gone, keys_compared = sorted(found.target_only), found.keys_compared
        verification = _verdict(src, shape, found, mark, kept=deletes is Deletes.IGNORE)
        verification = verification.model_copy(update={"proved_at": at})
    else:
        gone, keys_compared = _find_deletes(src, tgt, shape, mark)
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
