"""Materialization and check metadata: receipts in Dagster's vocabulary.

Standard keys where Dagster has one (``dagster/row_count``), dpone's own under ``dpone/``;
figures that vary run over run are numbers, so the UI plots them.
"""

import json
from collections.abc import Sequence
from typing import Any

import dagster as dg

from dpone_dagster.backfill import BackfillResult, BatchReceipt, BatchResult
from dpone_dagster.lifecycle import ExtractionLifecycleReceipt
from dpone_dagster.postgres import CopyReport, TableCopyReport
from dpone_dagster.reconcile import Proof, TableReconciliation

CHECK_NAME = "dpone_reconciled"
"""The asset check every dpone asset declares: the target holds what the source held."""


def receipt_metadata(receipt: ExtractionLifecycleReceipt | None) -> dict[str, Any]:
    """The extraction window, its clock and the snapshot token digest of one receipt."""
    if receipt is None:
        return {}
    started, completed = receipt.extraction_started_at, receipt.extraction_completed_at
    return {
        "dpone/extraction_started_at": started.isoformat() if started else "",
        "dpone/extraction_completed_at": completed.isoformat() if completed else "",
        "dpone/clock_authority": receipt.clock_authority,
        "dpone/snapshot_authority": receipt.snapshot_authority or "",
        "dpone/snapshot_token_digest": receipt.source_token or "",
        "dpone/extraction_receipt": dg.MetadataValue.json(receipt.model_dump(mode="json")),
    }


def table_metadata(report: CopyReport, table: TableCopyReport) -> dict[str, Any]:
    """Everything a copied table's materialization says about how it was copied."""
    sink = table.sink_result
    metadata: dict[str, Any] = {
        "dagster/row_count": table.rows_loaded or 0,
        "dpone/strategy": report.strategy.value,
        "dpone/sink": report.sink,
        "dpone/terminal_outcome": report.outcome.value,
        "dpone/snapshot_label": report.snapshot_label.value,
        "dpone/copy_format": table.copy_format,
        "dpone/copy_format_reason": table.copy_format_reason or "",
        "dpone/source_table": table.source.qualified,
        "dpone/table": table.target.qualified,
        "dpone/rows_loaded": table.rows_loaded or 0,
    }
    if sink is not None:
        metadata["dpone/sink_method"] = sink.method
        metadata["dpone/rows_inserted"] = sink.rows_inserted
        metadata["dpone/rows_updated"] = sink.rows_updated
    metadata.update(receipt_metadata(table.extraction_receipt))
    if table.terminal_receipt is not None:
        metadata["dpone/terminal_receipt"] = dg.MetadataValue.json(
            table.terminal_receipt.model_dump(mode="json")
        )
    return metadata


def copy_check_result(key: dg.AssetKey, result: TableReconciliation) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of one copied table."""
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=result.passed,
        description=result.detail,
        metadata={
            "dpone/guarantee": result.guarantee.value,
            "dpone/proof": result.proof.value,
            "dpone/source_rows": result.source.count,
            "dpone/target_rows": result.target.count,
            "dpone/source_digest": result.source.hash or "",
            "dpone/target_digest": result.target.hash or "",
        },
    )


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
    return {
        "dpone/extraction_started_at": started.isoformat() if started else "",
        "dpone/extraction_completed_at": completed.isoformat() if completed else "",
        "dpone/snapshot_token_digest": tokens[0] if len(tokens) == 1 else json.dumps(tokens),
    }


def partition_metadata(result: BackfillResult, receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """Everything a backfill partition's materialization says about its run."""
    run, progress = result.run, result.run.progress
    metadata: dict[str, Any] = {
        "dagster/row_count": progress.copied_count + progress.duplicate_count,
        "dpone/run_id": run.run_id,
        "dpone/checkpoint": progress.checkpoint or "",
        "dpone/high_water_mark": progress.source_high_water_mark or "",
        "dpone/status": run.status.value,
        "dpone/batches_committed_now": result.committed,
        "dpone/batches_replayed_now": result.replayed,
        "dpone/receipts_summary": dg.MetadataValue.json(receipts_summary(receipts)),
        "dpone/snapshot_label": run.snapshot_label.value,
        **_window(receipts),
    }
    report = result.reconciliation
    if report is not None:
        metadata["dpone/reconciliation"] = dg.MetadataValue.json(
            {
                "ok": report.ok,
                "ranges": len(report.ranges),
                "proven_by_row_versions": report.proven_by(Proof.ROW_VERSIONS),
                "content_hashed": report.proven_by(Proof.CONTENT_HASH),
                "differing": [r.sequence for r in report.differing],
            }
        )
    return metadata


def batch_observation(key: dg.AssetKey, partition: str, batch: BatchResult) -> dg.AssetObservation:
    """A committed batch, as the UI shows it while the partition runs."""
    progress = batch.run.progress
    return dg.AssetObservation(
        asset_key=key,
        partition=partition,
        metadata={
            "dpone/checkpoint": progress.checkpoint or "",
            "dpone/copied": progress.copied_count,
            "dpone/high_water_mark": progress.source_high_water_mark or "",
            "dpone/remaining_estimate": progress.remaining_estimate,
            "dpone/batch": batch.receipt.sequence,
            "dpone/replayed": batch.replayed,
        },
    )
