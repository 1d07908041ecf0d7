"""A backfill's keys: :class:`PartitionMetadataSet`."""

import dagster as dg

from .base import DponeSet


class PartitionMetadataSet(DponeSet):
    """A backfill's own ``dpone/`` keys: its spec's reconciliation rule, each partition's
    ledger run and reconciliation, its ``dpone_reconciled`` check and its
    ``dpone_partitions_fresh`` check.
    """

    on_changed: str | None = None
    """``fail`` or ``repair``: what a backfill's reconciliation does with rows changed after
    their batch (spec)."""
    run_id: str | None = None
    """The partition's ledger run (partition)."""
    checkpoint: str | None = None
    """The last committed batch's checkpoint (partition)."""
    high_water_mark: str | None = None
    """The mark the partition copies up to (partition)."""
    status: str | None = None
    """The ledger run's status (partition)."""
    remaining_estimate: int | None = None
    """Rows of the partition's scope not yet accounted for (partition)."""
    batches_replayed_now: int | None = None
    """Batches this step found committed already, answered by replay (partition)."""
    reconciliation: dg.JsonMetadataValue | None = None
    """The partition's reconciliation: ranges, how many row versions proved, how many were
    hashed, which differ (partition, once reconciled)."""
    reconciliation_snapshot_digest: str | None = None
    """Digest of the snapshot the reconciliation read the source under (partition)."""
    rows_repaired_inserted: int | None = None
    """Rows the reconciliation's repairs inserted (partition, once reconciled)."""
    rows_repaired_updated: int | None = None
    """Rows the reconciliation's repairs rewrote (partition, once reconciled)."""
    rows_repaired_deleted: int | None = None
    """Rows the reconciliation's repairs deleted (partition, once reconciled)."""
    partitions: dg.JsonMetadataValue | None = None
    """Each partition's reconciliation summary (check of a backfill)."""
    partitions_checked: int | None = None
    """Partitions the run checked (check of a backfill)."""
    partitions_differing: int | None = None
    """Partitions whose target differs from the source at the mark (check of a backfill)."""
    ranges_proven: int | None = None
    """Checkpoint ranges proven equal, every partition together (check of a backfill)."""
    max_age_seconds: float | None = None
    """The age beyond which a partition is stale (check of a backfill's partitions)."""
    partitions_stale: int | None = None
    """Partitions not copied or proved within the age, or whose source holds rows past their
    mark (check of a backfill's partitions)."""
    partitions_past_mark: int | None = None
    """Partitions whose source range holds rows above their high-water mark: the source
    changed since, the target lacks them (check of a backfill's partitions)."""
    partitions_not_started: int | None = None
    """Partitions the ledger has no run of (check of a backfill's partitions)."""
    partition_states: dg.MarkdownMetadataValue | None = None
    """A table of every partition: status, last batch, proved at, age, rows past the mark,
    stale (check of a backfill's partitions)."""
