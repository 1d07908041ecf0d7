"""dpone-dagster: PostgreSQL snapshot copies and crash-safe ordered backfills for Dagster.

The public API is what ``__all__`` lists. The domain core lives in ``dpone_dagster.lifecycle``,
``dpone_dagster.postgres`` and ``dpone_dagster.backfill`` and runs without Dagster; the names here
are the Dagster surface plus the core's entry points.
"""

from dpone_dagster.assets.backfill import backfill_asset
from dpone_dagster.assets.snapshot_copy import snapshot_copy_assets
from dpone_dagster.backfill import Backfill, BackfillError, LedgerConfig
from dpone_dagster.components import PostgresCopyComponent
from dpone_dagster.failures import DponeFailure
from dpone_dagster.jobs import build_extraction_job
from dpone_dagster.lifecycle import (
    ORCHESTRATOR_UTC,
    ArtifactTerminalReceipt,
    DponeError,
    ExtractionLifecycleAuthority,
    ExtractionLifecycleReceipt,
    ExtractResult,
    TerminalOutcome,
    owned_staging_handle,
)
from dpone_dagster.partitions import cursor_range_partitions
from dpone_dagster.postgres import CopyError, CopyReport, SnapshotCopy, TableName, copy_tables
from dpone_dagster.resources import (
    BackfillLedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.sources_dagster import (
    MySQLSourceResource,
    RestSourceResource,
    mysql_copy_asset,
    rest_copy_asset,
)
from dpone_dagster.translator import CopyTableSpec, DponeTranslator

__version__ = "0.1.0"

__all__ = [
    "ORCHESTRATOR_UTC",
    "ArtifactTerminalReceipt",
    "Backfill",
    "BackfillError",
    "BackfillLedgerResource",
    "CopyError",
    "CopyReport",
    "CopyTableSpec",
    "DponeError",
    "DponeFailure",
    "DponeTranslator",
    "ExtractResult",
    "ExtractionLifecycleAuthority",
    "ExtractionLifecycleReceipt",
    "LedgerConfig",
    "MySQLSourceResource",
    "PostgresCopyComponent",
    "PostgresSourceResource",
    "PostgresTargetResource",
    "RestSourceResource",
    "SnapshotCopy",
    "TableName",
    "TerminalOutcome",
    "__version__",
    "backfill_asset",
    "build_extraction_job",
    "copy_tables",
    "cursor_range_partitions",
    "mysql_copy_asset",
    "owned_staging_handle",
    "rest_copy_asset",
    "snapshot_copy_assets",
]
