"""A backfill's metadata: each partition's materialization (its ledger run, receipts, window
and rates, its reconciliation), a committed batch's observation, and the run's
``dpone_reconciled`` result."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (see .catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.backfill import (
    BackfillResult,
    BatchReceipt,
    BatchResult,
    ReconciliationReport,
)
from dpone_dagster.reconcile import Proof

from .parts import CHECK_NAME, progress_observation, rate_metadata, snapshot_digests
from .sets import DponeMetadataSet


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
        DponeMetadataSet(
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
        metadata.update(DponeMetadataSet(lag_seconds=lag))
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
        DponeMetadataSet(
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
        **DponeMetadataSet(
            run_id=run.run_id,
            checkpoint=progress.checkpoint,
            high_water_mark=progress.source_high_water_mark,
            status=run.status.value,
            batches_committed_now=result.committed,
            batches_replayed_now=result.replayed,
            receipts_summary=dg.MetadataValue.json(receipts_summary(receipts)),
            snapshot_label=run.snapshot_label.value,
            remaining_estimate=progress.remaining_estimate,
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
    figures = DponeMetadataSet(
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
            DponeMetadataSet(
                partitions_checked=len(checks),
                partitions_differing=len(differing),
                ranges_proven=ranges,
                partitions=dg.MetadataValue.json(list(checks)),
            )
        ),
    )
