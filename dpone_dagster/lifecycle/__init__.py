"""The lifecycle core: receipts, authorities, terminal outcomes, file release, staging guard.

This package imports neither psycopg nor Dagster (an import-linter contract keeps it so): every
rule here is about time, evidence and ownership, and holds for any source.
"""

from .artifact import ExtractionArtifact, ExtractResult
from .authority import ExtractionLifecycleAuthority
from .errors import DponeError, LifecycleError
from .labels import SnapshotLabel
from .receipt import (
    ORCHESTRATOR_UTC,
    ExtractionLifecycleReceipt,
    ReceiptState,
    SnapshotEvidence,
    token_digest,
)
from .redaction import redact
from .staging_guard import StagingTable, owned_staging_handle
from .terminal import (
    ArtifactTerminalReceipt,
    FileReleaseAuthority,
    LiveSource,
    TerminalAuthority,
    TerminalOutcome,
)
from .vocabulary import Vocabulary

__all__ = [
    "ORCHESTRATOR_UTC",
    "ArtifactTerminalReceipt",
    "DponeError",
    "ExtractResult",
    "ExtractionArtifact",
    "ExtractionLifecycleAuthority",
    "ExtractionLifecycleReceipt",
    "FileReleaseAuthority",
    "LifecycleError",
    "LiveSource",
    "ReceiptState",
    "SnapshotEvidence",
    "SnapshotLabel",
    "StagingTable",
    "TerminalAuthority",
    "TerminalOutcome",
    "Vocabulary",
    "owned_staging_handle",
    "redact",
    "token_digest",
]
