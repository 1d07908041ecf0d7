"""An incremental stream's keys: :class:`IncrementalMetadataSet`."""

import dagster as dg

from .base import DponeSet


class IncrementalMetadataSet(DponeSet):
    """An incremental run's own ``dpone/`` keys: its marks, what it read, whether it
    resumed, what it warned about.
    """

    cursor_lag_seconds: float | None = None
    """For a stream with a time cursor, the source clock at the newest mark minus the newest
    cursor value copied: how far the newest change copied is behind the mark; it grows while
    the table has no writes (incremental)."""
    rows_read: int | None = None
    """Rows the run read from the source (incremental)."""
    old_mark: str | None = None
    """The mark the run started from (incremental)."""
    new_mark: str | None = None
    """The mark the run copied up to (incremental)."""
    resumed: bool | None = None
    """The run continued one begun earlier: a crash, a retry, a concurrent run
    (incremental)."""
    notices: dg.JsonMetadataValue | None = None
    """What the run warned about, each with its code (incremental, when there was any)."""
