"""The keys more than one job writes: :class:`CommonMetadataSet` (what the asset is, what a
load did, the source read and its rates, a run's batches, a check's guarantee, the next actions)
and :class:`FailureMetadataSet` (a run's failure).
"""

import dagster as dg

from .base import DponeSet


class CommonMetadataSet(DponeSet):
    """The ``dpone/`` keys several jobs write, each declared here once: the tables an asset
    names (every spec), what a load did to its target, the source read and its rates, the lag,
    a run's batches, a check's guarantee and what to do next.

    Examples:
        >>> dict(CommonMetadataSet(rows_loaded=3, sink="merge"))
        {'dpone/sink': 'merge', 'dpone/rows_loaded': 3}
        >>> CommonMetadataSet.extract({"dpone/cursor": "id", "other/key": 1}).cursor
        'id'
    """

    # What the asset is.
    source_table: str | None = None
    """Exact qualified name of the source table (copy; spec of every PostgreSQL asset)."""
    description: str | None = None
    """The source table's ``COMMENT ON TABLE``, when it has one (copy, partition,
    incremental); its columns' comments are the column schema's descriptions."""
    table: str | None = None
    """Exact qualified name of the target table (copy; spec; a source table's external asset
    names itself)."""
    cursor: str | None = None
    """The cursor column of a backfill or an incremental stream (spec)."""
    sink: str | None = None
    """``replace``, ``append`` or ``merge`` (copy, generic; spec of a snapshot copy)."""
    source: str | None = None
    """What a generic copy read, without secrets (generic)."""

    # What a load did to its target.
    sink_method: str | None = None
    """What the sink did: ``create``, ``swap``, ``rewrite``, ``append``, ``merge`` (copy,
    generic)."""
    terminal_outcome: str | None = None
    """``success``, ``abort`` or ``retain_commit_unknown`` (copy, generic, failure of a
    copy)."""
    snapshot_label: str | None = None
    """What the rows are a snapshot of: ``single_snapshot``; for a partition also
    ``several_snapshots``, ``several_snapshots_reconciled`` or ``repaired_to_one_snapshot``;
    for a stream's run ``several_snapshots`` or ``no_rows_copied``; ``no_snapshot_claim`` for a
    generic copy (every materialization)."""
    rows_loaded: int | None = None
    """Rows the target took (copy; replication: its initial copy)."""
    rows_inserted: int | None = None
    """Rows the target gained (copy, incremental); inserts applied (replication)."""
    rows_updated: int | None = None
    """Rows a merge updated because a value changed (copy, incremental); updates applied
    (replication)."""
    rows_deleted: int | None = None
    """Rows deleted, or marked deleted (incremental, replication); deleted by a tombstone
    (kafka)."""
    schema_changes: dg.JsonMetadataValue | None = None
    """What the load changed in the target's schema, one entry per column (copy, generic,
    incremental; only when it changed)."""
    types_created: dg.JsonMetadataValue | None = None
    """The user-defined types the load created in the target for the table, in creation order:
    ``type``, ``kind`` (enum, domain, composite, range), ``definition`` (copy, incremental,
    partition; only when it created any)."""
    enum_labels_added: dg.JsonMetadataValue | None = None
    """The labels the load added to the target's enums (the source gained them): ``type``,
    ``label``, ``before`` (the label it went before; null at the end) (copy, incremental,
    partition; only when it added any)."""
    extensions_created: dg.JsonMetadataValue | None = None
    """The extensions the load created in the target (named in ``create_extensions``):
    ``extension``, ``version``, ``schema``, ``source_version`` (copy, incremental, partition;
    only when it created any)."""
    virtual_as_stored: dg.JsonMetadataValue | None = None
    """The source's ``VIRTUAL`` generated columns that the created target (a server before
    PostgreSQL 18) defines as ``STORED``, same values: ``column``, ``source``, ``target`` (copy,
    incremental, partition; only then)."""

    # The source read and its receipt.
    extraction_started_at: str | None = None
    """Start of the source read, ISO 8601 (copy, partition: its first batch)."""
    extraction_completed_at: str | None = None
    """End of the source read, ISO 8601 (copy, partition: its last batch)."""
    snapshot_token_digest: str | None = None
    """Digest of the snapshot token, never the token; a JSON list of digests when several
    snapshots were read (copy, partition, incremental)."""
    extraction_receipt: dg.JsonMetadataValue | None = None
    """The extraction's receipt (copy, generic)."""
    bytes: int | None = None
    """Bytes read from the source (copy, partition, generic)."""
    extraction_seconds: float | None = None
    """Seconds of the source read window: first batch start to last batch end for a partition
    (copy, partition, generic)."""
    rows_per_second: int | None = None
    """Rows over the read window, rounded to a whole row (copy, partition, generic)."""
    lag_seconds: float | None = None
    """How old the source state the target now holds is: the seconds from the start of the read
    the target now reflects (a partition: its newest batch; a stream: the newest mark, taken by
    this run even when it found nothing new; a replication group: its read of the source's LSN,
    or the newest applied commit when the budget stopped it) to the report (copy, partition,
    generic, incremental, kafka, replication; the ``dpone_fresh`` check judges it)."""

    # A run's batches and receipts (a backfill partition's, a stream's run).
    batches: int | None = None
    """Batches committed by every run of the partition, or of the stream's run (partition,
    incremental)."""
    batches_committed_now: int | None = None
    """Batches this step committed (partition, incremental)."""
    receipts_summary: dg.JsonMetadataValue | None = None
    """What the batch receipts add up to: first/last cursor, bytes, snapshots, apply paths
    (partition, incremental)."""
    stream_id: str | None = None
    """The stream: ``incremental:<digest>`` of its source, target, cursor and key
    (incremental); ``topic -> schema.table`` (kafka)."""
    run: int | None = None
    """The stream's run number, 0 when there was nothing to do (incremental, kafka)."""

    # What a check proved.
    guarantee: str | None = None
    """What the check proves (check)."""
    proved_at: dg.TimestampMetadataValue | None = None
    """The point in time the check proved equality at: its source snapshot's time (check of a
    stream, check of a snapshot copy)."""

    # What to do next (a failure, a check that does not pass).
    next_actions: dg.MarkdownMetadataValue | None = None
    """What the person on call can do next (failure)."""


class FailureMetadataSet(DponeSet):
    """A run's failure (:class:`~dpone_dagster.DponeFailure`): its stable code, beside the
    next actions (``dpone/next_actions``, :class:`CommonMetadataSet`'s: a check names them too).
    """

    error_code: str | None = None
    """The stable error code, for alerting rules (failure)."""
