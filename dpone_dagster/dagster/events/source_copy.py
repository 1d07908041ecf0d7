"""A generic source's copy as events: ``mysql.copy_table(context, target=target, ...)``.

The source (a MySQL/MariaDB table or query, an HTTP JSON API) is loaded into a PostgreSQL table
through a staging table and a sink (``replace``, ``append``, ``merge``), like the PostgreSQL
snapshot copies. The materialization carries ``dagster/row_count``, the receipts under
``dpone/...`` and the standard table set; the snapshot label is always ``no_snapshot_claim``
(a generic source makes no snapshot claim).
"""

import json
from collections.abc import Iterator, Sequence
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
from dpone_dagster.postgres.schema_change import SchemaChanges
from dpone_dagster.postgres.target_plan import Sink
from dpone_dagster.sources import SourceAdapter, SourceLoadReport, load_source

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
    they built from their settings, the other attributes are their arguments as plain values
    (the target's database).
    """

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: SourceAdapter
    target: Database
    target_table: str | TableName
    sink: Sink | str
    primary_key: Sequence[str]
    schema_changes: SchemaChanges | str

    def run(self) -> Iterator[SourceCopyEvent]:
        """Loads the source into the target table; yields the asset's materialization."""
        context, target = self.context, self.target
        table = (
            self.target_table
            if isinstance(self.target_table, TableName)
            else TableName.parse(self.target_table)
        )
        report = load_source(
            self.source,
            target.dsn,
            table,
            sink=self.sink,
            primary_key=self.primary_key,
            options=target.options,
            schema_changes=self.schema_changes,
        )
        log_schema_changes(context.log, table.qualified, report.schema_changes)
        context.log.info(
            f"dpone: {report.rows_loaded} rows from {report.source_label} into {table} "
            f"({report.sink_method}); outcome {report.outcome.value}"
        )
        standard = table_set(context, target, context.asset_key, table)
        yield dg.MaterializeResult(metadata={**report_metadata(report), **standard})
