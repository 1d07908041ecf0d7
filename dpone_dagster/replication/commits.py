"""The stream's target transactions: begun, applied and committed in the stream's order.

A :class:`TargetTransaction` gathers whole source transactions' staged rows per table. The
:class:`Committer` begins it on the target session (under the group's lock, at the applied
position the stream expects: the stream holds the lock, so nothing else moves it), applies its
net effect with the ledger's new applied position, commits, and only then advances the slot.
It does the apply and the commit on the apply worker's thread (:mod:`.worker`), so the stream
reads and stages the next target transaction meanwhile; that one's rows are held in memory until
the worker is done with the session (:meth:`Committer.begin_now`). The slot's advance (the
source's work: it decodes the WAL it moves over) runs on a thread of its own, one at a time, to
the newest committed position, so the worker goes on with the next transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.sessions import Sessions
from dpone_dagster.postgres.connection import Connection, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName

from .apply import TableApply
from .changes import Lsn
from .report import TableChanges
from .slot import advance_slot
from .staging_copy import StagingCopy
from .state import GroupLedger
from .worker import ApplyWorker


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

    def count(self, applying: TableApply) -> None:
        """Adds a table's applied changes to its counts."""
        name, counts = applying.plan.source, applying.counts
        before = self.counts.get(name) or TableChanges(name)
        self.counts[name] = replace(
            before, inserted=before.inserted + counts.inserted,
            updated=before.updated + counts.updated, deleted=before.deleted + counts.deleted,
            truncated=before.truncated + counts.truncated,
        )  # fmt: skip


Progress = Callable[[str, RunState, int], None]
"""Called at each step of the stream: the phase, the run so far, the changes staged (from the
apply worker's thread for the phases of a target transaction's apply)."""


@dataclass
class TargetTransaction:
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
class Committer:
    """Begins, applies and commits one run's target transactions, in order (see the module).

    Attributes:
        slot: The group's slot (its ledger row and lock).
        ledger: The group's ledger.
        sessions: The run's sessions (the target's is the one the transactions run on).
        control: The source session that advances the slot.
        run: The run's state, which each commit moves.
        progress: Called at each step.
    """

    slot: str
    ledger: GroupLedger
    sessions: Sessions
    control: Connection
    run: RunState
    progress: Progress
    worker: ApplyWorker = field(default_factory=ApplyWorker)
    advancer: ApplyWorker = field(default_factory=ApplyWorker)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wanted: Lsn = 0
    _advancing: bool = False

    @property
    def busy(self) -> bool:
        """True while the worker applies a target transaction."""
        return self.worker.busy

    def begin_now(self, target: TargetTransaction) -> None:
        """Begins ``target`` on the session once the worker is done with it (its held rows
        written into staging); nothing when it is begun already."""
        if not target.begun:
            self.worker.wait()
            self._begin(target)

    def submit(self, target: TargetTransaction) -> None:
        """Hands ``target`` to the worker: it begins it (when it is not yet), applies and
        commits it, then advances the slot, while the stream stages the next one."""

        def apply() -> None:
            try:
                if not target.begun:
                    self._begin(target)
                self._commit(target)
            except BaseException:
                target.abandon()
                raise

        self.worker.submit(apply)

    def end(self, target: TargetTransaction | None) -> None:
        """The stream's end: commits ``target`` (or rolls back one that applied nothing), then
        waits for the worker; raises its failure."""
        if target is not None and target.transactions:
            self.submit(target)
        elif target is not None and target.begun:
            self.worker.wait()
            target.close()
            self.sessions.target.rollback()
            self.sessions.target.autocommit = True
        self.worker.wait()
        self.advancer.wait()

    def stop(self) -> None:
        """On the stream's failure: the transaction in flight on the session is cancelled; an
        advance in flight ends (it only moves the slot to what committed)."""
        self.worker.stop(self.sessions.target)
        self.advancer.stop(self.control)

    def close(self) -> None:
        self.worker.close()
        self.advancer.close()

    def _begin(self, target: TargetTransaction) -> None:
        """Begins ``target`` on the session; writes its held rows into staging."""
        tgt, run = self.sessions.target, self.run
        tgt.autocommit = False  # the transaction spans the peek's messages: no with block
        set_transaction_mode(tgt, IsolationLevel.READ_COMMITTED, read_only=False)
        self.ledger.lock(tgt, self.slot)  # the stream's session holds it: granted at once
        state = self.ledger.fetch(tgt, self.slot)
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

    def _commit(self, target: TargetTransaction) -> None:
        """Applies the target transaction's net effect with the applied position, commits,
        then advances the slot."""
        tgt, run = self.sessions.target, self.run
        self.progress("apply", run, target.staged)
        for applying in target.tables.values():
            applying.apply()
            run.count(applying)
        target.close()
        assert target.last is not None
        self.ledger.applied(tgt, self.slot, target.last, target.transactions)
        self.progress("commit", run, target.staged)
        tgt.commit()
        tgt.autocommit = True
        run.applied, run.applied_end, run.applied_at = target.last
        run.transactions += target.transactions
        self.progress("committed", run, 0)
        self._advance(run.applied_end)

    def _advance(self, lsn: Lsn) -> None:
        """Moves the slot to ``lsn`` (committed) on the advancer's thread: the newest position
        wins, one advance at a time. Also when the run advances again at its end (to its upto
        LSN): these moves bring the slot's restart point along, so the run's last advance, and
        the next run's peek, do not decode this run's WAL again."""
        with self._lock:
            self._wanted = lsn
            if self._advancing:
                return  # the advance in flight moves on to it
            self._advancing = True
        self.advancer.submit(self._advance_latest)

    def _advance_latest(self) -> None:
        done: Lsn = 0
        while True:
            with self._lock:
                if self._wanted <= done:
                    self._advancing = False
                    return
                lsn = self._wanted
            advance_slot(self.control, self.slot, lsn)
            done = lsn
            self.progress("advanced", self.run, 0)
