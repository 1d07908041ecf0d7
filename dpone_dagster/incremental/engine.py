"""The incremental stream's entry point: plan a run, copy its batches, report what it did.

An :class:`IncrementalSync` is one stream: a source table, a target table, a cursor and the
primary key. Its id is the digest of those, so a restarted process (a Dagster retry, a second
run launched at the same time) finds the same durable state and continues the run in progress
after its last committed batch, or starts the next run from the stream's mark.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection
from dataclasses import replace

from psycopg import IsolationLevel

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.core.ledger_schema import DEFAULT_LEDGER_SCHEMA
from dpone_dagster.core.options import build_options
from dpone_dagster.core.sessions import (
    Sessions,
    fail_run,
    transaction,
)
from dpone_dagster.core.verification import Verification
from dpone_dagster.cursor.batch_commit import LostCommitError, PhaseHook
from dpone_dagster.cursor.cursor_ledger import StreamLedger
from dpone_dagster.cursor.engine import CursorCopy
from dpone_dagster.cursor.handoff import Handoff, StreamScope, backfill_handoff
from dpone_dagster.cursor.mark_policies import MovingMark, greatest, nothing_to_do
from dpone_dagster.cursor.marks import Mark
from dpone_dagster.cursor.stream_documents import StreamReceipt, StreamState
from dpone_dagster.cursor.table_check import MOVING_MARK_CHECK
from dpone_dagster.postgres.connection import Connection, ConnectionOptions
from dpone_dagster.postgres.extensions import extension_names
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_types import TargetTypes

from .batch import BatchOutcome, MergeBatch, copy_batch, stream_plan
from .options import IncrementalOptions
from .report import IncrementalResult, build_result
from .row_count import count_target
from .shape import StreamShape, read_catalogs, resolve_stream
from .sweep import CheckScope, SweepLedger
from .verify import RunCheck, check_target, idle_check


class IncrementalSync(CursorCopy):
    """Keeps a target table current with a source table, run after run.

    Args:
        source_dsn: The source database.
        target_dsn: The target database (the ledger lives in its schema ``ledger_schema``).
        table: The source table (``TableName`` or text such as ``'shop.orders'``).
        cursor: The column whose value grows when a row is inserted or updated (integer,
            numeric, date, timestamp or timestamptz; indexed; never NULL).
        target_table: The target table; defaults to the source table's name. Created on the
            first run if missing.
        options: How the stream runs (:class:`~dpone_dagster.incremental.IncrementalOptions`:
            deletes, batch size, look-back, the check and its sweep, repair, schema changes,
            fillfactor...); the defaults when ``None``.
        handoff: On a stream with no state, start where an earlier complete copy of the
            table ends instead of copying it again: :func:`dpone_dagster.backfill.
            backfill_handoff` continues a complete backfill of the same tables and cursor.
        ledger_schema: The ledger's schema in the target database.
        label: Distinguishes streams whose databases and tables share names on other servers.
        connection_options: Session options (of both sides, unless
            ``target_connection_options`` is given).
        target_connection_options: Options of the target's sessions, e.g. its ``lock_wait``
            (:class:`~dpone_dagster.postgres.ConnectionOptions`).
        on_batch: Called after each committed batch.
        on_phase: Called with ``"copy"``, ``"apply"``, ``"commit"`` and ``"committed"`` in
            each batch.
        create_extensions: Extensions the stream may create in the target when its table's
            types need them (``CREATE EXTENSION``, in a batch's transaction); any other is
            refused with ``target_extension_missing``. A target the stream creates brings the
            user-defined types its columns need (``schema_changes="freeze"``: none).

    Raises:
        TypeError: ``options`` is not an :class:`~dpone_dagster.incremental.IncrementalOptions`.
        EngineError: ``incremental_options_invalid`` for an extension name that is not one.

    Examples:
        Keep ``analytics.orders`` current with ``shop.orders``, deleting what the source lost::

            sync = IncrementalSync(src, dst, "shop.orders", cursor="updated_at",
                                   target_table="analytics.orders",
                                   options=IncrementalOptions(deletes="hard"))
            result = sync.run()
            print(result.inserted, result.updated, result.deleted, result.new_mark)
    """

    outage = "incremental_failed"
    target_autocommit = False  # the load path drives the target's transaction

    def __init__(
        self,
        source_dsn: str,
        target_dsn: str,
        table: TableName | str,
        *,
        cursor: str,
        target_table: TableName | str | None = None,
        options: IncrementalOptions | None = None,
        handoff: Handoff | None = None,
        ledger_schema: str = DEFAULT_LEDGER_SCHEMA,
        label: str = "",
        connection_options: ConnectionOptions | None = None,
        target_connection_options: ConnectionOptions | None = None,
        on_batch: Callable[[BatchOutcome], None] | None = None,
        on_phase: PhaseHook | None = None,
        create_extensions: Collection[str] = (),
    ) -> None:
        # A TypeError for anything else (the session options this name took before it).
        options = build_options(IncrementalOptions, options, caller="IncrementalSync")
        self.options = options
        super().__init__(
            source_dsn, target_dsn, table, cursor=cursor, target_table=target_table,
            ledger=LedgerConfig(schema=ledger_schema), label=label,
            connection_options=connection_options,
            target_connection_options=target_connection_options, on_phase=on_phase,
        )  # fmt: skip
        self.soft = options.soft_delete_column if options.deletes is Deletes.SOFT else None
        # The same engine, the next policy: a stream asked to continue a complete backfill
        # starts where the fixed mark's runs end (another handoff given instead wins).
        if handoff is None and options.continue_from_backfill:
            handoff = backfill_handoff
        self.handoff = handoff
        self.create_extensions = extension_names(
            create_extensions, refusal="incremental_options_invalid"
        )
        self.ledger = StreamLedger(ledger_schema)
        self.marks = MovingMark(options.settle_timeout, options.lookback)
        self.on_batch = on_batch or (lambda _: None)

    def stream_id(self, sessions: Sessions) -> str:
        """``incremental:<digest>`` of the databases, tables, cursor and label."""
        scope = [self.label, sessions.source.info.dbname, str(self.source),
                 sessions.target.info.dbname, str(self.target), self.cursor]  # fmt: skip
        digest = hashlib.sha256(json.dumps(scope).encode()).hexdigest()[:32]
        return f"incremental:{digest}"

    def plan(self) -> StreamShape:
        """Checks the stream against both catalogs without writing anything.

        Raises:
            EngineError: the stream cannot run (see :func:`.shape.resolve_stream`).
        """
        try:
            return self.guard(self._resolve)
        finally:
            self.close()

    def _resolve(self, sessions: Sessions) -> StreamShape:
        found = read_catalogs(sessions.source, sessions.target, self.source, self.target)
        shape = resolve_stream(found, self.source, self.target, self.cursor, self.soft)
        # Refuses early; each batch plans again from the catalogs inside its own transactions.
        stream_plan(sessions.source, sessions.target, shape, self.options, found,
                    create_extensions=self.create_extensions)  # fmt: skip
        sessions.target.commit()
        MOVING_MARK_CHECK.refuse_null(sessions.source, shape)
        if self.options.lookback is not None and not shape.cursor_is_time:
            raise engine_error(
                "incremental_options_invalid",
                f"lookback applies to a date or timestamp cursor; {self.cursor!r} is a "
                f"{shape.cursor.type_sql}.",
            )
        return shape

    def run(self) -> IncrementalResult:
        """Runs the stream once: continues the run in progress, or takes a new mark and copies
        up to it; then reports the run.

        Raises:
            EngineError: a bad stream (nothing written), ``incremental_cursor_null``,
                ``incremental_backfill_incomplete``, ``incremental_stream_stale``.
            DponeError: a session or the load failed (a database failure has its code from
                the database-failure catalog, else ``incremental_failed``); the committed
                batches stay and the next run continues after them.
        """
        sessions = self.open()
        try:
            shape = self._resolve(sessions)
            self.ledger.ensure(sessions.target)  # one read when current
            stream_id = self.stream_id(sessions)
            begun = self._begin(sessions, shape, stream_id)
            if begun[1].run is None:
                idle, begun = self._checked_idle(sessions, shape, stream_id, begun)
                if idle is not None:
                    return idle
            before, state, mark = begun
            if state.run is None:  # another run ended meanwhile
                return build_result(sessions.source, shape, before, state, [], mark, 0)
            number, outcomes = state.run.number, []
            while True:
                try:
                    done = self._batch(sessions, shape, stream_id, number)
                except LostCommitError as lost:  # the durable state says what committed
                    sessions = self.after_lost_commit(lost.pid)
                    continue
                if done is None:
                    break
                outcomes.append(done)
                self.on_batch(done)
                if done.state.run is None:
                    break
            after, receipts = self._ended(sessions.target, stream_id, state, outcomes)
            result = build_result(
                sessions.source, shape, before, after, receipts, mark, len(outcomes)
            )
            changes = {(c.column, c.kind): c for o in outcomes for c in o.schema_changes}
            return replace(
                result, schema_changes=tuple(changes.values()),
                target_types=TargetTypes.merged([o.target_types for o in outcomes]),
                virtual_as_stored=tuple(c for o in outcomes for c in o.virtual_as_stored),
            )  # fmt: skip
        except BaseException as exc:
            fail_run(sessions, exc, self.outage, sources=[self.source], targets=[self.target])
        finally:
            self.close()

    def _ended(
        self, tgt: Connection, stream_id: str, begun: StreamState, outcomes: list[BatchOutcome]
    ) -> tuple[StreamState, list[StreamReceipt]]:
        """The state after the run and the run's receipts: those this call committed when it
        ran the whole run, else the ledger's (a resumed run, or one another process ended)."""
        assert begun.run is not None
        first = begun.sequence + 1
        alone = [o.receipt.sequence for o in outcomes] == list(range(first, first + len(outcomes)))
        if alone and begun.run.batches == 0 and outcomes and outcomes[-1].state.run is None:
            return outcomes[-1].state, [o.receipt for o in outcomes]
        with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=True):
            after = self.ledger.fetch(tgt, stream_id)
            receipts = self.ledger.receipts(tgt, stream_id, begun.run.number)
        assert after is not None
        return after, receipts

    def check(self) -> Verification | None:
        """Verifies what the target holds without copying or writing anything.

        In one source snapshot, compares whole rows of both sides (as a verified run's final
        batch does): every source row at or below where the stream's next run starts reading
        (its mark, less what it reads again) must be in the target, equal. Rows changed or
        inserted since, and target rows whose key the source lost since, are explained.

        Returns:
            The verification, or ``None`` when the stream has completed no run yet (nothing
            to contradict).

        Raises:
            EngineError: a bad stream (see :meth:`plan`).
        """
        try:
            return self.guard(self._check)
        finally:
            self.close()

    def _check(self, sessions: Sessions) -> Verification | None:
        src, tgt = sessions.source, sessions.target
        found = read_catalogs(src, tgt, self.source, self.target)
        shape = resolve_stream(found, self.source, self.target, self.cursor, self.soft)
        tgt.commit()  # the catalog reads' transaction
        stream_id = self.stream_id(sessions)
        with transaction(tgt, IsolationLevel.REPEATABLE_READ, read_only=True):
            state = self.ledger.fetch(tgt, stream_id) if self.ledger.exists(tgt) else None
            if state is None or state.runs == 0:
                return None
            with transaction(src, IsolationLevel.REPEATABLE_READ, read_only=True):
                lower = self.marks.next_lower(src, shape, state)
                return check_target(src, tgt, shape, lower)

    def _idle(
        self, sessions: Sessions, shape: StreamShape, state: StreamState
    ) -> Verification | None:
        """A run with nothing to copy, verified by run or deleting by sweep: this run's slice
        of the sweep, in a source snapshot of its own, the position saved under the stream's
        lock (``None``: nothing to check, no run completed yet, or another run moved the stream
        meanwhile).

        Raises:
            KeysGoneError: ``sweep`` deletes and the slice found target keys the source lost, or
                ``repair`` and it found rows that differ; the position is not saved, and the
                caller runs a batch that deletes or repairs them with a receipt.
        """
        sweeping = self.options.deletes is Deletes.SWEEP
        checked = self.options.reconcile and self.options.check is CheckScope.RUN
        if state.mark is None or not (checked or sweeping):
            return None
        src, tgt = sessions.source, sessions.target
        with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
            self.ledger.lock(tgt, state.stream_id)
            now = self.ledger.fetch(tgt, state.stream_id)
            if now is None or now.revision != state.revision:
                return None
            how = RunCheck(CheckScope.RUN, self.options.sweep, SweepLedger(self.ledger.store),
                           state.stream_id, state.mark)  # fmt: skip
            with transaction(src, IsolationLevel.REPEATABLE_READ, read_only=True):
                found = idle_check(src, tgt, shape, how, state.mark)
                if sweeping and found is not None and found.deleted_kept:
                    raise KeysGoneError(found.deleted_kept)  # both transactions roll back
                if self.options.repair and found is not None and not found.ok:
                    raise KeysGoneError(found.unexplained)  # a batch repairs them
        return found if checked else None

    def _checked_idle(
        self, sessions: Sessions, shape: StreamShape, stream_id: str,
        begun: tuple[StreamState, StreamState, Mark | None],
    ) -> tuple[IncrementalResult | None, tuple[StreamState, StreamState, Mark | None]]:  # fmt: skip
        """The result of a run with nothing to copy (its idle check), or ``None`` and the run
        begun instead, when ``sweep`` deletes found keys to delete."""
        before, state, mark = begun
        try:
            verification = self._idle(sessions, shape, state)
        except KeysGoneError:
            return None, self._begin(sessions, shape, stream_id, force=True)
        result = build_result(sessions.source, shape, before, state, [], mark, 0)
        return replace(result, verification=verification), begun

    def _batch(
        self, sessions: Sessions, shape: StreamShape, stream_id: str, number: int
    ) -> BatchOutcome | None:
        return copy_batch(
            MergeBatch(sessions, self.ledger, shape, stream_id, number, self.options,
                       self.target_dsn, self.create_extensions, self.on_phase)
        )  # fmt: skip

    def _state(self, sessions: Sessions, shape: StreamShape, stream_id: str) -> StreamState:
        """The stream's state, stored when new (from the backfill's mark when asked) with the
        target's rows, which a stream an earlier release began gets too (:mod:`.row_count`)."""
        tgt = sessions.target
        with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
            self.ledger.lock(tgt, stream_id)
            state = self.ledger.fetch(tgt, stream_id)
            if state is not None and state.target_rows is None:
                counted = state.model_copy(
                    update={"revision": state.revision + 1,
                            "target_rows": count_target(tgt, shape)}
                )  # fmt: skip
                self.ledger.swap(tgt, state, counted)
                state = counted
            if state is None:
                mark = None
                if self.handoff is not None:
                    scope = StreamScope(sessions.source.info.dbname, self.source,
                                        tgt.info.dbname, self.target, self.cursor)  # fmt: skip
                    marks = self.handoff(tgt, self.ledger.store, scope)
                    mark = greatest(sessions.source, shape, list(marks))
                state = StreamState(stream_id=stream_id, mark=mark,
                                    target_rows=count_target(tgt, shape))  # fmt: skip
                self.ledger.swap(tgt, None, state)
        return state

    def _begin(
        self, sessions: Sessions, shape: StreamShape, stream_id: str, *, force: bool = False
    ) -> tuple[StreamState, StreamState, Mark | None]:
        """``(state before, state with the run to do, the mark taken)``: the run in progress
        if there is one (resumed or joined), else a new run from a fresh mark (``force``: even
        with nothing to copy)."""
        state = self._state(sessions, shape, stream_id)
        if state.run is not None:
            return state, state, None
        mark = self.marks.take(sessions.source, shape)
        tgt = sessions.target
        with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
            self.ledger.lock(tgt, stream_id)
            state = self.ledger.fetch(tgt, stream_id) or state
            stale = state.mark_taken_at is not None and state.mark_taken_at >= mark.taken_at
            if state.run is not None or stale:  # another run began, or ended after our mark
                return state, state, mark
            run = self.marks.plan_run(sessions.source, shape, state, mark)
            full = self.options.reconcile and self.options.check is CheckScope.FULL
            if nothing_to_do(state, run, self.options.deletes) and not full and not force:
                return state, state, mark  # verified by run: the check needs no batch
            begun = state.model_copy(update={"revision": state.revision + 1, "run": run})
            self.ledger.swap(tgt, state, begun)
        return state, begun, mark


class KeysGoneError(Exception):
    """An idle slice found what only a batch writes (how many keys): target keys the source
    lost under ``sweep`` deletes, or rows to rewrite under ``repair=True``; a batch deletes or
    repairs them, with its receipt."""
