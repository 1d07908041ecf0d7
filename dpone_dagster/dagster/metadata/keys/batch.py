"""A committed batch's observation: :class:`BatchMetadataSet`."""

from .base import DponeSet


class BatchMetadataSet(DponeSet):
    """The ``dpone/progress_*`` keys of a committed batch's observation (a backfill
    partition's or an incremental stream's): names of their own, so the UI plots a batch's
    progress apart from the materialization's figures instead of beside them.
    """

    progress_batch: int | None = None
    """The committed batch's sequence number (batch of a partition or of a stream)."""
    progress_run: int | None = None
    """The stream's run the batch belongs to (batch of a stream)."""
    progress_rows: int | None = None
    """Rows the stream's batch read (batch of a stream)."""
    progress_copied: int | None = None
    """Rows the partition's batches copied so far (batch of a partition)."""
    progress_checkpoint: str | None = None
    """The batch's checkpoint (batch of a partition); the newest cursor value it copied
    (batch of a stream)."""
    progress_high_water_mark: str | None = None
    """The mark the partition copies up to (batch of a partition)."""
    progress_remaining: int | None = None
    """Rows of the partition's scope not yet accounted for (batch of a partition)."""
    progress_replayed: bool | None = None
    """The batch had been committed already and was answered by replay (batch of a
    partition)."""
