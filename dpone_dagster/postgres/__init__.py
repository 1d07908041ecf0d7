"""PostgreSQL: sessions and snapshots, extraction strategies, sinks, SQL identifiers.

Imports no Dagster. Names reach SQL only through ``psycopg.sql``.

The entry point of a snapshot copy is :func:`copy_tables`; its pieces (snapshot sessions, the
five extraction strategies, staging and sinks) are public for callers that drive the steps
themselves. A copy can read under a snapshot the caller holds (``CopyOptions(snapshot_token=
...)``), and :func:`reconcile_copy` then compares each table's source, inside that snapshot, with
its target by server-side fingerprints (:func:`table_fingerprint`).
"""

from .artifacts import TableArtifact, WholeCopyArtifact, extract_whole_copy
from .batched import BatchedCopyArtifact, CopyBatch, batched_copy
from .bounds import KeyBounds, KeyRange
from .connection import ConnectionOptions, ConnectionSettingsError, check_dsn, connect
from .extraction import Extraction
from .fingerprint import Fingerprint, FingerprintError, table_fingerprint
from .identifiers import IdentifierError, TableName, check_identifier, quote_identifier
from .internal import InternalQueryArtifact
from .options import CopyOptions
from .partitioned import PartitionedCopy, PartitionedCopyArtifact
from .plan import CopyPlanError, Sink, TableMapping, TablePlan, plan_tables
from .progress import CopyProgress
from .reconcile import Guarantee, ReconcileError, TableReconciliation, reconcile_copy
from .report import CopyError, CopyReport, SnapshotLabel, Strategy, TableCopyReport
from .session import SourceTransaction
from .sinks import SinkResult, TargetCommitUnknownError, apply_sink, commit_target, staging_table
from .snapshot import (
    CURRENT_SNAPSHOT,
    EXPORTED_SNAPSHOT,
    POSTGRES_CLOCK,
    LazySnapshot,
    SnapshotError,
    SnapshotSession,
)
from .snapshot_copy import SnapshotCopy, copy_tables
from .staging import PostgresStagingTable, StagingDropError, staging_name_for
from .streamed import StreamedRowsArtifact, stream_rows

__all__ = [
    "CURRENT_SNAPSHOT",
    "EXPORTED_SNAPSHOT",
    "POSTGRES_CLOCK",
    "BatchedCopyArtifact",
    "ConnectionOptions",
    "ConnectionSettingsError",
    "CopyBatch",
    "CopyError",
    "CopyOptions",
    "CopyPlanError",
    "CopyProgress",
    "CopyReport",
    "Extraction",
    "Fingerprint",
    "FingerprintError",
    "Guarantee",
    "IdentifierError",
    "InternalQueryArtifact",
    "KeyBounds",
    "KeyRange",
    "LazySnapshot",
    "PartitionedCopy",
    "PartitionedCopyArtifact",
    "PostgresStagingTable",
    "ReconcileError",
    "Sink",
    "SinkResult",
    "SnapshotCopy",
    "SnapshotError",
    "SnapshotLabel",
    "SnapshotSession",
    "SourceTransaction",
    "StagingDropError",
    "Strategy",
    "StreamedRowsArtifact",
    "TableArtifact",
    "TableCopyReport",
    "TableMapping",
    "TableName",
    "TablePlan",
    "TableReconciliation",
    "TargetCommitUnknownError",
    "WholeCopyArtifact",
    "apply_sink",
    "batched_copy",
    "check_dsn",
    "check_identifier",
    "commit_target",
    "connect",
    "copy_tables",
    "extract_whole_copy",
    "plan_tables",
    "quote_identifier",
    "reconcile_copy",
    "staging_name_for",
    "staging_table",
    "stream_rows",
    "table_fingerprint",
]
