"""A backfill's metadata: each partition's materialization (its ledger run, receipts, window
and rates, its reconciliation), a committed batch's observation, the run's ``dpone_reconciled``
result and the ``dpone_partitions_fresh`` check of its partitions (:func:`partitions_check`),
built through the backfill's set
(:class:`~dpone_dagster.dagster.metadata.keys.backfill.PartitionMetadataSet`), the batch's and
the common one."""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (see .catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.backfill import (
    BackfillResult,
    BatchReceipt,
    BatchResult,
    ReconciliationReport,
    ScopeState,
)
from dpone_dagster.reconcile import Proof

from .keys.backfill import PartitionMetadataSet
from .keys.batch import BatchMetadataSet
from .keys.common import CommonMetadataSet
from .parts import CHECK_NAME, progress_observation, rate_metadata, snapshot_digests


def receipts_summary(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """What the batches of a partition add up to (first/last cursor, windows, snapshots)."""
    if not receipts:
        return {"batches": 0}
    first, last = receipts[0].observation, receipts[-1].observation
    tokens = {r.observation.extraction.source_token for r in receipts}
    return {
        "batches": len(receipts),
        "first_cursor": first.first_cursor,
        "last_cursor": last.last_cursor,
        "copied": sum(r.copied_count for r in receipts),
        "duplicates": sum(r.duplicate_count for r in receipts),
        "bytes": sum(r.observation.byte_count for r in receipts),
        "snapshots": len(tokens),
        "apply_paths": sorted({r.observation.apply_path.value for r in receipts}),
    }


def _window(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    first = receipts[0].observation.extraction if receipts else None
    last = receipts[-1].observation.extraction if receipts else None
    started = first.extraction_started_at if first else None
    completed = last.extraction_completed_at if last else None
    tokens = sorted({r.observation.extraction.source_token or "" for r in receipts} - {""})
    return dict(
        CommonMetadataSet(
            extraction_started_at=started.isoformat() if started else None,
            extraction_completed_at=completed.isoformat() if completed else None,
            snapshot_token_digest=snapshot_digests(tokens),
        )
    )


def _partition_rates(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """Bytes, seconds and rows per second of this run's batches; lag from its newest batch."""
    if not receipts:
        return rate_metadata(0, 0, None, None)
    rows = sum(r.observation.copied_count + r.observation.duplicate_count for r in receipts)
    started = receipts[0].observation.extraction.extraction_started_at
    completed = receipts[-1].observation.extraction.extraction_completed_at
    metadata = rate_metadata(
        rows, sum(r.observation.byte_count for r in receipts), started, completed
    )
    newest = receipts[-1].observation.extraction.extraction_started_at
    if newest is not None:
        lag = (datetime.now(UTC) - newest).total_seconds()
        metadata.update(CommonMetadataSet(lag_seconds=lag))
    return metadata


def _reconciliation_metadata(report: ReconciliationReport) -> dict[str, Any]:
    """The reconciliation of a partition: its summary, and the rows its repairs inserted,
    updated and deleted (numbers, so the UI plots them)."""
    repaired = report.repaired_rows()
    summary = {
        "ok": report.ok,
        "ranges": len(report.ranges),
        "proven_by_row_versions": report.proven_by(Proof.ROW_VERSIONS),
        "content_hashed": report.proven_by(Proof.CONTENT_HASH),
        "differing": [r.sequence for r in report.differing],
        "proved_at": report.proved_at.isoformat(),
    }
    return dict(
        PartitionMetadataSet(
            reconciliation=dg.MetadataValue.json(summary),
            reconciliation_snapshot_digest=report.source_snapshot,
            rows_repaired_inserted=repaired["inserted"],
            rows_repaired_updated=repaired["updated"],
            rows_repaired_deleted=repaired["deleted"],
        )
    )


def partition_metadata(result: BackfillResult, receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """Everything a backfill partition's materialization says about its run.

    ``dagster/row_count`` is the rows the batches wrote (copied and found equal) or, once a
    reconciliation ran, the rows the target's ranges hold after it (repairs included).
    """
    run, progress = result.run, result.run.progress
    report = result.reconciliation
    rows = progress.copied_count + progress.duplicate_count
    if report is not None:
        rows = sum(r.target_count for r in report.ranges)
    metadata: dict[str, Any] = {
        **TableMetadataSet(row_count=rows),
        **PartitionMetadataSet(
            run_id=run.run_id,
            checkpoint=progress.checkpoint,
            high_water_mark=progress.source_high_water_mark,
            status=run.status.value,
            batches_replayed_now=result.replayed,
            remaining_estimate=progress.remaining_estimate,
        ),
        **CommonMetadataSet(
            batches_committed_now=result.committed,
            receipts_summary=dg.MetadataValue.json(receipts_summary(receipts)),
            snapshot_label=run.snapshot_label.value,
            batches=progress.batch_count,
        ),
        **_window(receipts),
        **_partition_rates(receipts),
    }
    if report is not None:
        metadata.update(_reconciliation_metadata(report))
    return metadata


def batch_observation(key: dg.AssetKey, partition: str, batch: BatchResult) -> dg.AssetObservation:
    """A committed batch, as the UI shows it while the partition runs (``dpone/progress_*``
    keys, plotted apart from the partition's materialization)."""
    progress = batch.run.progress
    figures = BatchMetadataSet(
        progress_checkpoint=progress.checkpoint, progress_copied=progress.copied_count,
        progress_high_water_mark=progress.source_high_water_mark,
        progress_remaining=progress.remaining_estimate, progress_batch=batch.receipt.sequence,
        progress_replayed=batch.replayed,
    )  # fmt: skip
    return progress_observation(key, figures, partition)


def backfill_check(
    key: dg.AssetKey, checks: Sequence[dict[str, Any]], passed: bool
) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of a backfill's run: a one-line summary as its
    description, the partitions checked and differing and the ranges proven as numbers (so the
    UI plots them), and each partition's summary under ``dpone/partitions``."""
    differing = [str(c["partition"]) for c in checks if not c["ok"]]
    ranges = sum(int(c.get("ranges") or 0) for c in checks)
    if differing:
        summary = (
            f"{len(differing)} of {len(checks)} partition(s) differ from the source at their "
            f"mark: {', '.join(differing)}."
        )
    else:
        summary = (
            f"{len(checks)} partition(s) checked: the target holds what the source held at "
            f"each mark ({ranges} checkpoint range(s) proven)."
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=passed,
        description=summary,
        metadata=dict(
            PartitionMetadataSet(
                partitions_checked=len(checks),
                partitions_differing=len(differing),
                ranges_proven=ranges,
                partitions=dg.MetadataValue.json(list(checks)),
            )
        ),
    )


PARTITIONS_CHECK_NAME = "dpone_partitions_fresh"
"""The check that lists a backfill's partitions from the ledger and says which are stale."""

_LISTED = 200
"""At most this many partitions in the check's table (the stale ones first)."""


def _stale(state: ScopeState, max_age: timedelta, now: datetime) -> str | None:
    """Why a started partition is stale (``None``: it is not, or it never started)."""
    if state.status is None:
        return None
    if state.rows_past_mark:
        return "rows past its mark"
    if state.as_of is None or now - state.as_of > max_age:
        return "older than the age"
    return None


def _row(partition: str, state: ScopeState, why: str | None, now: datetime) -> str:
    def at(t: datetime | None) -> str:
        return t.astimezone(UTC).isoformat(timespec="seconds") if t else ""

    age = "" if state.as_of is None else f"{(now - state.as_of).total_seconds():.0f} s"
    status = state.status.value if state.status else "not started"
    return (
        f"| {partition} | {status} | {at(state.last_batch_at)} | {at(state.proved_at)} | "
        f"{age} | {'yes' if state.rows_past_mark else ''} | {why or ''} |"
    )


def partitions_check(
    key: dg.AssetKey,
    states: Sequence[tuple[str, ScopeState]],
    max_age: timedelta,
    now: datetime | None = None,
    check_name: str = PARTITIONS_CHECK_NAME,
) -> dg.AssetCheckResult:
    """The ``dpone_partitions_fresh`` result: every partition's state from the ledger.

    A started partition is stale when its newest batch or reconciliation (the newer) is older
    than ``max_age``, or when its source range holds rows above its high-water mark (the source
    changed since). The check passes when none is; otherwise it does not pass with severity
    ``WARN``, naming them. Partitions never started are counted, not stale (Dagster shows them
    missing).

    Args:
        key: The backfill asset.
        states: Each partition key and its :class:`~dpone_dagster.backfill.ScopeState`, in order.
        max_age: The age beyond which a partition is stale.
        now: The time of the judgement (UTC ``now`` by default).
        check_name: The check's name.
    """
    now = now or datetime.now(UTC)
    why = {p: _stale(s, max_age, now) for p, s in states}
    stale = [p for p, _ in states if why[p]]
    rows = sorted(states, key=lambda ps: why[ps[0]] is None)[:_LISTED]
    table = [
        "| Partition | Status | Last batch | Proved at | Age | Rows past mark | Stale |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(_row(p, s, why[p], now) for p, s in rows),
    ]
    if len(states) > _LISTED:
        table.append(f"\n{len(states) - _LISTED} more partitions, none of them stale.")
    named = ", ".join(f"{p} ({why[p]})" for p in stale[:10]) + (", ..." if len(stale) > 10 else "")
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=check_name,
        passed=not stale,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{len(stale)} of {len(states)} partitions stale: {named}."
            if stale
            else f"No partition of {len(states)} is older than {max_age} or behind its source."
        ),
        metadata=dict(
            PartitionMetadataSet(
                max_age_seconds=max_age.total_seconds(),
                partitions_stale=len(stale),
                partitions_past_mark=sum(s.rows_past_mark for _, s in states),
                partitions_not_started=sum(s.status is None for _, s in states),
                partition_states=dg.MetadataValue.md("\n".join(table)),
            )
        ),
    )
