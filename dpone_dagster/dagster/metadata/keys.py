"""Every ``dpone/`` key of metadata, declared once: :class:`DponeMetadataSet` (metadata of asset
specs, materializations, observations, checks and failures), one field per key, typed as its
value is and documented by its docstring (the docs' metadata reference is generated from them:
:func:`~dpone_dagster.dagster.metadata.sets.markdown_reference`).
"""

from typing import Any

import dagster as dg

# No public name in dagster 1.13 (dagster.NamespacedMetadataSet is absent): this is the
# module Dagster's own TableMetadataSet and its integrations' sets come from.
from dagster._core.definitions.metadata import NamespacedMetadataSet
from pydantic import ConfigDict, model_validator

NAMESPACE = "dpone"
"""The namespace of every key of dpone's own."""


def readable_number(name: str, value: Any) -> Any:
    """``value`` of the field ``name`` rounded to what it means: seconds (``lag_seconds``,
    ``seconds_load``) to the millisecond, a rate (``rows_per_second``) to a whole number; any
    other value as it is.

    Examples:
        >>> readable_number("extraction_seconds", 0.01573760400003721)
        0.016
        >>> readable_number("rows_per_second", 61879.27353732867)
        61879
    """
    if not isinstance(value, float):
        return value
    if name.endswith("_per_second"):
        return round(value)
    if name.startswith("seconds_") or name.endswith("_seconds"):
        return round(value, 3)
    return value


class DponeMetadataSet(NamespacedMetadataSet):
    """dpone's metadata, one field per ``dpone/`` key (each unset field is left out).

    Examples:
        >>> dict(DponeMetadataSet(rows_loaded=3, sink="merge"))
        {'dpone/sink': 'merge', 'dpone/rows_loaded': 3}
        >>> DponeMetadataSet.extract({"dpone/cursor": "id", "other/key": 1}).cursor
        'id'
    """

    # Strict: a value of another type than the declared one (a bool where a count is declared,
    # a number where text is) fails where the metadata is built instead of changing its type.
    model_config = ConfigDict(strict=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _readable(cls, values: Any) -> Any:
        """What a person reads: an empty text is left out rather than shown as ``""``, seconds
        are rounded to the millisecond and a rate to a whole number (:func:`readable_number`)."""
        if not isinstance(values, dict):
            return values
        return {
            name: readable_number(name, value)
            for name, value in values.items()
            if value is not None and value != ""
        }

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
    on_changed: str | None = None
    """``fail`` or ``repair``: what a backfill's reconciliation does with rows changed after
    their batch (spec)."""
    strategy: str | None = None
    """The extraction strategy (copy; spec of a snapshot copy)."""
    sink: str | None = None
    """``replace``, ``append`` or ``merge`` (copy, generic; spec of a snapshot copy)."""
    source: str | None = None
    """What a generic copy read, without secrets (generic)."""

    # How a table was copied.
    sink_method: str | None = None
    """What the sink did: ``create``, ``swap``, ``rewrite``, ``append``, ``merge`` (copy,
    generic)."""
    copy_format: str | None = None
    """``binary`` or ``text`` COPY (copy)."""
    copy_format_reason: str | None = None
    """Why the rows moved as text, when they did (copy)."""
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
    terminal_receipt: dg.JsonMetadataValue | None = None
    """The artifact's terminal receipt (copy)."""
    seconds_plan: float | None = None
    """Seconds of the copy's plan step, all tables of one snapshot copy together (copy)."""
    seconds_extract: float | None = None
    """Seconds of the copy's extract step (copy)."""
    seconds_load: float | None = None
    """Seconds of the copy's load step (copy)."""

    # The source read and its receipt.
    extraction_started_at: str | None = None
    """Start of the source read, ISO 8601 (copy, partition: its first batch)."""
    extraction_completed_at: str | None = None
    """End of the source read, ISO 8601 (copy, partition: its last batch)."""
    clock_authority: str | None = None
    """The clock that issued the read window's timestamps (copy)."""
    snapshot_authority: str | None = None
    """What issued the snapshot (copy)."""
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
    cursor_lag_seconds: float | None = None
    """For a stream with a time cursor, the source clock at the newest mark minus the newest
    cursor value copied: how far the newest change copied is behind the mark; it grows while
    the table has no writes (incremental)."""

    # A backfill partition and its batches.
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
    batches: int | None = None
    """Batches committed by every run of the partition, or of the stream's run (partition,
    incremental)."""
    batches_committed_now: int | None = None
    """Batches this step committed (partition, incremental)."""
    batches_replayed_now: int | None = None
    """Batches this step found committed already, answered by replay (partition)."""
    receipts_summary: dg.JsonMetadataValue | None = None
    """What the batch receipts add up to: first/last cursor, bytes, snapshots, apply paths
    (partition, incremental)."""
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

    # An incremental stream's run.
    stream_id: str | None = None
    """The stream: ``incremental:<digest>`` of its source, target, cursor and key
    (incremental); ``topic -> schema.table`` (kafka)."""
    run: int | None = None
    """The stream's run number, 0 when there was nothing to do (incremental, kafka)."""
    rows_read: int | None = None
    """Rows the run read from the source (incremental)."""
    rows_deleted: int | None = None
    """Rows deleted, or marked deleted (incremental, replication); deleted by a tombstone
    (kafka)."""
    old_mark: str | None = None
    """The mark the run started from (incremental)."""
    new_mark: str | None = None
    """The mark the run copied up to (incremental)."""
    resumed: bool | None = None
    """The run continued one begun earlier: a crash, a retry, a concurrent run
    (incremental)."""
    notices: dg.JsonMetadataValue | None = None
    """What the run warned about, each with its code (incremental, when there was any)."""

    # A replication group's run (one per table of the group; the slot's figures are the
    # group's, the same on every table).
    slot: str | None = None
    """The group's logical replication slot (spec of a replicated table, replication, check of
    a slot)."""
    publication: str | None = None
    """The group's publication (spec of a replicated table, replication)."""
    cron_schedule: str | None = None
    """The schedule the group runs on, as ``replication_assets(cron_schedule=...)`` was given
    it: its freshness policy and ``replication_schedule`` follow from it (spec of a replicated
    table)."""
    lag_bytes: int | None = None
    """WAL the target is behind by after the run: the source's current LSN minus the slot's
    confirmed position, in bytes (replication, check of a slot)."""
    transactions: int | None = None
    """Source transactions the run applied, every table of the group together
    (replication)."""
    transactions_skipped: int | None = None
    """Source transactions the run read again and skipped because the ledger already held them
    (replication)."""
    truncates: int | None = None
    """``TRUNCATE`` statements of the source the run applied to the table, each emptying it
    (replication)."""
    rows_truncated: int | None = None
    """Deprecated (removed in the next release): the same count as ``dpone/truncates``, under a
    name that said rows; read ``dpone/truncates`` (replication)."""
    applied_lsn: str | None = None
    """Commit LSN of the newest source transaction the target holds, ``X/Y`` (replication; on
    its check: the position the check proved the target at)."""
    upto_lsn: str | None = None
    """The source's LSN when the run started: the run applies nothing committed after it
    (replication)."""
    budget_reached: bool | None = None
    """The run stopped at ``max_changes_per_run`` with changes left before ``upto_lsn``: the
    next run goes on (replication)."""
    initial_copy: bool | None = None
    """The run copied the tables first, under the snapshot the slot was created with (the first
    run, or a resync) (replication)."""
    wal_status: str | None = None
    """The slot's ``wal_status``: ``reserved``, ``extended``, ``unreserved`` or ``lost``
    (replication, check of a slot)."""
    safe_wal_size: int | None = None
    """Bytes of WAL that can still be written before the slot is at risk of being lost
    (``max_slot_wal_keep_size``); left out when that setting is unlimited (replication, check
    of a slot)."""
    retained_wal_bytes: int | None = None
    """WAL the slot keeps on the source's disk: the current LSN minus its ``restart_lsn``
    (replication, check of a slot)."""
    retained_wal_warn_bytes: int | None = None
    """The retained WAL above which ``dpone_slot_healthy`` warns (check of a slot)."""
    slot_held_seconds: float | None = None
    """How long the oldest open transaction holding the slot's WAL back has been open, 0 when
    none holds it (replication, check of a slot; left out when the source role may not read
    other sessions' activity, ``pg_read_all_stats``)."""
    slot_held_by: dg.JsonMetadataValue | None = None
    """The open transactions on the source that hold the slot's WAL back, oldest first: each
    one's pid, database, user, application, state, transaction start and age, and the start of
    its last statement with its literals masked (replication, check of a slot; only then)."""
    slot_failover: bool | None = None
    """The slot is a failover slot, which the source synchronizes to its standbys set up for it
    (replication, check of a slot; left out before PostgreSQL 17)."""
    standby_holds_slot: bool | None = None
    """The source's standby (``PostgresSourceResource.standby_dsn``) holds a synchronized copy
    of the slot that its promotion keeps: the group would go on from it (check of a slot; only
    with a standby)."""
    standby_slot_lag_bytes: int | None = None
    """How far the standby's copy of the slot trails the primary's, in bytes of WAL: what a run
    after a failover reads again and skips (check of a slot; only with a standby holding a
    copy)."""
    tables_joined: dg.JsonMetadataValue | None = None
    """Tables the run copied alone before it streamed: tables that joined the group, and
    partitioned tables copied again after a partition left (replication, when there was any)."""
    tables_left: dg.JsonMetadataValue | None = None
    """Tables that left the group this run: no longer published nor applied, their target
    tables kept as they are (replication, when there was any)."""
    partitions_merged: dg.JsonMetadataValue | None = None
    """New partitions of a partitioned table whose rows the run merged into its target
    (replication, when there was any)."""
    sequences: dg.JsonMetadataValue | None = None
    """The table's sequences (identity and ``serial`` columns): each one's column, target
    sequence, status (``advanced``, ``current``, ``created``, ``unused``, ``unreadable``,
    ``missing``), source and target value (replication, when the table has any)."""

    # A Kafka stream's run.
    topic: str | None = None
    """The Kafka topic copied (kafka; spec of a Kafka copy)."""
    messages: int | None = None
    """Messages the run read: rows and dead letters (kafka)."""
    kafka_partitions: dg.JsonMetadataValue | None = None
    """Per partition: the offset the run started at, the end the broker reported, the first and
    last offset read, the next offset, the messages, whether it was new (kafka)."""
    dead_letters: int | None = None
    """Messages written to the dead-letter table instead of the target (kafka)."""
    dead_letter_table: str | None = None
    """Where messages that cannot be loaded go (kafka; spec of a Kafka copy, when set)."""
    offsets_lost: dg.JsonMetadataValue | None = None
    """Per partition restarted by ``on_lost_offsets="earliest"``: ``[ledger offset, restart
    offset]``, the broker no longer holding the first (kafka, only then)."""
    group_commit_error: str | None = None
    """Why publishing the offsets to the consumer group failed; monitoring only, the ledger
    holds them (kafka, only then)."""

    # A committed batch's observation: names of its own, so the UI plots a batch's progress
    # apart from the materialization's figures instead of beside them.
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

    # The dpone_reconciled check.
    guarantee: str | None = None
    """What the check proves (check)."""
    proof: str | None = None
    """Which prover proved it: row versions or a content hash (check of a copy)."""
    source_rows: int | None = None
    """Rows the source held in the snapshot (check of a copy)."""
    target_rows: int | None = None
    """Rows the target holds (check of a copy)."""
    source_digest: str | None = None
    """The source's content digest (check of a copy)."""
    target_digest: str | None = None
    """The target's content digest (check of a copy)."""
    partitions: dg.JsonMetadataValue | None = None
    """Each partition's reconciliation summary (check of a backfill)."""
    partitions_checked: int | None = None
    """Partitions the run checked (check of a backfill)."""
    partitions_differing: int | None = None
    """Partitions whose target differs from the source at the mark (check of a backfill)."""
    ranges_proven: int | None = None
    """Checkpoint ranges proven equal, every partition together (check of a backfill)."""
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
    proved_at: dg.TimestampMetadataValue | None = None
    """The point in time the check proved equality at: its source snapshot's time (check of a
    stream, check of a snapshot copy)."""
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

    # The dpone_fresh check of a stream, and the dpone_partitions_fresh check of a backfill.
    fail_after_seconds: float | None = None
    """The lag beyond which the freshness policy fails, now (check of a stream's freshness)."""
    warn_after_seconds: float | None = None
    """The lag beyond which the freshness policy warns, when it has a warn window (check of a
    stream's freshness)."""
    freshness_policy: str | None = None
    """The policy judged, in words (check of a stream's freshness)."""
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

    # A run's failure.
    error_code: str | None = None
    """The stable error code, for alerting rules (failure)."""
    next_actions: dg.MarkdownMetadataValue | None = None
    """What the person on call can do next (failure)."""

    @classmethod
    def namespace(cls) -> str:
        """``dpone``."""
        return NAMESPACE
