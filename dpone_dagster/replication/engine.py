"""The replication engine's entry point: a run drains the slot and applies it, exactly once.

One :meth:`Replication.run`:

1. **initial copy** (first run, an unfinished one, or ``resync``): the group's ledger row is
   written first (phase ``copying``: from then on the slot is this ledger's), the publication
   made to match the tables, the slot created with an exported snapshot, and every table copied
   under exactly that snapshot by the snapshot copy engine
   (:class:`~dpone_dagster.snapshot_copy.engine.SnapshotCopy`, its receipts), whose load
   commits the ledger's ``streaming`` phase and the slot's consistent point with the rows.
   Otherwise the group meets its definition (:mod:`.follow`): a table that joined it is copied
   alone under a snapshot whose place in the stream is known (:mod:`.join`), one that left is
   dropped from the publication, a partitioned table's new partitions are merged
   (:mod:`.partitions`);
2. **stream** (:mod:`.stream`), under the group's advisory lock held by the stream's target
   session for the whole read: the source's current LSN is taken (``upto_lsn``); the slot is
   read up to it (:func:`~.reader.read_ahead`, within ``max_changes_per_run``); whole source
   transactions are grouped into target transactions of about ``batch_changes`` changes,
   alternating between two target sessions (:mod:`.commits`): the stream stages one
   (:mod:`.apply`), skipping every source transaction that committed at or before the applied
   position, while the apply worker applies the net effect of the one before, writes its new
   applied position (checked against the one it began from) and commits; only then is the slot
   advanced, on a thread of its own (to the end of the last applied commit record; after the
   whole read, to ``upto_lsn``);
3. **sequences** (unless the group's ``sequences=False``): the source's values are read once the
   slot's read has ended (while the last target transaction commits) and, at once with the
   slot's last advance, the target's sequences of the tables' identity and ``serial`` columns
   are brought to at least them (:mod:`.sequences`). A slot whose restart point the advance
   left far behind is given a running-transactions record to move it past
   (:func:`~.slot.mark_restart_point`).

A ``kill -9`` anywhere leaves the target and the ledger at the last commit: a transaction
committed but not yet confirmed to the slot is read again by the next run and skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, wait
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial

import psycopg
from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.core.sessions import (
    Sessions,
    fail_run,
    one_statement,
    open_at_once,
    prepared_session,
    transaction,
)
from dpone_dagster.core.verification import Verification
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import (
    Connection,
    ConnectionOptions,
)
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_plan import Sink
from dpone_dagster.postgres.threads import at_once, background
from dpone_dagster.snapshot_copy.copy_report import CopyReport

from .changes import Lsn
from .commits import LazySession, RunState
from .copying import GroupContext, copy_under, filled_targets
from .failover import FailoverSource
from .follow import GroupChange, follow_group, with_entries
from .group_plan import ReplicationGroup, refuse_keyless
from .group_state import GroupLedger, GroupState, TableState
from .partitions import partition_trees
from .publication import publication_error, read_publication
from .recorder import KeyRecorder
from .replication_report import ReplicationProgress, ReplicationReport, TableChanges
from .sequences import SourceSequence, source_sequences, sync_sequences
from .setup import check_replication_setup, create_replication
from .slot import (
    advance_slot,
    current_lsn,
    mark_restart_point,
    slot_status,
    wait_for_slot,
)
from .slot_health import SlotStatus, SlotWait
from .stream import SlotStream
from .verify import CheckContext, verify_group

BATCH_CHANGES = 100_000
"""Changes a target transaction gathers (whole source transactions) before it commits. Each
commit costs a netting, a merge per table and a slot advance; smaller transactions let the
apply worker merge one while the stream decodes the next (:mod:`.stream`), so a backlog's first
decode and its last merge, which nothing overlaps, stay short."""


class Replication:
    """Keeps a group of target tables current with the source through a logical slot.

    Args:
        group: The group: its tables, slot and publication, and its options
            (:class:`~.options.ReplicationOptions`: deletes, schema changes, budget, sequences,
            failover, whether each run is checked and the check's sweep).
        source: The source database's DSN (its role needs ``REPLICATION`` and owns the tables).
        target: The target database's DSN; the ledger lives in its schema ``ledger.schema``.
        ledger: Where the ledger lives; it must be the target database (the applied position
            commits with the rows).
        adopt: On the first run (or for a table that joins the group), take over target
            tables that already hold rows (from ``backfill_asset`` or ``incremental_asset``)
            instead of refusing them (``replication_target_exists``): each is checked against
            the source's columns by the schema-change policy (a lossy difference is refused with
            ``schema_change_incompatible``, nothing written), then copied again under the
            slot's snapshot in one transaction (readers see the old rows until it commits).
        resync: Copy every table again under a new slot (after a lost slot, or a publication
            dropped by hand); a table added to the group needs none: it joins alone.
        connection_options: Session options (of both sides, unless
            ``target_connection_options`` is given).
            Their ``lock_wait`` also bounds how long a run waits for the slot while another session
            holds it (another run of the group, or a killed run's server process still
            decoding); past it the run fails with ``replication_slot_active``, naming the pid.
        target_connection_options: Options of the target's sessions.
        on_progress: Called at each step (:class:`~.replication_report.ReplicationProgress`).
        batch_changes: Changes per target transaction (whole source transactions).
        standby: A DSN of the source's standby: each run reads its copy of the group's slot
            (:class:`~.failover.StandbySlot`, in the report), whether a promotion of it would
            keep the group going.

    Raises:
        EngineError: ``replication_options_invalid`` for a ledger outside the target.
    """

    def __init__(
        self,
        group: ReplicationGroup,
        *,
        source: str,
        target: str,
        ledger: LedgerConfig | None = None,
        adopt: bool = False,
        resync: bool = False,
        connection_options: ConnectionOptions | None = None,
        target_connection_options: ConnectionOptions | None = None,
        on_progress: Callable[[ReplicationProgress], None] | None = None,
        batch_changes: int = BATCH_CHANGES,
        standby: str | None = None,
    ) -> None:
        ledger = ledger or LedgerConfig()
        if not ledger.in_target:
            raise engine_error(
                "replication_options_invalid",
                "The replication's ledger must live in the target database: its applied "
                "position commits in the same transaction as the rows.",
                ["Leave the ledger's dsn unset (its schema may be any)."],
            )
        self.group, self.source_dsn, self.target_dsn = group, source, target
        self.ledger = GroupLedger(ledger.schema)
        self.adopt, self.resync = adopt, resync
        self.source_options = connection_options
        self.target_options = target_connection_options or connection_options
        self.failover = FailoverSource(
            source, connection_options, group.slot, group.options.failover, standby
        )
        self.slot_wait = (connection_options or ConnectionOptions()).lock_wait
        self.on_progress = on_progress or (lambda _: None)
        self.batch_changes = max(1, batch_changes)
        self.checking = CheckContext(group, self.ledger, group.options.sweep)
        self.record_keys = (
            KeyRecorder(self.ledger.store.tables, group.slot) if group.options.reconcile else None
        )
        self.stream = SlotStream(
            group, self.ledger, target_dsn=target, batch_changes=self.batch_changes,
            record_keys=self.record_keys, progress=self._progress, on_wait=self._slot_wait,
        )  # fmt: skip
        self.context = GroupContext(
            group, self.ledger, source, target, self.source_options, self.target_options,
            self.owner_comment, self.slot_wait, self._step, self._slot_wait,
        )  # fmt: skip

    @property
    def owner_comment(self) -> str:
        """The comment the group's own publication carries (:mod:`.setup`)."""
        return f"dpone replication group {self.group.slot}"

    # -- sessions ----------------------------------------------------------------------------

    def _open(self) -> tuple[Sessions, Connection, LazySession]:
        """The source, target and control sessions, opened at once, and a second target
        session, opened when the stream needs it (its target transactions alternate between
        the two)."""
        target = partial(prepared_session, self.target_dsn, self.target_options, "target")
        src, tgt, control = open_at_once(
            partial(prepared_session, self.source_dsn, self.source_options, "source"),
            target,
            partial(prepared_session, self.source_dsn, self.source_options, "source"),
        )
        return Sessions(source=src, target=tgt, ledger=tgt), control, LazySession(target)

    def run(self) -> ReplicationReport:
        """Runs the group once: the initial copy when needed, then every source transaction
        committed before the run's start (within the budget), then the slot's advance.

        Raises:
            EngineError: ``replica_identity_missing``, ``replication_target_exists``,
                ``replication_group_changed``, ``replication_slot_lost`` and the other slot
                codes, ``replication_toast_unresolved``, ``replication_row_missing`` (a keyless
                table's row the target lost, :mod:`.keyless`).
            SchemaChangeError: ``schema_change_incompatible``; nothing of that target
                transaction was committed.
            DponeError: a database failure (its code from the database-failure catalog, else
                ``replication_failed``); what committed stays, the next run continues after it.
        """
        with self._guarded() as (sessions, control, second):
            return self._run(sessions, control, second)

    def check(self) -> Mapping[TableName, Verification]:
        """Compares both whole tables of every table of the group with the source, writing
        nothing (the check run alone, :mod:`.verify`): a difference is explained when a change
        to its key committed after the applied position (it is still in the slot).

        Returns:
            Each table's verification (none before the group's initial copy completed).

        Raises:
            DponeError: a database failure (its code), ``replication_slot_missing`` and the
                other slot codes of the peek.
        """
        with self._guarded() as (sessions, control, _):
            self.ledger.ensure(sessions.target)
            return verify_group(sessions.source, sessions.target, control, self.checking,
                                full=True)  # fmt: skip

    @contextmanager
    def _guarded(self) -> Iterator[tuple[Sessions, Connection, LazySession]]:
        """The run's sessions, its control session and its second target session, closed at
        the end (the server rolls back what they left open); a failure inside ends the run
        through the one run guard (:func:`~dpone_dagster.core.sessions.fail_run`: sessions
        abandoned, a database error raised as its coded error)."""
        sessions, control, second = self._open()
        try:
            yield sessions, control, second
        except BaseException as exc:
            tables = list(self.group.tables)
            fail_run(sessions, exc, "replication_failed", sources=tables, targets=tables)
        finally:
            sessions.close()
            control.close()
            second.close()

    def _run(
        self, sessions: Sessions, control: Connection, second: LazySession
    ) -> ReplicationReport:
        tgt, group = sessions.target, self.group
        self.failover.refuse_unsupported(sessions.source)
        state = self._state(tgt)
        copied: CopyReport | None = None
        adopted = False
        change = GroupChange()
        if state is None or state.phase == "copying" or self.resync:
            copied, adopted = self._initial_copy(sessions, control, state)
        else:
            self.failover.follow_timeline(control, tgt, state, self.ledger)
            change = follow_group(self.context, sessions, control, state, adopt=self.adopt)
        if copied is not None or change.copies or change.left:
            state = self._state(tgt)
        assert state is not None
        assert state.applied_lsn is not None
        if copied is not None:
            self.failover.follow_timeline(control, tgt, state, self.ledger)
        read_at = datetime.now(UTC)  # before the LSN: the target holds at least this state
        upto = current_lsn(control)
        if self.record_keys is not None:
            self.record_keys.reset()
        run = RunState(state.applied_lsn, state.applied_end_lsn or state.applied_lsn,
                       state.applied_commit_time)  # fmt: skip
        owned = self._stream(sessions, control, second, run, upto)
        confirmed = run.applied_end
        if not run.budget_reached:
            confirmed = max(confirmed, upto)  # every transaction committed before upto is applied
        # The slot's advance and the sequences' sync use different sessions: they run at once.
        status, sequences = at_once(
            partial(_advanced_status, control, group.slot, confirmed),
            lambda: sync_sequences(tgt, group, owned()),
        )
        assert status is not None
        status, standby = self.failover.slot_end(control, status)
        self._progress("advanced", run)
        # Drained to upto, the target holds the source as of the run's read, however quiet the
        # source; stopped by the budget, only as of the newest transaction applied.
        held = run.applied_at if run.budget_reached else read_at
        lag = None if held is None else (datetime.now(UTC) - held).total_seconds()
        checks: Mapping[TableName, Verification] = {}
        # The check, after the slot's advance, at the applied LSN; a run stopped by its budget
        # leaves its keys recorded for the first run that drains the slot (its check would
        # peek the whole backlog the slot still holds).
        if self.record_keys is not None and not run.budget_reached:
            checks = verify_group(sessions.source, tgt, control, self.checking, full=False)
        return ReplicationReport(
            group=group, initial_copy=copied, start_lsn=state.applied_lsn,
            applied_lsn=run.applied, upto_lsn=upto, transactions=run.transactions,
            tables=tuple(run.counts.get(t) or TableChanges(t) for t in group.tables),
            lag_bytes=status.lag_bytes, lag_seconds=lag, slot=status,
            budget_reached=run.budget_reached, skipped_transactions=run.skipped,
            adopted=adopted, tables_removed=change.left, checks=checks,
            tables_joined=change.joined, partitions_merged=change.merged,
            join_copies=change.copies, sequences=sequences, standby=standby,
        )  # fmt: skip

    def _stream(
        self, sessions: Sessions, control: Connection, second: LazySession, run: RunState,
        upto: Lsn,
    ) -> Callable[[], tuple[SourceSequence, ...]]:  # fmt: skip
        """The stream (:mod:`.stream`). Returns the call that gives the source's sequences
        (none when the group leaves them alone): they are read on the source session once the
        slot's read has ended, while the last target transaction is applied and commits, and
        the call waits for that read."""
        ahead: list[Future[tuple[SourceSequence, ...]]] = []

        def read_sequences() -> None:
            if self.group.options.sequences:
                ahead.append(background().submit(source_sequences, sessions.source, self.group))

        try:
            self.stream.run(sessions, control, second, run, upto, on_read_end=read_sequences)
        except BaseException as exc:
            wait(ahead)  # the source session is closed only once its read has ended
            if isinstance(exc, psycopg.errors.UndefinedObject):  # PostgreSQL 15: publication gone
                raise publication_error(self.group.publication, "the slot's read", exc) from exc
            raise
        return ahead[0].result if ahead else tuple

    def _state(self, tgt: Connection) -> GroupState | None:
        """The group's ledger row, the ledger brought up to date; ``None`` while the ledger has
        no table of groups, with nothing written: a first run creates the ledger only once its
        refusals have passed (:meth:`_initial_copy`)."""
        if not self.ledger.store.current(tgt):
            with one_statement(tgt):
                row = tgt.execute(
                    "SELECT to_regclass(format('%%I.%%I', %s::text, 'replication_groups'))",
                    (self.ledger.store.schema,),
                ).fetchone()
            if row is None or row[0] is None:
                return None
            self.ledger.ensure(tgt)
        with one_statement(tgt):
            return self.ledger.fetch(tgt, self.group.slot)

    def _slot_wait(self, wait: SlotWait) -> None:
        self.on_progress(ReplicationProgress("slot_wait", 0, 0, wait=wait))

    def _progress(self, phase: str, run: RunState, staged: int = 0) -> None:
        self.on_progress(ReplicationProgress(phase, run.transactions, run.applied, staged))

    def _step(self, phase: str) -> None:
        """A step outside the stream (a copy's start and commit)."""
        self._progress(phase, RunState(0, 0, None))

    def _initial_copy(
        self, sessions: Sessions, control: Connection, state: GroupState | None
    ) -> tuple[CopyReport | None, bool]:
        """Copies every table under the new slot's snapshot (see the module's step 1)."""
        src, tgt, group = sessions.source, sessions.target, self.group
        check_replication_setup(src, slot=group.slot, publication=group.publication,
                                tables=group.tables, owner_comment=self.owner_comment,
                                ledgers_slot=state is not None)  # fmt: skip
        refuse_keyless(src, group)
        filled = filled_targets(tgt, group.tables)
        if filled and not self.adopt and not self.resync:
            raise engine_error(
                "replication_target_exists",
                f"Target table(s) {', '.join(map(str, filled))} already hold rows.",
            )
        existing = slot_status(control, group.slot)
        if existing is not None and state is None:
            raise engine_error(
                "replication_slot_foreign",
                f"A replication slot named {group.slot!r} exists, and this ledger did not "
                "create it.",
            )
        self.ledger.ensure(tgt)  # the first thing a run writes to the target
        with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
            self.ledger.lock(tgt, group.slot)
            self.ledger.begin_copy(tgt, group.slot, group.publication, group.tables)
        if existing is not None:  # this ledger's, from an unfinished copy or before a resync
            # A killed copy's server process may still hold it.
            wait_for_slot(control, group.slot, self.slot_wait, self._slot_wait)
            control.execute("SELECT pg_drop_replication_slot(%s)", (group.slot,))
        self._step("copy")
        # The partitions, read before the slot's snapshot (.partitions).
        trees = partition_trees(src, group.tables)
        members = {t: TableState(leaves=trees[t].leaves if t in trees else None)
                   for t in group.tables}  # fmt: skip
        creating = create_replication(
            self.source_dsn, slot=group.slot, publication=group.publication,
            tables=group.tables, owner_comment=self.owner_comment, options=self.source_options,
            failover=self.failover.wanted(src),
        )  # fmt: skip
        with creating as created:
            point = created.consistent_point
            members = with_entries(members, read_publication(src, group.publication))

            def commit_state(conn: Connection) -> None:
                self.ledger.lock(conn, group.slot)
                self.ledger.copied(conn, group.slot, point, members)

            report = copy_under(self.context, group.tables, created.snapshot, sink=Sink.REPLACE,
                                before_commit=commit_state)  # fmt: skip
        self._step("copied")
        return report, bool(filled)


__all__ = ["BATCH_CHANGES", "DponeError", "Replication"]


def _advanced_status(control: Connection, slot: str, confirmed: Lsn) -> SlotStatus | None:
    """Moves ``slot`` to ``confirmed`` and reads its state after (the control session); marks
    a restart point when the slot's lags far behind (:func:`~.slot.mark_restart_point`)."""
    advance_slot(control, slot, confirmed)
    status = slot_status(control, slot)
    if status is not None:
        mark_restart_point(control, status)
    return status
