"""dpone-dagster: PostgreSQL snapshot copies and crash-safe ordered backfills for Dagster.

The public API is what ``__all__`` lists. The domain core lives in ``dpone_dagster.lifecycle``,
``dpone_dagster.postgres`` and ``dpone_dagster.backfill`` and runs without Dagster.
"""

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
from dpone_dagster.postgres import CopyError, CopyOptions, CopyReport, copy_tables

__version__ = "0.1.0"

__all__ = [
    "ORCHESTRATOR_UTC",
    "ArtifactTerminalReceipt",
    "CopyError",
    "CopyOptions",
    "CopyReport",
    "DponeError",
    "ExtractResult",
    "ExtractionLifecycleAuthority",
    "ExtractionLifecycleReceipt",
    "TerminalOutcome",
    "__version__",
    "copy_tables",
    "owned_staging_handle",
]
