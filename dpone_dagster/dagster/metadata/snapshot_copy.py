"""A snapshot copy's metadata: each copied table's materialization (how it was copied, its
receipts, its figures as numbers) and its ``dpone_reconciled`` result, built through the copy's
set (:class:`~dpone_dagster.dagster.metadata.keys.copy.CopyMetadataSet`) and the common one."""

from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (see .catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.lifecycle import ExtractionLifecycleReceipt
from dpone_dagster.reconcile import TableReconciliation
from dpone_dagster.snapshot_copy import CopyReport, TableCopyReport

from .keys.common import CommonMetadataSet
from .keys.copy import CopyMetadataSet
from .parts import (
    CHECK_NAME,
    created_metadata,
    rate_metadata,
    schema_change_metadata,
    timestamp_value,
)


def receipt_metadata(receipt: ExtractionLifecycleReceipt | None) -> dict[str, Any]:
    """The extraction window, its clock and the snapshot token digest of one receipt."""
    if receipt is None:
        return {}
    started, completed = receipt.extraction_started_at, receipt.extraction_completed_at
    return {
        **CommonMetadataSet(
            extraction_started_at=started.isoformat() if started else None,
            extraction_completed_at=completed.isoformat() if completed else None,
            snapshot_token_digest=receipt.source_token,
            extraction_receipt=dg.MetadataValue.json(receipt.model_dump(mode="json")),
        ),
        **CopyMetadataSet(
            clock_authority=receipt.clock_authority,
            snapshot_authority=receipt.snapshot_authority,
        ),
    }


def step_seconds_metadata(seconds: dict[str, float]) -> dict[str, Any]:
    """``dpone/seconds_<step>`` for each timed step of a copy (plan, extract, load)."""
    return dict(
        CopyMetadataSet(
            seconds_plan=seconds.get("plan"),
            seconds_extract=seconds.get("extract"),
            seconds_load=seconds.get("load"),
        )
    )


def table_metadata(report: CopyReport, table: TableCopyReport) -> dict[str, Any]:
    """Everything a copied table's materialization says about how it was copied."""
    sink = table.sink_result
    terminal = table.terminal_receipt
    metadata: dict[str, Any] = {
        **TableMetadataSet(row_count=table.rows_loaded or 0),
        **CommonMetadataSet(
            sink=report.sink.value,
            terminal_outcome=report.outcome.value,
            snapshot_label=report.snapshot_label.value,
            source_table=table.source.qualified,
            table=table.target.qualified,
            rows_loaded=table.rows_loaded or 0,
            sink_method=None if sink is None else sink.method,
            rows_inserted=None if sink is None else sink.rows_inserted,
            rows_updated=None if sink is None else sink.rows_updated,
        ),
        **CopyMetadataSet(
            strategy=report.strategy.value,
            copy_format=table.copy_format,
            copy_format_reason=table.copy_format_reason,
            terminal_receipt=None
            if terminal is None
            else dg.MetadataValue.json(terminal.model_dump(mode="json")),
        ),
    }
    metadata.update(receipt_metadata(table.extraction_receipt))
    receipt = table.extraction_receipt
    if receipt is not None:
        metadata.update(
            rate_metadata(
                table.rows_loaded or 0,
                receipt.byte_count,
                receipt.extraction_started_at,
                receipt.extraction_completed_at,
            )
        )
    metadata.update(schema_change_metadata(table.schema_changes))
    metadata.update(created_metadata(table.target_types, table.virtual_as_stored))
    return metadata


def copy_check_result(key: dg.AssetKey, result: TableReconciliation) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of one copied table."""
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=result.passed,
        description=result.detail,
        metadata={
            **CommonMetadataSet(
                guarantee=result.guarantee.value, proved_at=timestamp_value(result.proved_at)
            ),
            **CopyMetadataSet(
                proof=result.proof.value,
                source_rows=result.source.count,
                target_rows=result.target.count,
                source_digest=result.source.hash,
                target_digest=result.target.hash,
            ),
        },
    )
