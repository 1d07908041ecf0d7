"""The PostgreSQL toolkit every engine stands on. Imports no Dagster, and no engine.

Sessions (:mod:`.connection`, the one place a failed session is classified) and snapshots
(:mod:`.snapshot`); SQL names (:mod:`.identifiers`: names reach SQL only through
``psycopg.sql``, values only as parameters); the catalog (:mod:`.catalog`,
:mod:`.target_catalog`); the COPY relay (:mod:`.copy`); the one load path (:mod:`.load`):
a target plan (:mod:`.target_plan`: which columns move, in which COPY format, how the target
takes them), staging tables, schema changes (:mod:`.schema_change`), the user-defined types and
extensions a target gets (:mod:`.target_types`), the sinks (:mod:`.sinks`), one COMMIT whose
answer settles every artifact, and the row-version evidence a load takes (:mod:`.evidence`);
deletes by key (:mod:`.delete_keys`, :mod:`.text_keys`, :mod:`.soft_deletes`), polite strong
locks (:mod:`.lock_wait`) and the one catalog of database failures (:mod:`.failures`). The
snapshot copy, the backfill, the incremental stream, the replication and the generic sources
all load through it.

The snapshot copy engine is its own package, :mod:`dpone_dagster.snapshot_copy`. Its names
(``copy_tables``, ``SnapshotCopy``, ``SnapshotCopyOptions``, ``CopyOptions``, ``CopyReport``,
...) still import from here for one release, with a ``DeprecationWarning``: they are looked up
on first use (:func:`~dpone_dagster.lazy_names.moved_names`), so that this floor never imports
the engine above it.
"""

from dpone_dagster.lazy_names import moved_names

from .catalog import CatalogError, Column
from .connection import ConnectionOptions, ConnectionSettingsError, SessionError, check_dsn
from .identifiers import IdentifierError, TableName, check_identifier
from .load import TargetCommitUnknownError
from .options import (
    BACKFILL_BATCH_SIZE,
    INCREMENTAL_BATCH_SIZE,
    SNAPSHOT_COPY_BATCH_SIZE,
    BatchSize,
)
from .schema_change import ColumnChange, SchemaChangeError, SchemaChanges
from .sinks import SinkResult
from .snapshot import LazySnapshot, SnapshotError, SnapshotSession
from .target_plan import CopyPlanError, Sink, TablePlan
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
    "CopyPlanError",
    "IdentifierError",
    "LazySnapshot",
    "SchemaChangeError",
    "SchemaChanges",
    "SessionError",
    "Sink",
    "SinkResult",
    "SnapshotError",
    "SnapshotSession",
    "TableName",
    "TablePlan",
    "TargetCommitUnknownError",
    "TargetTypeError",
    "TargetTypes",
    "check_dsn",
    "check_identifier",
]

_MOVED = dict.fromkeys(
    (
        "CopyError",
        "CopyOptions",
        "CopyProgress",
        "CopyReport",
        "SnapshotCopy",
        "SnapshotCopyOptions",
        "Strategy",
        "TableCopyReport",
        "copy_tables",
    ),
    "dpone_dagster.snapshot_copy",
)

__getattr__ = moved_names(__name__, _MOVED)
