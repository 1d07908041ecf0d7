"""The stream: a run's slot read, source transaction by source transaction, into the target.

:meth:`SlotStream.run` peeks the slot up to the run's LSN (:func:`~.reader.read_messages`,
within ``max_changes_per_run``), decodes each message (a row change from its parts, with no
message object: :func:`~.pgoutput.row_change`), and gathers whole source transactions into
target transactions of about ``batch_changes`` changes. Each target transaction begins under the
group's advisory lock with the ledger's applied position (another run may have moved it), skips
every source transaction that committed at or before it, stages the others per table
(:mod:`.apply`, :mod:`.keyless`), and at its end applies their net effect, writes the new applied
position in the ledger, commits, and only then advances the slot. A table's Relation message
whose columns changed splits its batch and plans it again (:mod:`.plan`); a ``TRUNCATE`` splits it
too (:meth:`~.apply.TableApply.truncate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.sessions import Sessions
from dpone_dagster.postgres.connection import Connection, server_encoding, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.plan import TablePlan

from .apply import NetHook, StagingCopy, TableApply, evolve
from .changes import Begin, Commit, Lsn, Relation, Truncate
from .keyless import table_apply
from .pgoutput import decode, row_change
from .plan import ReplicationGroup, relation_plan
from .reader import read_messages
from .report import TableChanges
from .slot import advance_slot
from .state import GroupLedger

STAGE_EVERY = 10_000
"""Staged changes between two ``stage`` progress reports."""
_ROW_KINDS = frozenset(b"IUD")
"""The first bytes of the row change messages (insert, update, delete)."""


@dataclass
class _Target:
    """The target transaction in progress: its tables, their staging ``COPY`` and the source
    transactions it holds."""

    copy: StagingCopy
    starts: dict[TableName, Lsn] = field(default_factory=dict)  # tables that joined, and where
    tables: dict[int, TableApply] = field(default_factory=dict)
    transactions: int = 0
    staged: int = 0
    last: tuple[Lsn, Lsn, datetime] | None = None

    def close(self) -> None:
        self.copy.end()
        for table in self.tables.values():
            table.close()

    def abandon(self) -> None:
        self.copy.abandon()
        for table in self.tables.values():
            table.abandon()


@dataclass
class _Reading:
    """A peek in progress: the sessions, the target transaction open, the tables known."""

    sessions: Sessions
    control: Connection
    run: RunState
    encoding: str
    target: _Target | None = None
    skipping: bool = False
    final: Lsn = 0  # the commit LSN of the source transaction being read
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    staged_mark: int = STAGE_EVERY
    relations: dict[int, tuple[TableName, Relation]] = field(default_factory=dict)
    plans: dict[int, TablePlan] = field(default_factory=dict)


@dataclass
class RunState:
    """What a run has done so far (its applied position moves with each target commit)."""

    applied: Lsn
    applied_end: Lsn
    applied_at: datetime | None
    transactions: int = 0
    skipped: int = 0
    budget_reached: bool = False
    counts: dict[TableName, TableChanges] = field(default_factory=dict)


Progress = Callable[[str, RunState, int], None]
"""Called at each step of the stream: the phase, the run so far, the changes staged."""


class SlotStream:
    """A group's stream into the target (see the module).

    Args:
        group: The group.
        ledger: Its ledger (in the target database).
        target_dsn: The target's DSN (a broken session's staging table is dropped from a new
            one).
        batch_changes: Changes a target transaction gathers before it commits.
        record_keys: The check's record of the keys each net effect applies, or None.
        progress: Called at each step.
    """

    def __init__(
        self,
        group: ReplicationGroup,
        ledger: GroupLedger,
        *,
        target_dsn: str,
        batch_changes: int,
        record_keys: NetHook | None,
        progress: Progress,
    ) -> None:
        self.group, self.ledger, self.target_dsn = group, ledger, target_dsn
        self.batch_changes, self.record_keys = batch_changes, record_keys
        self._report = progress

    def _progress(self, phase: str, run: RunState, staged: int = 0) -> None:
        self._report(phase, run, staged)

    def run(self, sessions: Sessions, control: Connection, run: RunState, upto: Lsn) -> None:
        """Reads the slot up to ``upto`` (within the group's budget) and applies every source
        transaction after ``run``'s applied position, a target transaction at a time, each
        committed with the ledger's applied position and then confirmed to the slot; ``run``
        follows what committed."""
        src, group = sessions.source, self.group
        encoding = server_encoding(src)
        reading = _Reading(sessions, control, run, encoding)
        messages = read_messages(src, slot=group.slot, publication=group.publication,
                                 upto_lsn=upto, max_changes=group.max_changes_per_run)  # fmt: skip
        seen = 0  # every message the server output: what it counts against the budget
        try:
            for data in messages:  # the hot path: one pass per message, no message object
                seen += 1
                if data[0] not in _ROW_KINDS:
                    message = decode(data)
                    if message is not None:
                        self._control(reading, message)  # type: ignore[arg-type]
                    continue
                if reading.skipping:
                    continue
                kind, oid, new, old = row_change(data)
                target = reading.target
                assert target is not None  # a row change comes between Begin and Commit
                applying = target.tables.get(oid) or self._table(reading, oid)
                if applying is None:
                    continue
                if kind == 73:  # 'I'
                    applying.insert(new)  # type: ignore[arg-type]
                elif kind == 85:  # 'U'
                    applying.update(new, old, reading.at)  # type: ignore[arg-type]
                else:
                    applying.delete(old, reading.at)  # type: ignore[arg-type]
                target.staged += 1
                if target.staged >= reading.staged_mark:
                    reading.staged_mark += STAGE_EVERY
                    self._progress("stage", run, target.staged)
        except BaseException:
            if reading.target is not None:
                reading.target.abandon()
            raise
        self._end(reading)
        budget = group.max_changes_per_run
        run.budget_reached = budget is not None and seen >= budget

    def _control(self, reading: _Reading, message: Begin | Commit | Relation | Truncate) -> None:
        """A message other than a row change: a transaction's bounds, a table's columns, a
        ``TRUNCATE``."""
        run = reading.run
        if isinstance(message, Begin):
            reading.at = message.commit_time
            if reading.target is None:
                reading.target = self._begin(reading.sessions, run)
                reading.staged_mark = STAGE_EVERY
            reading.skipping = message.final_lsn <= run.applied
            reading.final = message.final_lsn
            run.skipped += reading.skipping
        elif isinstance(message, Commit):
            target = reading.target
            if reading.skipping or target is None:
                return
            target.transactions += 1
            target.last = (message.commit_lsn, message.end_lsn, message.commit_time)
            if target.staged >= self.batch_changes:
                self._commit(reading.sessions, reading.control, target, run)
                reading.target = None
        elif isinstance(message, Relation):
            name = TableName(message.schema, message.name)
            if name in self.group.tables:
                self._relation(message, name, (reading.relations, reading.plans),
                               reading.target, run)  # fmt: skip
        elif not reading.skipping:
            for oid in message.relations:
                truncated = self._table(reading, oid)
                if truncated is not None:
                    truncated.truncate(reading.at)

    def _end(self, reading: _Reading) -> None:
        """Commits the last target transaction (or ends one that applied nothing)."""
        target, sessions = reading.target, reading.sessions
        if target is None:
            return
        if target.transactions:
            self._commit(sessions, reading.control, target, reading.run)
            return
        target.close()
        sessions.target.rollback()
        sessions.target.autocommit = True

    def _relation(
        self,
        relation: Relation,
        name: TableName,
        known_tables: tuple[dict[int, tuple[TableName, Relation]], dict[int, TablePlan]],
        target: _Target | None,
        run: RunState,
    ) -> None:
        """A table's columns as of here: a change splits its batch and plans it again."""
        relations, plans = known_tables
        known = relations.get(relation.oid)
        relations[relation.oid] = (name, relation)
        if known is not None and known[1].columns == relation.columns:
            return
        plans.pop(relation.oid, None)
        if target is not None and relation.oid in target.tables:
            current = target.tables.pop(relation.oid)
            current.apply()
            self._count(run, current)
            current.close()

    def _table(self, reading: _Reading, oid: int) -> TableApply | None:
        """The table's apply in the target transaction (planned, and evolved, when needed)."""
        target = reading.target
        assert target is not None
        found = target.tables.get(oid)
        if found is not None:
            return found
        known = reading.relations.get(oid)
        if known is None:
            return None  # a table outside the group
        name, relation = known
        if reading.final <= target.starts.get(name, 0):
            return None  # the table joined the group after this transaction: its copy holds it
        sessions, run = reading.sessions, reading.run
        target.copy.end()  # the plan reads the target's catalog on the session
        plan = reading.plans.get(oid)
        if plan is None:
            plan = relation_plan(sessions.source, sessions.target, name, relation, self.group)
            evolve(sessions.target, plan)
            if plan.schema_changes:
                counted = run.counts.get(name) or TableChanges(name)
                run.counts[name] = replace(
                    counted, schema_changes=counted.schema_changes + plan.schema_changes
                )
            plan = replace(plan, schema_changes=())
            reading.plans[oid] = plan
        applying = table_apply(sessions.target, plan, self.group.soft_column, self.target_dsn,
                               reading.encoding, on_net=self.record_keys,
                               copy=target.copy)  # fmt: skip
        target.tables[oid] = applying
        return applying

    def _begin(self, sessions: Sessions, run: RunState) -> _Target:
        """Begins a target transaction under the group's lock; the ledger's applied position
        (another run may have moved it) decides what is skipped."""
        tgt = sessions.target
        tgt.autocommit = False  # the transaction spans the peek's messages: no with block
        set_transaction_mode(tgt, IsolationLevel.READ_COMMITTED, read_only=False)
        self.ledger.lock(tgt, self.group.slot)
        state = self.ledger.fetch(tgt, self.group.slot)
        if state is None or state.applied_lsn is None:
            raise engine_error("replication_failed", "The group's ledger row is gone.")
        if state.applied_lsn > run.applied:
            run.applied, run.applied_end = state.applied_lsn, state.applied_end_lsn or 0
            run.applied_at = state.applied_commit_time
        return _Target(StagingCopy(tgt), starts=state.starts)

    def _commit(
        self, sessions: Sessions, control: Connection, target: _Target, run: RunState
    ) -> None:
        """Applies the target transaction's net effect with the applied position, commits,
        then advances the slot."""
        tgt = sessions.target
        self._progress("apply", run, target.staged)
        for applying in target.tables.values():
            applying.apply()
            self._count(run, applying)
        target.close()
        assert target.last is not None
        self.ledger.applied(tgt, self.group.slot, target.last, target.transactions)
        self._progress("commit", run, target.staged)
        tgt.commit()
        tgt.autocommit = True
        run.applied, run.applied_end, run.applied_at = target.last
        run.transactions += target.transactions
        self._progress("committed", run)
        # Also when the run advances again right after (to its upto LSN): that second advance
        # moves the slot's restart point up to this one's, so the next peek does not decode
        # this run's WAL again.
        advance_slot(control, self.group.slot, run.applied_end)
        self._progress("advanced", run)

    @staticmethod
    def _count(run: RunState, applying: TableApply) -> None:
        name, counts = applying.plan.source, applying.counts
        before = run.counts.get(name) or TableChanges(name)
        run.counts[name] = replace(
            before, inserted=before.inserted + counts.inserted,
            updated=before.updated + counts.updated, deleted=before.deleted + counts.deleted,
            truncated=before.truncated + counts.truncated,
        )  # fmt: skip
