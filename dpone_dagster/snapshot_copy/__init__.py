"""The snapshot copy engine: a set of tables read under one source snapshot, loaded in one
target transaction. No Dagster.

The entry point is :func:`copy_tables` (or :class:`SnapshotCopy`, step by step), its options
one :class:`SnapshotCopyOptions` and its tuning one :class:`CopyOptions`. A copy reads its
tables under one snapshot with one of the five strategies (:class:`Strategy`; the registry,
:mod:`.registry`, picks each one's class) and loads them through the toolkit's one load path
(:mod:`dpone_dagster.postgres.load`): staging tables, sinks, one COMMIT whose answer settles
every artifact; an existing target whose columns differ evolves in that transaction or is
refused (:mod:`dpone_dagster.postgres.schema_change`). What it did is one :class:`CopyReport`.
A copy can read under a snapshot the caller holds (``tuning=CopyOptions(snapshot_token=...)``),
so that the reconciliation (:mod:`dpone_dagster.reconcile`) compares the target with the source
exactly as the copy read it, and the replication's initial copy meets its slot exactly.

The strategies' artifacts, for callers that drive them, are in their modules
(:mod:`.whole_copy`, :mod:`.stream_rows`, :mod:`.batched_copy`, :mod:`.partitioned_copy`,
:mod:`.internal_query`), on the base of :mod:`.table_artifact`. The engine stands on the
PostgreSQL toolkit (:mod:`dpone_dagster.postgres`) and the lifecycle, and imports nothing above
them; the reconciliation, the replication and the Dagster layer stand on it.
"""

from .copy_progress import CopyProgress
from .copy_report import CopyError, CopyReport, TableCopyReport
from .engine import SnapshotCopy, copy_tables
from .options import SnapshotCopyOptions, Strategy
from .tuning import CopyOptions

__all__ = [
    "CopyError",
    "CopyOptions",
    "CopyProgress",
    "CopyReport",
    "SnapshotCopy",
    "SnapshotCopyOptions",
    "Strategy",
    "TableCopyReport",
    "copy_tables",
]
