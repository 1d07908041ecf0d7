"""A replication group's keys: :class:`ReplicationMetadataSet` (its spec and each table's run)
and :class:`SlotMetadataSet` (the state of its slot).
"""

import dagster as dg

from .base import DponeSet


class ReplicationMetadataSet(DponeSet):
    """A replication group's own ``dpone/`` keys, on its specs and each table's
    materialization (one per table of the group; the group's figures are the same on every
    table).
    """

    slot: str | None = None
    """The group's logical replication slot (spec of a replicated table, replication, check of
    a slot)."""
    publication: str | None = None
    """The group's publication (spec of a replicated table, replication)."""
    cron_schedule: str | None = None
    """The schedule the group runs on, as ``replication_assets(cron_schedule=...)`` was given
    it: its freshness policy and ``replication_schedule`` follow from it (spec of a replicated
    table)."""
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
    upto_lsn: str | None = None
    """The source's LSN when the run started: the run applies nothing committed after it
    (replication)."""
    budget_reached: bool | None = None
    """The run stopped at ``max_changes_per_run`` with changes left before ``upto_lsn``: the
    next run goes on (replication)."""
    initial_copy: bool | None = None
    """The run copied the tables first, under the snapshot the slot was created with (the first
    run, or a resync) (replication)."""
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


class SlotMetadataSet(DponeSet):
    """The state of a replication group's slot, on each table's materialization and its
    ``dpone_slot_healthy`` check (the slot's name: ``dpone/slot``,
    :class:`ReplicationMetadataSet`'s).
    """

    lag_bytes: int | None = None
    """WAL the target is behind by after the run: the source's current LSN minus the slot's
    confirmed position, in bytes (replication, check of a slot)."""
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
