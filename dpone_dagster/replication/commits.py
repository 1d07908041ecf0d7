"""The stream's target transactions: begun, applied and committed in the stream's order.

A :class:`TargetTransaction` gathers whole source transactions' staged rows per table, on one of
two target sessions. The :class:`Committer` begins each on the session the one before it does not
use, so the stream stages a target transaction (its rows stream into that session's
``TEMPORARY`` staging tables by ``COPY``) while the apply worker's thread (:mod:`.worker`)
applies the one before on the other: its net effect, the ledger's new applied position (only at
the position the transaction before it committed: a compare-and-set under the stream's lock),
the commit. Target transactions commit one at a time, in the stream's order: the worker takes
the next only once the one before committed. The slot's advance (the source's work: it decodes
the WAL it moves over) runs on a thread of its own, one at a time, to the newest committed
position, so the worker goes on with the next transaction.

What must see the target as every committed transaction left it (a table's first plan and its
schema changes, a Relation message that splits a table's batch, a ``TRUNCATE``) waits for the
worker first (:meth:`Committer.quiesce`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName

from .apply import TableApply
from .changes import Lsn, lsn_text
from .group_state import GroupLedger
from .replication_report import TableChanges
from .slot import advance_slot
from .staging_copy import StagingCopy
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
    """A target transaction on ``conn``: its tables, their staging ``COPY`` and the source
    transactions it holds."""

    conn: Connection
    copy: StagingCopy
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


class LazySession:
    """A session opened on its first use (a run that needs one target transaction never opens
    the second target session)."""

    def __init__(self, opener: Callable[[], Connection]) -> None:
        self._opener = opener
        self.conn: Connection | None = None

    def get(self) -> Connection:
        """The session (opened now, the first time)."""
        if self.conn is None:
            self.conn = self._opener()
        return self.conn

    def close(self) -> None:
        """Closes it, if it was opened (the server rolls back what it left open)."""
        if self.conn is not None:
            self.conn.close()


@dataclass
class Committer:
    """Begins, applies and commits one run's target transactions, in order (see the module).

    Attributes:
        slot: The group's slot (its ledger row).
        ledger: The group's ledger.
        target: The target session, in autocommit (it holds the group's lock).
        second: The second target session, opened when a second target transaction begins.
        control: The source session that advances the slot.
        run: The run's state, which each commit moves.
        progress: Called at each step.
    """

    slot: str
    ledger: GroupLedger
    target: Connection
    second: LazySession
    control: Connection
    run: RunState
    progress: Progress
    worker: ApplyWorker = field(default_factory=ApplyWorker)
    advancer: ApplyWorker = field(default_factory=ApplyWorker)
    _turn: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wanted: Lsn = 0
    _advancing: bool = False

    @property
    def busy(self) -> bool:
        """True while the worker applies a target transaction."""
        return self.worker.busy

    def begin(self) -> TargetTransaction:
        """The next target transaction, begun on the session the one before does not use."""
        conn = self.second.get() if self._turn else self.target
        self._turn = 1 - self._turn
        conn.autocommit = False  # the transaction spans the peek's messages: no with block
        set_transaction_mode(conn, IsolationLevel.READ_COMMITTED, read_only=False)
        return TargetTransaction(conn, StagingCopy(conn))

    def quiesce(self) -> None:
        """Waits until every target transaction before the one being staged committed."""
        self.worker.wait()

    def submit(self, target: TargetTransaction, *, advance: bool = True) -> None:
        """Hands ``target`` to the worker: once the one before committed, it applies and
        commits it, then (``advance``) has the slot advanced, while the stream stages the next
        one."""

        def apply() -> None:
            try:
                self._commit(target, advance)
            except BaseException:
                target.abandon()
                raise

        self.worker.submit(apply)

    def end(self, target: TargetTransaction | None) -> None:
        """The stream's end: commits ``target`` (or rolls back one that applied nothing), then
        waits for the worker and the advancer; raises their failure. The slot is not advanced
        past the last commit here: the run's own advance, to its upto LSN, follows at once (a
        run that ends before it leaves the slot behind what committed, and the next run skips
        what the ledger holds)."""
        if target is not None and target.transactions:
            self.submit(target, advance=False)
        elif target is not None:
            target.close()
            target.conn.rollback()
            target.conn.autocommit = True
        self.worker.wait()
        self.advancer.wait()

    def stop(self, target: TargetTransaction | None) -> None:
        """On the stream's failure: the transaction the worker applies is cancelled, ``target``
        (being staged) abandoned; an advance in flight ends (it only moves the slot to what
        committed)."""
        self.worker.stop(*(c for c in (self.target, self.second.conn) if c is not None))
        self.advancer.stop(self.control)
        if target is not None:
            target.abandon()

    def close(self) -> None:
        self.worker.close()
        self.advancer.close()

    def _commit(self, target: TargetTransaction, advance: bool) -> None:
        """Applies the target transaction's net effect with the applied position, commits,
        then (``advance``) advances the slot."""
        tgt, run = target.conn, self.run
        self.progress("apply", run, target.staged)
        target.copy.end()  # the session runs one statement at a time: the staging COPY first
        for applying in target.tables.values():
            applying.apply()
            run.count(applying)
        target.close()
        assert target.last is not None
        if not self.ledger.applied(tgt, self.slot, target.last, target.transactions,
                                   was=run.applied):  # fmt: skip
            raise engine_error(
                "replication_failed",
                "The group's applied position is no longer the one this run applied from (it "
                f"moved, or the group is gone; expected {lsn_text(run.applied)}) although the "
                "run holds the group's lock; nothing of this target transaction was committed.",
            )
        self.progress("commit", run, target.staged)
        tgt.commit()
        tgt.autocommit = True
        run.applied, run.applied_end, run.applied_at = target.last
        run.transactions += target.transactions
        self.progress("committed", run, 0)
        if advance:
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
