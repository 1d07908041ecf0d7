"""The materialization metadata of a snapshot copy: receipts in Dagster's vocabulary.

Standard keys where Dagster has one (``dagster/row_count``), dpone's own under ``dpone/``.
"""

from typing import Any

import dagster as dg

from dpone_dagster.lifecycle import ExtractionLifecycleReceipt
from dpone_dagster.postgres import CopyReport, TableCopyReport


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
        "dpone/strategy": report.strategy,
        "dpone/sink": report.sink,
        "dpone/terminal_outcome": report.outcome.value,
        "dpone/snapshot_label": report.snapshot_label.value,
        "dpone/copy_format": table.copy_format,
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
