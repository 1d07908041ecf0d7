"""dpone-dagster: PostgreSQL snapshot copies and crash-safe ordered backfills for Dagster.

The public API is what ``__all__`` lists. The domain core lives in ``dpone_dagster.lifecycle``,
``dpone_dagster.postgres`` and ``dpone_dagster.backfill`` and runs without Dagster; the names here
are the Dagster surface plus the core's entry points. They are imported on first use, so that
``import dpone_dagster.postgres`` (or ``.backfill``) never loads Dagster.
"""

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from dpone_dagster.assets.backfill import (
        backfill_asset,
    )
    from dpone_dagster.assets.snapshot_copy import (
        snapshot_copy_assets,
    )
    from dpone_dagster.backfill import (
        Backfill,
        BackfillError,
        LedgerConfig,
    )
    from dpone_dagster.components import (
        PostgresCopyComponent,
    )
    from dpone_dagster.failures import (
        DponeFailure,
    )
    from dpone_dagster.jobs import (
        build_extraction_job,
    )
    from dpone_dagster.partitions import (
        cursor_range_partitions,
    )
    from dpone_dagster.postgres import (
        CopyError,
        CopyReport,
        SnapshotCopy,
        TableName,
        copy_tables,
    )
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
    from dpone_dagster.translator import (
        CopyTableSpec,
        DponeTranslator,
    )

_LAZY: dict[str, str] = {
    "Backfill": "dpone_dagster.backfill",
    "BackfillError": "dpone_dagster.backfill",
    "BackfillLedgerResource": "dpone_dagster.resources",
    "CopyError": "dpone_dagster.postgres",
    "CopyReport": "dpone_dagster.postgres",
    "CopyTableSpec": "dpone_dagster.translator",
    "DponeFailure": "dpone_dagster.failures",
    "DponeTranslator": "dpone_dagster.translator",
    "LedgerConfig": "dpone_dagster.backfill",
    "MySQLSourceResource": "dpone_dagster.sources_dagster",
    "PostgresCopyComponent": "dpone_dagster.components",
    "PostgresSourceResource": "dpone_dagster.resources",
    "PostgresTargetResource": "dpone_dagster.resources",
    "RestSourceResource": "dpone_dagster.sources_dagster",
    "SnapshotCopy": "dpone_dagster.postgres",
    "TableName": "dpone_dagster.postgres",
    "backfill_asset": "dpone_dagster.assets.backfill",
    "build_extraction_job": "dpone_dagster.jobs",
    "copy_tables": "dpone_dagster.postgres",
    "cursor_range_partitions": "dpone_dagster.partitions",
    "mysql_copy_asset": "dpone_dagster.sources_dagster",
    "rest_copy_asset": "dpone_dagster.sources_dagster",
    "snapshot_copy_assets": "dpone_dagster.assets.snapshot_copy",
}

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


def __getattr__(name: str) -> Any:
    """Imports a Dagster-surface name on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dpone_dagster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
