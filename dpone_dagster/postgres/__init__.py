"""PostgreSQL: sessions and snapshots, the extraction strategies, the load path, SQL names.

Imports no Dagster. Names reach SQL only through ``psycopg.sql``; values only as parameters.

The entry point of a snapshot copy is :func:`copy_tables` (or :class:`SnapshotCopy`, step by
step), its options one :class:`SnapshotCopyOptions`. A copy reads its tables under one snapshot
with one of the five strategies (:class:`Strategy`) and loads them through the one load path
(:mod:`.load`): staging tables, sinks, one COMMIT whose answer settles every artifact; an
existing target whose columns differ evolves in that transaction or is refused
(:mod:`.schema_change`). A copy can read under a snapshot the caller holds
(``tuning=CopyOptions(snapshot_token=...)``), so that the reconciliation
(:mod:`dpone_dagster.reconcile`) compares the target with the source exactly as the copy read it.
The strategies' artifacts, for callers that drive them, are in their modules
(:mod:`.whole_copy`, :mod:`.stream_rows`, :mod:`.batched_copy`, :mod:`.partitioned_copy`,
:mod:`.internal_query`).
"""

from .catalog import CatalogError, Column
from .connection import ConnectionOptions, ConnectionSettingsError, SessionError, check_dsn
from .identifiers import IdentifierError, TableName, check_identifier
from .load import TargetCommitUnknownError
from .options import (
    BACKFILL_BATCH_SIZE,
    INCREMENTAL_BATCH_SIZE,
    SNAPSHOT_COPY_BATCH_SIZE,
    BatchSize,
    CopyOptions,
)
from .plan import CopyPlanError, Sink, TablePlan
from .progress import CopyProgress
from .report import CopyError, CopyReport, TableCopyReport
from .schema_change import ColumnChange, SchemaChangeError, SchemaChanges
from .sinks import SinkResult
from .snapshot import LazySnapshot, SnapshotError, SnapshotSession
from .snapshot_copy import SnapshotCopy, copy_tables
from .snapshot_copy_options import SnapshotCopyOptions
from .strategy import Strategy
from .target_types import TargetTypes
from .user_types import TargetTypeError

__all__ = [
    "BACKFILL_BATCH_SIZE",
    "INCREMENTAL_BATCH_SIZE",
    "SNAPSHOT_COPY_BATCH_SIZE",
    "BatchSize",
    "CatalogError",
    "Column",
    "ColumnChange",
    "ConnectionOptions",
    "ConnectionSettingsError",
    "CopyError",
    "CopyOptions",
    "CopyPlanError",
    "CopyProgress",
    "CopyReport",
    "IdentifierError",
    "LazySnapshot",
    "SchemaChangeError",
    "SchemaChanges",
    "SessionError",
    "Sink",
    "SinkResult",
    "SnapshotCopy",
    "SnapshotCopyOptions",
    "SnapshotError",
    "SnapshotSession",
    "Strategy",
    "TableCopyReport",
    "TableName",
    "TablePlan",
    "TargetCommitUnknownError",
    "TargetTypeError",
    "TargetTypes",
    "check_dsn",
    "check_identifier",
    "copy_tables",
]
