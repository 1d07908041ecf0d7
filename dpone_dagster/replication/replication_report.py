"""What a replication run reports: its positions, the changes applied per table, the slot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dpone_dagster.core.verification import Verification
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.schema_change import ColumnChange
from dpone_dagster.snapshot_copy.copy_report import CopyReport

from .changes import Lsn

if TYPE_CHECKING:
    from .failover import StandbySlot
    from .group_plan import ReplicationGroup
    from .sequences import SequenceSync
    from .slot_health import SlotStatus, SlotWait


@dataclass(frozen=True)
class TableChanges:
    """The source changes a run applied to one table, by kind (as the source made them: a row
    inserted then updated in one batch counts one insert and one update).

    Attributes:
        table: The table.
        inserted: Rows inserted.
        updated: Rows updated (a key change counts here).
        deleted: Rows deleted (``soft``: marked).
        truncated: ``TRUNCATE`` statements.
        schema_changes: What the run changed in the target's columns (:mod:`~dpone_dagster.
            postgres.schema_change`), in the data's transaction.
    """

    table: TableName
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    truncated: int = 0
    schema_changes: tuple[ColumnChange, ...] = ()

    @property
    def changes(self) -> int:
        """Every change of the table."""
        return self.inserted + self.updated + self.deleted + self.truncated


@dataclass(frozen=True)
class ReplicationProgress:
    """A step of a run, for ``on_progress``.

    Attributes:
        phase: ``copy`` (the initial copy starts), ``copied`` (it committed), ``joining`` (a
            table that joins a streaming group is being copied alone), ``joined`` (its copy
            committed), ``stage`` (staged changes were written to the target's staging
            tables), ``next`` (a target transaction begins on one target session while the
            one before it is applied on the other), ``apply`` (the net effect of a group of
            source transactions is being applied), ``commit`` (just before the target's
            COMMIT), ``committed`` (it committed), ``advanced`` (the slot was moved),
            ``slot_wait`` (another session holds the slot: the run waits for it, ``wait``
            says for whom and how long; reported when the wait begins and when it ends).
        transactions: Source transactions applied so far by this run.
        applied_lsn: The commit LSN of the last one committed (0: none yet).
        staged: Changes staged in the target transaction in progress.
        wait: The wait for the slot (phase ``slot_wait`` only).
    """

    phase: str
    transactions: int
    applied_lsn: Lsn
    staged: int = 0
    wait: SlotWait | None = None


@dataclass(frozen=True)
class ReplicationReport:
    """The result of :meth:`~dpone_dagster.replication.engine.Replication.run`.

    Attributes:
        group: The group.
        initial_copy: The snapshot copy's report (first run, or a resync; ``None`` otherwise).
        adopted: The initial copy took over target tables that already held rows
            (``adopt=True``).
        start_lsn: Where the run began: the ledger's applied position (the slot's consistent
            point right after an initial copy).
        applied_lsn: The commit LSN of the last source transaction applied (by this run or an
            earlier one).
        upto_lsn: The source's current LSN at the run's start: the run applied every
            transaction that committed before it, unless ``budget_reached``.
        transactions: Source transactions this run applied.
        tables: The changes applied per table, in the group's order.
        lag_bytes: The source's current LSN minus the slot's confirmed position, after the run.
        lag_seconds: How old the source state the target holds is, at the end of the run: from
            the run's read of ``upto_lsn`` (every transaction before it is applied, however
            quiet the source), or, when ``budget_reached``, from the newest applied
            transaction's commit.
        slot: The slot after its advance.
        budget_reached: The run read ``max_changes_per_run`` messages and stopped after the
            transaction that reached it: more may be waiting (the next run says).
        skipped_transactions: Transactions read again (the slot's position was behind the
            ledger's, after a crash between the target's commit and the advance) and skipped.
        tables_removed: Tables that left the group since the last run (no longer published;
            their target tables are kept as they are).
        checks: Each table's check, when the run was checked (``reconcile``, :mod:`.verify`).
        tables_joined: Tables copied alone before this run streamed (:mod:`.join`): tables that
            joined the group, and partitioned tables copied again.
        partitions_merged: New partitions whose rows this run merged into their partitioned
            table's target (:mod:`.partitions`).
        join_copies: The snapshot copies of ``tables_joined`` and ``partitions_merged``.
        sequences: Each sequence of the group's columns and what the run did to the target's
            (:mod:`.sequences`; empty with ``sequences=False``).
        standby: The source's standby's copy of the slot, read at the run's end (None without
            a standby DSN; :mod:`.failover`).
    """

    group: ReplicationGroup
    initial_copy: CopyReport | None
    start_lsn: Lsn
    applied_lsn: Lsn
    upto_lsn: Lsn
    transactions: int
    tables: tuple[TableChanges, ...]
    lag_bytes: int
    lag_seconds: float | None
    slot: SlotStatus
    budget_reached: bool
    skipped_transactions: int
    adopted: bool = False
    tables_removed: tuple[TableName, ...] = ()
    checks: Mapping[TableName, Verification] = field(default_factory=dict)
    tables_joined: tuple[TableName, ...] = ()
    partitions_merged: tuple[TableName, ...] = ()
    join_copies: tuple[CopyReport, ...] = ()
    sequences: tuple[SequenceSync, ...] = ()
    standby: StandbySlot | None = None

    @property
    def changes(self) -> int:
        """Every change applied, over all tables."""
        return sum(t.changes for t in self.tables)
