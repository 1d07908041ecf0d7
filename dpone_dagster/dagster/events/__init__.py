"""The event iterators the source resources' methods return: iterating one runs its copy and
yields its materializations and checks (``yield from source.copy_tables(context, ...)``)."""

from typing import TYPE_CHECKING

from dpone_dagster.lazy_names import lazy_names

if TYPE_CHECKING:
    from .backfill import BackfillEvent, BackfillEvents
    from .incremental import IncrementalEvent, IncrementalEvents
    from .kafka_copy import KafkaCopyEvent, KafkaCopyEvents
    from .replication import ReplicationEvent, ReplicationEvents
    from .snapshot_copy import CopyEvent, CopyEvents
    from .source_copy import SourceCopyEvent, SourceCopyEvents

__all__ = [
    "BackfillEvent",
    "BackfillEvents",
    "CopyEvent",
    "CopyEvents",
    "IncrementalEvent",
    "IncrementalEvents",
    "KafkaCopyEvent",
    "KafkaCopyEvents",
    "ReplicationEvent",
    "ReplicationEvents",
    "SourceCopyEvent",
    "SourceCopyEvents",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "BackfillEvent": ".backfill",
        "BackfillEvents": ".backfill",
        "CopyEvent": ".snapshot_copy",
        "CopyEvents": ".snapshot_copy",
        "IncrementalEvent": ".incremental",
        "IncrementalEvents": ".incremental",
        "KafkaCopyEvent": ".kafka_copy",
        "KafkaCopyEvents": ".kafka_copy",
        "ReplicationEvent": ".replication",
        "ReplicationEvents": ".replication",
        "SourceCopyEvent": ".source_copy",
        "SourceCopyEvents": ".source_copy",
    },
)
