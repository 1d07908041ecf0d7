"""The event iterators the source resources' methods return: iterating one runs its copy and
yields its materializations and checks (``yield from source.copy_tables(context, ...)``)."""

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
