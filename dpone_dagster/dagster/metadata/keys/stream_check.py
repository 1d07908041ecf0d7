"""The ``dpone_reconciled`` check of a stream (an incremental stream's run, a replicated
table's): :class:`StreamCheckMetadataSet`.
"""

import dagster as dg

from .base import DponeSet


class StreamCheckMetadataSet(DponeSet):
    """The ``dpone/`` keys of a stream's verification (incremental streams and replicated
    tables verify the same way: :mod:`dpone_dagster.core.verification`): its scope, what it
    compared, what differed and why, what it repaired, the position it proved.
    """

    applied_lsn: str | None = None
    """Commit LSN of the newest source transaction the target holds, ``X/Y`` (replication; on
    its check: the position the check proved the target at)."""
    verified: bool | None = None
    """Whether anything was verified: false when nothing ran (check of a stream)."""
    keys_compared: int | None = None
    """Keys that crossed the wire, both sides (incremental, check of a stream)."""
    ranges_differing: int | None = None
    """Key ranges whose digests differed (check of a stream)."""
    changed_since_mark: int | None = None
    """Rows that differ because the source changed them after the mark (check of a
    stream)."""
    changed_after_applied: int | None = None
    """Keys that differ because a change to them committed after the applied position
    (``dpone/applied_lsn``): still in the slot, left to the next run (check of a replicated
    table)."""
    deleted_kept: int | None = None
    """Target rows whose key the source lost, kept under ``deletes="ignore"`` (check of a
    stream)."""
    unexplained: int | None = None
    """Rows that differ for no reason the stream knows: the check fails (check of a
    stream)."""
    examples: dg.JsonMetadataValue | None = None
    """Keys of some differing rows (check of a stream)."""
    check_scope: str | None = None
    """``run`` (the run's keys and a slice of the rolling sweep), ``full`` (both whole
    tables) or ``table`` (a replicated table without a primary key, compared whole by its
    digest) (check of a stream)."""
    keys_checked: int | None = None
    """The run's keys verified exactly: source rows in the run's cursor range, or the keys the
    replication runs applied since the last check (check of a stream, ``run``)."""
    ranges_checked: int | None = None
    """Key ranges of the rolling sweep verified by this run (check of a stream, ``run``)."""
    ranges_total: int | None = None
    """Key ranges a full sweep takes: the longest a range waits to be verified, in runs (check
    of a stream, ``run``)."""
    rows_swept: int | None = None
    """Source rows in the ranges verified, about (check of a stream, ``run``)."""
    sweep_started_at: str | None = None
    """When the sweep in progress began, ISO 8601; left out when this run completed one (check of
    a stream, ``run``)."""
    swept_at: str | None = None
    """When the last clean full sweep completed, ISO 8601; left out until one has (check of a
    stream, ``run``)."""
    check_seconds: float | None = None
    """What the check's comparisons took (the run's keys and the sweep's slice, or both whole
    tables): its own cost, which follows the run's changes (check of a stream)."""
    differing_ranges: dg.JsonMetadataValue | None = None
    """The sweep's key ranges in which the check found rows differing for no known reason, each
    ``{"after": key, "through": key}`` (a key as the text of its columns; ``null``: open) (check
    of a stream, ``run``)."""
    repaired_keys: int | None = None
    """Keys the run rewrote from the source because its check found them differing
    (``repair=True``) (check of a stream)."""
    repaired_rows: int | None = None
    """Target rows those repairs wrote: inserted, updated, deleted (check of a stream)."""
    repaired_ranges: dg.JsonMetadataValue | None = None
    """The sweep's key ranges the repaired keys lay in, as ``differing_ranges`` (check of a
    stream)."""
