"""A generic source's copy as events: ``mysql.copy_table(context, target=target, ...)``.

The source (a MySQL/MariaDB table or query, an HTTP JSON API) is loaded into a PostgreSQL table
through a staging table and a sink (``replace``, ``append``, ``merge``), like the PostgreSQL
snapshot copies. The materialization carries ``dagster/row_count``, the receipts under
``dpone/...`` and the standard table set; the snapshot label is always ``no_snapshot_claim``
(a generic source makes no snapshot claim).
"""

import json
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (see ..metadata.catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.parts import (
    log_schema_changes,
    rate_metadata,
    schema_change_metadata,
)
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import SourceAdapter, SourceCopyOptions, SourceLoadReport, load_source

from .databases import Database
from .skeleton import JobEvents
from .tail import table_set

SourceCopyEvent = dg.MaterializeResult[Any]


def report_metadata(report: SourceLoadReport) -> dict[str, Any]:
    """The materialization metadata of a generic load (figures as numbers)."""
    receipt = report.extraction_receipt
    rates = rate_metadata(
        report.rows_loaded or 0,
        receipt.byte_count,
        receipt.extraction_started_at,
        receipt.extraction_completed_at,
    )
    return {
        **rates,
        **TableMetadataSet(row_count=report.rows_loaded or 0),
        **CommonMetadataSet(
            source=report.source_label,
            sink=report.sink.value,
            sink_method=report.sink_method or "-",
            terminal_outcome=report.outcome.value,
            snapshot_label=report.snapshot_label.value,
            extraction_receipt=dg.MetadataValue.json(json.loads(receipt.model_dump_json())),
        ),
        **schema_change_metadata(report.schema_changes),
    }


@dataclass(frozen=True)
class SourceCopyEvents(JobEvents[SourceCopyEvent]):
    """The events of one generic source's copy into a PostgreSQL table: iterating them runs it.

    :meth:`~dpone_dagster.MySQLSourceResource.copy_table` and
    :meth:`~dpone_dagster.RestSourceResource.copy_table` return one; ``source`` is the adapter
    they built from their settings (what is read), ``options`` the copy's options
    (:class:`~dpone_dagster.sources.SourceCopyOptions`, how the rows land), the other
    attributes plain values (the target's database, the target table).
    """

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: SourceAdapter
    target: Database
    target_table: TableName
    options: SourceCopyOptions

    def run(self) -> Iterator[SourceCopyEvent]:
        """Loads the source into the target table; yields the asset's materialization."""
        context, target, table = self.context, self.target, self.target_table
        report = load_source(
            self.source, target.dsn, table, options=self.options,
            connection_options=target.options,
        )  # fmt: skip
        log_schema_changes(context.log, table.qualified, report.schema_changes)
        context.log.info(
            f"dpone: {report.rows_loaded} rows from {report.source_label} into {table} "
            f"({report.sink_method}); outcome {report.outcome.value}"
        )
        standard = table_set(context, target, context.asset_key, table)
        yield dg.MaterializeResult(metadata={**report_metadata(report), **standard})
