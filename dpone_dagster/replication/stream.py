"""The stream: a run's slot read, source transaction by source transaction, into the target.

:meth:`SlotStream.run` holds the group's advisory lock for its session (another run of the group
waits for it, as long as its ``lock_wait``), reads the slot up to the run's LSN
(:func:`~.reader.read_ahead`, within ``max_changes_per_run``, decoded a round at a time while
this thread stages the rounds before), decodes each message (a row change from its bytes, with
no message object: :func:`~.pgoutput.new_tuple_text`, :func:`~.pgoutput.row_change`), and
gathers whole source transactions into target transactions of about ``batch_changes`` changes.
Every source transaction that committed at or before the ledger's applied position is skipped;
the others are staged per table (:mod:`.apply`, :mod:`.keyless`), and at a target
transaction's end their net effect is applied, the new applied position written in the ledger,
the transaction committed, and only then the slot advanced.

The apply is pipelined (:mod:`.commits`): target transactions alternate between two target
sessions, so this thread stages one (its rows stream into its session's staging tables) while
the apply worker's thread applies and commits the one before on the other session, in the
stream's order. What must see the target as every committed transaction left it waits for the
worker first: a table's first change (its plan reads the target's catalog, and may evolve it in
that transaction), a Relation message whose columns changed (it splits its table's batch and
plans it again, :mod:`.group_plan`), a ``TRUNCATE`` (:meth:`~.apply.TableApply.truncate`).
Each source transaction is still applied whole in one target transaction, and each target
transaction commits with its applied position, before the slot moves.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.sessions import Sessions, hold_advisory_lock, release_advisory_lock
from dpone_dagster.postgres.connection import Connection, server_encoding
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.lock_wait import lock_wait_of
from dpone_dagster.postgres.target_plan import TablePlan

from .apply import TableApply, evolve
from .changes import Begin, Commit, Lsn, Relation, Truncate
from .commits import Committer, LazySession, Progress, RunState, TargetTransaction
from .group_plan import ReplicationGroup
from .group_state import GroupLedger, GroupState
from .kept_catalogs import KeptCatalogs, kept_plan
from .keyless import table_apply
from .net import NetHook
from .pgoutput import RowChange, decode, new_tuple_text, row_change
from .reader import READ_AHEAD_BYTES, read_ahead
from .replication_report import TableChanges
from .slot_health import SlotWait

STAGE_EVERY = 10_000
"""Staged changes between two ``stage`` progress reports."""
_ROW_KINDS = frozenset(b"IUD")
"""The first bytes of the row change messages (insert, update, delete)."""
_OID = struct.Struct(">I").unpack_from
"""A row change's table OID (after its kind byte)."""


@dataclass
class _Reading:
    """A peek in progress: the sessions, the target transaction being staged, the tables
    known, the committer applying the one before."""

    sessions: Sessions
    run: RunState
    committer: Committer
    encoding: str
    target: TargetTransaction | None = None
    skipping: bool = False
    final: Lsn = 0  # the commit LSN of the source transaction being read
    starts: Mapping[TableName, Lsn] = field(default_factory=dict)  # tables that joined, and where
    kept: dict[TableName, object] = field(default_factory=dict)  # the ledger's kept catalogs
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    staged_mark: int = STAGE_EVERY
    relations: dict[int, tuple[TableName, Relation]] = field(default_factory=dict)
    plans: dict[int, TablePlan] = field(default_factory=dict)


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

    def run(
        self, sessions: Sessions, control: Connection, second: LazySession, run: RunState,
        upto: Lsn, on_read_end: Callable[[], object] = lambda: None,
    ) -> None:  # fmt: skip
        """Reads the slot up to ``upto`` (within the group's budget) and applies every source
        transaction after the ledger's applied position, a target transaction at a time, each
        committed with the ledger's applied position and then confirmed to the slot; ``run``
        follows what committed. Target transactions alternate between the target session and
        ``second`` (another session of the target, in autocommit, opened when needed).
        ``on_read_end`` is called once the read has ended (the source session is free again),
        before the last target transaction is applied.

        Raises:
            EngineError: ``replication_slot_active`` when another run holds the group past the
                session's ``lock_wait``; the codes of the peek and of the apply.
        """
        tgt, key = sessions.target, self.ledger.lock_key(self.group.slot)
        self._hold(tgt, key)
        state = self._applied(tgt, run)
        committer = Committer(self.group.slot, self.ledger, tgt, second, control, run,
                              self._report)  # fmt: skip
        reading = _Reading(sessions, run, committer, server_encoding(sessions.source),
                           starts=state.starts, kept=dict(state.kept))  # fmt: skip
        try:
            seen = self._read(reading, upto)
            on_read_end()
            target, reading.target = reading.target, None
            committer.end(target)
        except BaseException:
            committer.stop(reading.target)
            raise
        finally:
            committer.close()
        release_advisory_lock(tgt, key)
        budget = self.group.options.max_changes_per_run
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

    def _applied(self, tgt: Connection, run: RunState) -> GroupState:
        """``run`` from the ledger's applied position (another run may have moved it); the
        group's row (its tables that joined the group, each with the position its copy holds
        the source at, and the catalogs kept of its tables)."""
        state = self.ledger.fetch(tgt, self.group.slot)
        if state is None or state.applied_lsn is None:
            raise engine_error("replication_failed", "The group's ledger row is gone.")
        if state.applied_lsn > run.applied:
            run.applied, run.applied_end = state.applied_lsn, state.applied_end_lsn or 0
            run.applied_at = state.applied_commit_time
        return state

    def _read(self, reading: _Reading, upto: Lsn) -> int:
        """Stages every message of the read; the messages the server output (what it counts
        against the budget)."""
        group = self.group
        chunks = read_ahead(reading.sessions.source, slot=group.slot,
                            publication=group.publication, upto_lsn=upto,
                            max_changes=group.options.max_changes_per_run,
                            ahead=upto - reading.run.applied_end > READ_AHEAD_BYTES)  # fmt: skip
        seen = 0
        for chunk in chunks:
            seen += len(chunk)
            self._stage_chunk(reading, chunk)
        return seen

    def _stage_chunk(self, reading: _Reading, chunk: list[bytes]) -> None:
        """The hot path: one pass per message, no message object; an insert's or a plain
        update's row staged from its bytes."""
        for data in chunk:
            kind = data[0]
            if kind not in _ROW_KINDS:
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
            body = None if kind == 68 else new_tuple_text(data, applying.width)  # 68: 'D'
            if body is not None:
                applying.stage_new(kind, body)
            else:
                self._stage(applying, row_change(data), reading.at)
            target.staged += 1
            if target.staged >= reading.staged_mark:
                reading.staged_mark += STAGE_EVERY
                self._progress("stage", reading.run, target.staged)

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
                reading.target = reading.committer.begin()
                reading.staged_mark = STAGE_EVERY
                if reading.committer.busy:  # staged while the one before is applied
                    self._progress("next", run)
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
                reading.committer.submit(target)
                reading.target = None
        elif isinstance(message, Relation):
            name = TableName(message.schema, message.name)
            if name in self.group.tables:
                self._relation(reading, message, name)
        elif not reading.skipping:
            for oid in message.relations:
                truncated = self._table(reading, oid)
                if truncated is not None:
                    reading.committer.quiesce()
                    truncated.truncate(reading.at)

    def _relation(self, reading: _Reading, relation: Relation, name: TableName) -> None:
        """A table's columns as of here: a change splits its batch and plans it again."""
        known = reading.relations.get(relation.oid)
        reading.relations[relation.oid] = (name, relation)
        if known is not None and known[1].columns == relation.columns:
            return
        reading.plans.pop(relation.oid, None)
        target = reading.target
        if target is not None and relation.oid in target.tables:
            reading.committer.quiesce()
            current = target.tables.pop(relation.oid)
            current.apply()
            reading.run.count(current)
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
        if reading.final < reading.starts.get(name, 0):
            # The table joined the group after this transaction: its copy holds it. A commit
            # record that begins exactly at the copy's consistent point is not in its snapshot.
            return None
        run, tgt = reading.run, target.conn
        plan = reading.plans.get(oid)
        if plan is None:
            reading.committer.quiesce()  # the plan reads the target's catalog; evolves it
            target.copy.end()
            # The source's catalog on the control session: the source session is the reader's.
            catalog = reading.committer.control
            kept = KeptCatalogs.parse(reading.kept.get(name))
            plan, keep = kept_plan(catalog, tgt, name, relation, self.group, kept)
            if keep is not None:  # in the data's transaction: kept only if its rows commit
                reading.kept[name] = document = keep.document()
                self.ledger.keep(tgt, self.group.slot, name, document)
            evolve(tgt, plan)
            if plan.schema_changes:
                counted = run.counts.get(name) or TableChanges(name)
                run.counts[name] = replace(
                    counted, schema_changes=counted.schema_changes + plan.schema_changes
                )
            plan = replace(plan, schema_changes=())
            reading.plans[oid] = plan
        applying = table_apply(tgt, plan, self.group.soft_column, self.target_dsn,
                               reading.encoding, on_net=self.record_keys,
                               copy=target.copy)  # fmt: skip
        target.tables[oid] = applying
        return applying
