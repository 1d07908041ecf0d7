"""The final batch's verdicts: which keys to delete, and whether the target now equals the
source at or below the run's mark.

Both come from the final batch's source snapshot and target transaction (after its merge): a
verified run compares whole rows (the one drill-down compare,
:func:`dpone_dagster.reconcile.compare.compare`), which also finds the deletes;
otherwise the deletes come from counting key ranges (:mod:`.ranges`, for an integer key) or from
comparing the key sets' digests. A difference is explained when the source row's cursor lies
above the mark (changed or inserted since: the next run's) or when the target holds a key the
source lost (deleted now, or kept under ``ignore``); any other difference fails the
verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.verification import Verification, timed
from dpone_dagster.cursor.mark_policies import above
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.reconcile.compare import Comparison, Key, compare

from .deletes import apply_deletes
from .ranges import range_scan
from .shape import StreamShape
from .sweep import (
    CheckScope,
    Differences,
    RunKeys,
    Sweep,
    SweepLedger,
    cursor_above,
    run_keys,
    sweep_slices,
)


@dataclass(frozen=True)
class FinalCheck:
    """What the final batch found and did: rows deleted, keys compared, the verification, every
    key that differs for no known reason (what a repair rewrites), and the target's live rows
    after the check's deletes when it counted the whole target on the way (``None``: it did
    not; :mod:`.row_count`)."""

    deleted: int = 0
    keys_compared: int = 0
    verification: Verification | None = None
    unexplained: tuple[Key, ...] = ()
    target_rows: int | None = None


def _without_jit(*conns: Connection) -> None:
    """Turns JIT off for the current transactions: compiling costs more than these scans take."""
    for conn in conns:
        conn.execute("SELECT set_config('jit', 'off', true)")


def _verdict(
    src: Connection, shape: StreamShape, found: Comparison, mark: str | None, *, kept: bool
) -> tuple[Verification, list[Key]]:
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
    ), sorted(unexplained)


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
) -> tuple[list[Key], int, int | None]:
    """The keys the target holds and the source lost, the keys that crossed the wire, and the
    target's live rows (both ways count the whole key)."""
    scan = None if mark is None else range_scan(src, tgt, shape, mark)
    if scan is None:
        found = compare(*shape.sides(src, tgt, rows=False))
        return sorted(found.target_only), found.keys_compared, found.target_rows
    return scan.deleted, scan.keys_compared, scan.target_rows


def _run_check(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    check: RunCheck,
    *,
    mark: str | None,
    at: datetime,
    deletes: Deletes,
    verify: bool,
) -> tuple[Verification | None, int, list[Key], int | None] | None:
    """The run's keys (when ``verify``) and this run's slice of the sweep, whose target-only
    keys ``sweep`` deletes; ``(verification, rows deleted)`` (``None``: the run copied too many
    rows for its keys to be looked up; compare whole tables), the keys that differ,
    unexplained, and the target's live rows after those deletes when the slices covered the
    whole key."""
    own = run_keys(src, tgt, shape, check.lower, mark) if verify else RunKeys(0, Differences())
    if own.checked is None:
        return None
    position = check.sweeps.fetch(tgt, check.stream_id)
    allowed = deletes is Deletes.IGNORE or deletes is Deletes.SWEEP
    swept = sweep_slices(src, tgt, shape, position, check.sweep, at=at, gone_allowed=allowed,
                         later=lambda keys: cursor_above(src, shape, keys, mark))  # fmt: skip
    check.sweeps.save(tgt, swept.position)
    deleted = 0
    if deletes is Deletes.SWEEP:
        deleted = apply_deletes(tgt, shape, swept.found.gone, at)
    rows = _less(swept.target_rows, deleted)
    if not verify:
        return None, deleted, [], rows
    unexplained = sorted({*own.found.unexplained, *swept.found.unexplained})
    pos = swept.position
    kept = len(swept.found.gone) if deletes is Deletes.IGNORE else 0
    verification = Verification(
        ok=not unexplained, keys_compared=own.checked + swept.keys_compared,
        ranges_differing=0, changed_since_mark=own.later, deleted_kept=kept,
        unexplained=len(unexplained), examples=tuple(unexplained[:20]),
        scope=CheckScope.RUN.value, keys_checked=own.checked, ranges_checked=swept.ranges,
        ranges_total=swept.ranges_total, rows_swept=swept.rows,
        sweep_started_at=pos.started_at, swept_at=pos.last_full_at,
        swept_from=pos.last_full_started_at, proved_at=at, differing_ranges=swept.differing,
    )  # fmt: skip
    return verification, deleted, unexplained, rows


def _full_check(
    src: Connection, tgt: Connection, shape: StreamShape, deletes: Deletes, mark: str | None,
    at: datetime,
) -> tuple[Comparison, Verification, list[Key]]:  # fmt: skip
    """Both whole tables compared: the comparison (the keys the source lost, the keys compared,
    the target's live rows), the verdict and the keys that differ, unexplained."""
    found = compare(*shape.sides(src, tgt, rows=True))
    verification, unexplained = _verdict(src, shape, found, mark, kept=deletes is Deletes.IGNORE)
    return found, verification.model_copy(update={"proved_at": at}), unexplained


def final_check(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    *,
    deletes: Deletes,
    verify: bool,
    how: RunCheck,
    mark: str | None,
    at: datetime,
) -> FinalCheck:
    """Finds (and applies) the deletes and verifies the run, as asked.

    Args:
        src: The source session, in the final batch's snapshot.
        tgt: The target session, in the final batch's transaction (after the merge).
        shape: The stream.
        deletes: ``ignore``, ``hard``, ``soft`` or ``sweep`` (the target keys the sweep's
            slices find the source lost are deleted).
        verify: Verify the run. ``how.scope`` ``full`` compares whole rows of both tables
            (which also finds every delete); ``run`` finds the deletes first (``hard``,
            ``soft``), then checks the run's keys and a slice of the sweep, after them.
        how: How the run is checked, and the sweep (``sweep`` deletes run it unverified too).
        mark: The run's mark.
        at: The snapshot's time: what a ``soft`` delete records, and ``proved_at``.
    """
    if deletes is Deletes.IGNORE and not verify:
        return FinalCheck()
    _without_jit(src, tgt)
    exact = deletes is Deletes.HARD or deletes is Deletes.SOFT
    if how.scope is CheckScope.FULL and verify:
        started = time.monotonic()
        whole, verdict, odd = _full_check(src, tgt, shape, deletes, mark, at)
        gone = sorted(whole.target_only) if deletes is not Deletes.IGNORE else []
        deleted = apply_deletes(tgt, shape, gone, at)
        return FinalCheck(deleted, whole.keys_compared, timed(verdict, started), tuple(odd),
                          _less(whole.target_rows, deleted))  # fmt: skip
    gone, keys_compared, counted = _find_deletes(src, tgt, shape, mark) if exact else ([], 0, None)
    deleted = apply_deletes(tgt, shape, gone, at)
    rows = _less(counted, deleted)
    if not verify and deletes is not Deletes.SWEEP:
        return FinalCheck(deleted, keys_compared, target_rows=rows)
    started = time.monotonic()
    checked = _run_check(src, tgt, shape, how, mark=mark, at=at, deletes=deletes, verify=verify)
    if checked is not None:
        run, swept_out, odd, swept_rows = checked
        keys = keys_compared + (run.keys_compared if run else 0)
        run = None if run is None else timed(run, started)
        rows = rows if swept_rows is None else swept_rows  # the slices counted after the deletes
        return FinalCheck(deleted + swept_out, keys, run, tuple(odd), rows)
    # Too many of the run's keys to look up: both whole tables (the deletes left included).
    whole, verdict, odd = _full_check(src, tgt, shape, deletes, mark, at)
    swept_out = 0
    if deletes is Deletes.SWEEP:
        swept_out = apply_deletes(tgt, shape, sorted(whole.target_only), at)
    return FinalCheck(deleted + swept_out, keys_compared + whole.keys_compared,
                      timed(verdict, started), tuple(odd),
                      _less(whole.target_rows, swept_out))  # fmt: skip


def _less(counted: int | None, deleted: int) -> int | None:
    """The target's live rows counted before ``deleted`` of them were deleted (or marked)."""
    return None if counted is None else counted - deleted


def idle_check(
    src: Connection, tgt: Connection, shape: StreamShape, how: RunCheck, mark: str
) -> Verification | None:
    """The check of a run with nothing to copy (``ignore``, nothing above the mark): no key of
    its own, this run's slice of the sweep, proved at the source snapshot's start.

    Args:
        src: The source session, at the start of a ``REPEATABLE READ`` transaction.
        tgt: The target session, in a transaction holding the stream's lock.
        shape: The stream.
        how: The check (``run`` scope) and the sweep.
        mark: The stream's mark.
    """
    row = src.execute("SELECT statement_timestamp()").fetchone()  # the snapshot's start
    assert row is not None
    _without_jit(src, tgt)
    started = time.monotonic()
    checked = _run_check(src, tgt, shape, how, mark=mark, at=row[0], deletes=Deletes.IGNORE,
                         verify=True)  # fmt: skip
    return None if checked is None or checked[0] is None else timed(checked[0], started)


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
    started = time.monotonic()
    found = compare(*shape.sides(src, tgt, rows=True))
    return timed(_verdict(src, shape, found, lower, kept=True)[0], started)
