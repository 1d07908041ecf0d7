"""The stream: a run's slot read, source transaction by source transaction, into the target.

:meth:`SlotStream.run` holds the group's advisory lock for its session (another run of the group
waits for it, as long as its ``lock_wait``), peeks the slot up to the run's LSN
(:func:`~.reader.read_messages`, within ``max_changes_per_run``), decodes each message (a row
change from its parts, with no message object: :func:`~.pgoutput.row_change`), and gathers whole
source transactions into target transactions of about ``batch_changes`` changes. Every source
transaction that committed at or before the ledger's applied position is skipped; the others
are staged per table (:mod:`.apply`, :mod:`.keyless`), and at a target transaction's end their
net effect is applied, the new applied position written in the ledger, the transaction
committed, and only then the slot advanced.

The apply is pipelined: a target transaction's apply runs on the apply worker's thread
(:mod:`.worker`) while this thread reads and decodes the next source transactions, holding
their staged rows in memory (:attr:`~.apply.TableApply.deferred`, at most
:data:`BUFFER_BYTES`). The next target transaction begins on the session once the worker is
done with it: its held rows are written into staging and the rest streamed there. It begins at
once, waiting for the worker, where the session is needed mid-transaction: a table's first
change (its plan reads the target's catalog, and may evolve it in that transaction), a
Relation message whose columns changed (it splits its table's batch and plans it again,
:mod:`.plan`), a ``TRUNCATE`` (:meth:`~.apply.TableApply.truncate`), or more held rows than
:data:`BUFFER_BYTES` (a large source transaction streams through staging in bounded memory).
Each source transaction is still applied whole in one target transaction, each target
transaction commits with its applied position and before the slot moves, in the stream's order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.sessions import Sessions, hold_advisory_lock, release_advisory_lock
from dpone_dagster.postgres.connection import Connection, server_encoding, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.lock_wait import lock_wait_of
from dpone_dagster.postgres.plan import TablePlan

from .apply import NetHook, StagingCopy, TableApply, evolve
from .changes import Begin, Commit, Lsn, Relation, Truncate
from .keyless import table_apply
from .pgoutput import RowChange, decode, new_tuple_text, row_change
from .plan import ReplicationGroup, relation_plan
from .reader import read_messages
from .report import TableChanges
from .slot import advance_slot
from .slot_health import SlotWait
from .state import GroupLedger
from .worker import ApplyWorker

STAGE_EVERY = 10_000
"""Staged changes between two ``stage`` progress reports (and two looks at the rows held in
memory)."""
BUFFER_BYTES = 48 << 20
"""Staged rows a target transaction holds in memory while the worker applies the one before;
past it, it waits for the worker and streams into staging."""
_ROW_KINDS = frozenset(b"IUD")
_OID = struct.Struct(">I").unpack_from
"""A row change's table OID (after its kind byte)."""
"""The first bytes of the row change messages (insert, update, delete)."""


@dataclass
class _Target:
    """A target transaction: its tables, their staging ``COPY`` and the source transactions
    it holds. ``begun``: open on the session (else its staged rows are held in memory)."""

    copy: StagingCopy
    tables: dict[int, TableApply] = field(default_factory=dict)
    transactions: int = 0
    staged: int = 0
    last: tuple[Lsn, Lsn, datetime] | None = None
    begun: bool = False

    def held(self) -> int:
        """Bytes of staged rows held in memory."""
        return sum(table.buffered for table in self.tables.values())

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
    """A peek in progress: the sessions, the target transaction being staged, the tables
    known, the worker applying the one before."""

    sessions: Sessions
    control: Connection
    run: RunState
    encoding: str
    worker: ApplyWorker = field(default_factory=ApplyWorker)
    target: _Target | None = None
    skipping: bool = False
    final: Lsn = 0  # the commit LSN of the source transaction being read
    starts: Mapping[TableName, Lsn] = field(default_factory=dict)  # tables that joined, and where
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
"""Called at each step of the stream: the phase, the run so far, the changes staged (from the
apply worker's thread for the phases of a target transaction's apply)."""
Waiting = Callable[[SlotWait], None]
"""Called when another run holds the group (the wait's start and end)."""


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
        on_wait: Called when another run holds the group: its wait begins and ends.
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
        on_wait: Waiting | None = None,
    ) -> None:
        self.group, self.ledger, self.target_dsn = group, ledger, target_dsn
        self.batch_changes, self.record_keys = batch_changes, record_keys
        self._report, self._on_wait = progress, on_wait

    def _progress(self, phase: str, run: RunState, staged: int = 0) -> None:
        self._report(phase, run, staged)

    def run(self, sessions: Sessions, control: Connection, run: RunState, upto: Lsn) -> None:
        """Reads the slot up to ``upto`` (within the group's budget) and applies every source
        transaction after the ledger's applied position, a target transaction at a time, each
        committed with the ledger's applied position and then confirmed to the slot; ``run``
        follows what committed.

        Raises:
            EngineError: ``replication_slot_active`` when another run holds the group past the
                session's ``lock_wait``; the codes of the peek and of the apply.
        """
        tgt, key = sessions.target, self.ledger.lock_key(self.group.slot)
        self._hold(tgt, key)
        starts = self._applied(tgt, run)
        reading = _Reading(sessions, control, run, server_encoding(sessions.source),
                           starts=starts)  # fmt: skip
        try:
            seen = self._read(reading, upto)
            self._end(reading)
        except BaseException:
            reading.worker.stop(tgt)
            if reading.target is not None:
                reading.target.abandon()
            raise
        finally:
            reading.worker.close()
        release_advisory_lock(tgt, key)
        budget = self.group.max_changes_per_run
        run.budget_reached = budget is not None and seen >= budget

    def _hold(self, tgt: Connection, key: str) -> None:
        """Holds the group's lock for the session: no other run applies while this one
        stages (its skips are decided by the applied position read under it). A wait for
        another run that holds it is reported as a wait for the slot (:class:`~.slot_health.
        SlotWait`)."""
        slot, timeout = self.group.slot, lock_wait_of(tgt)
        holder: list[int | None] = []

        def waiting(pid: int) -> None:
            holder.append(pid or None)
            self._wait(SlotWait(slot, holder[0], timeout))

        def busy(pid: int) -> Exception:
            self._wait(SlotWait(slot, pid or None, timeout, timeout, done=True))
            return engine_error(
                "replication_slot_active",
                f"Replication slot {slot!r} is being applied by another run (its target "
                f"session's pid is {pid}); nothing was changed.",
            )

        waited = hold_advisory_lock(tgt, key, timeout=timeout, timed_out=busy, on_wait=waiting)
        if holder:
            self._wait(SlotWait(slot, holder[0], timeout, waited, done=True, released=True))

    def _wait(self, wait: SlotWait) -> None:
        if self._on_wait is not None:
            self._on_wait(wait)

    def _applied(self, tgt: Connection, run: RunState) -> Mapping[TableName, Lsn]:
        """``run`` from the ledger's applied position (another run may have moved it); the
        tables that joined the group, each with the position its copy holds the source at."""
        state = self.ledger.fetch(tgt, self.group.slot)
        if state is None or state.applied_lsn is None:
            raise engine_error("replication_failed", "The group's ledger row is gone.")
        if state.applied_lsn > run.applied:
            run.applied, run.applied_end = state.applied_lsn, state.applied_end_lsn or 0
            run.applied_at = state.applied_commit_time
        return state.starts

    def _read(self, reading: _Reading, upto: Lsn) -> int:
        """Stages every message of the peek; the messages the server output (what it counts
        against the budget)."""
        group, run = self.group, reading.run
        messages = read_messages(reading.sessions.source, slot=group.slot,
                                 publication=group.publication, upto_lsn=upto,
                                 max_changes=group.max_changes_per_run)  # fmt: skip
        seen = 0
        for data in messages:  # the hot path: one pass per message, no message object
            seen += 1
            if data[0] not in _ROW_KINDS:
                message = decode(data)
                if message is not None:
                    self._control(reading, message)  # type: ignore[arg-type]
                continue
            if reading.skipping:
                continue
            target = reading.target
            assert target is not None  # a row change comes between Begin and Commit
            oid = _OID(data, 1)[0]
            applying = target.tables.get(oid) or self._table(reading, oid)
            if applying is None:
                continue
            kind = data[0]
            body = None if kind == 68 else new_tuple_text(data, applying.width)  # 68: 'D'
            if body is not None:
                applying.stage_new(kind, body)
            else:
                self._stage(applying, row_change(data), reading.at)
            target.staged += 1
            if target.staged >= reading.staged_mark:
                reading.staged_mark += STAGE_EVERY
                self._progress("stage", run, target.staged)
                if not target.begun and target.held() > BUFFER_BYTES:
                    self._begin_now(reading)
        return seen

    @staticmethod
    def _stage(applying: TableApply, change: RowChange, at: datetime) -> None:
        """Stages a row change from its decoded values (a NULL, an unchanged TOASTed value,
        text ``COPY`` escapes, an old key or row)."""
        kind, _, new, old = change
        if kind == 73:  # 'I'
            applying.insert(new)  # type: ignore[arg-type]
        elif kind == 85:  # 'U'
            applying.update(new, old, at)  # type: ignore[arg-type]
        else:
            applying.delete(old, at)  # type: ignore[arg-type]

    def _control(self, reading: _Reading, message: Begin | Commit | Relation | Truncate) -> None:
        """A message other than a row change: a transaction's bounds, a table's columns, a
        ``TRUNCATE``."""
        run = reading.run
        if isinstance(message, Begin):
            reading.at = message.commit_time
            if reading.target is None:
                reading.target = _Target(StagingCopy(reading.sessions.target))
                reading.staged_mark = STAGE_EVERY
                if not reading.worker.busy:  # the session is free: stage into it at once
                    self._begin_now(reading)
                else:
                    self._progress("hold", run)
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
                self._submit(reading, target)
                reading.target = None
        elif isinstance(message, Relation):
            name = TableName(message.schema, message.name)
            if name in self.group.tables:
                self._relation(reading, message, name)
        elif not reading.skipping:
            for oid in message.relations:
                truncated = self._table(reading, oid)
                if truncated is not None:
                    self._begin_now(reading)
                    truncated.truncate(reading.at)

    def _end(self, reading: _Reading) -> None:
        """Commits the last target transaction (or ends one that applied nothing), then waits
        for the worker."""
        target, reading.target = reading.target, None
        if target is not None and target.transactions:
            self._submit(reading, target)
        elif target is not None and target.begun:
            reading.worker.wait()
            target.close()
            reading.sessions.target.rollback()
            reading.sessions.target.autocommit = True
        reading.worker.wait()

    def _relation(self, reading: _Reading, relation: Relation, name: TableName) -> None:
        """A table's columns as of here: a change splits its batch and plans it again."""
        known = reading.relations.get(relation.oid)
        reading.relations[relation.oid] = (name, relation)
        if known is not None and known[1].columns == relation.columns:
            return
        reading.plans.pop(relation.oid, None)
        target = reading.target
        if target is not None and relation.oid in target.tables:
            self._begin_now(reading)
            current = target.tables.pop(relation.oid)
            current.apply()
            self._count(reading.run, current)
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
        if reading.final <= reading.starts.get(name, 0):
            return None  # the table joined the group after this transaction: its copy holds it
        sessions, run = reading.sessions, reading.run
        plan = reading.plans.get(oid)
        if plan is None:
            self._begin_now(reading)  # the plan reads the target's catalog, and may evolve it
            target.copy.end()
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
                               reading.encoding, on_net=self.record_keys, copy=target.copy,
                               deferred=not target.begun)  # fmt: skip
        target.tables[oid] = applying
        return applying

    # -- the target transactions ---------------------------------------------------------------

    def _begin_now(self, reading: _Reading) -> None:
        """Begins the target transaction being staged on the session (once the worker is done
        with it), its rows held in memory written into staging."""
        target = reading.target
        assert target is not None
        if target.begun:
            return
        reading.worker.wait()
        self._begin(reading.sessions, reading.run, target)

    def _begin(self, sessions: Sessions, run: RunState, target: _Target) -> None:
        """Begins ``target`` on the session; writes its held rows into staging."""
        tgt = sessions.target
        tgt.autocommit = False  # the transaction spans the peek's messages: no with block
        set_transaction_mode(tgt, IsolationLevel.READ_COMMITTED, read_only=False)
        self.ledger.lock(tgt, self.group.slot)  # the stream's session holds it: granted at once
        state = self.ledger.fetch(tgt, self.group.slot)
        if state is None or state.applied_lsn != run.applied:
            moved = "gone" if state is None else f"at {state.applied_lsn}, not {run.applied}"
            raise engine_error(
                "replication_failed",
                f"The group's applied position moved under the run that holds its lock ({moved});"
                " nothing of this target transaction was applied.",
            )
        target.begun = True
        for table in target.tables.values():
            table.undefer()

    def _submit(self, reading: _Reading, target: _Target) -> None:
        """Hands ``target`` to the worker: it begins it (when it is not yet), applies and
        commits it, then advances the slot, while the stream stages the next one."""
        sessions, control, run = reading.sessions, reading.control, reading.run

        def apply() -> None:
            try:
                if not target.begun:
                    self._begin(sessions, run, target)
                self._commit(sessions, control, target, run)
            except BaseException:
                target.abandon()
                raise

        reading.worker.submit(apply)

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
