"""A snapshot copy's metadata: each copied table's materialization (how it was copied, its
receipts, its figures as numbers) and its ``dpone_reconciled`` result."""

from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (see .catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.postgres import CopyReport, TableCopyReport
from dpone_dagster.reconcile import TableReconciliation

from .parts import (
    CHECK_NAME,
    created_metadata,
    rate_metadata,
    receipt_metadata,
    schema_change_metadata,
    timestamp_value,
)
from .sets import DponeMetadataSet


def step_seconds_metadata(seconds: dict[str, float]) -> dict[str, Any]:
    """``dpone/seconds_<step>`` for each timed step of a copy (plan, extract, load)."""
    return dict(
        DponeMetadataSet(
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
        **DponeMetadataSet(
            strategy=report.strategy.value,
            sink=report.sink.value,
            terminal_outcome=report.outcome.value,
            snapshot_label=report.snapshot_label.value,
            copy_format=table.copy_format,
            copy_format_reason=table.copy_format_reason,
            source_table=table.source.qualified,
            table=table.target.qualified,
            rows_loaded=table.rows_loaded or 0,
            sink_method=None if sink is None else sink.method,
            rows_inserted=None if sink is None else sink.rows_inserted,
            rows_updated=None if sink is None else sink.rows_updated,
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
        metadata=dict(
            DponeMetadataSet(
                guarantee=result.guarantee.value,
                proof=result.proof.value,
                source_rows=result.source.count,
                target_rows=result.target.count,
                source_digest=result.source.hash,
                target_digest=result.target.hash,
                proved_at=timestamp_value(result.proved_at),
            )
        ),
    )
