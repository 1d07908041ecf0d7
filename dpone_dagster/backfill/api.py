"""The backfill's public entry point: plan, run batch by batch, load, reconcile.

A :class:`Backfill` is one scope: a source table, a target table, a cursor and an optional
partition range ``(lower, upper]``. Its run id is the digest of that scope, so a restarted
process (or a Dagster retry, or a second orchestrator) finds the same durable run and resumes
after its last committed batch. The boundary (high-water mark) is fixed once, when the run is
first planned.

It is the cursor engine (:class:`~dpone_dagster.cursor.engine.CursorCopy`: the sessions, the
failures' codes, the batch-commit protocol and a lost COMMIT's answer) under the fixed mark
(:class:`~dpone_dagster.cursor.mark_policies.FixedMark`), its rows appended batch by batch and
its ranges reconciled at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
from psycopg import IsolationLevel

from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.core.options import build_options
from dpone_dagster.core.sessions import Sessions, transaction
from dpone_dagster.cursor.backfill_documents import (
    BackfillRun,
    BackfillScope,
    BackfillStatus,
    BatchReceipt,
    BatchRequest,
)
from dpone_dagster.cursor.batch_commit import LostCommitError, PhaseHook
from dpone_dagster.cursor.chain import verify_chain
from dpone_dagster.cursor.cursor_ledger import RunLedger
from dpone_dagster.cursor.engine import CursorCopy
from dpone_dagster.cursor.mark_policies import FixedMark
from dpone_dagster.cursor.range_checks import ReconciliationReport
from dpone_dagster.cursor.run_rules import next_request, replay, run_id_for, start_run
from dpone_dagster.postgres.connection import Connection, ConnectionOptions
from dpone_dagster.postgres.identifiers import TableName

from .batch_size import batch_size_for, width_batch_size
from .copier import BatchResult, copy_batch
from .deferred_key import build_key
from .options import BackfillOptions
from .reconcile import reconcile_run
from .results import BackfillReconciliationError, BackfillResult, needs_reconciliation
from .shape import TableShape, canonical_cursor, resolve_shape, scope_for
from .state import ScopeState, scope_state


class Backfill(CursorCopy):
    """An ordered, checkpointed copy of one table (or one cursor range of it).

    Args:
        source_dsn: The source database.
        target_dsn: The target database (and, by default, the ledger's).
        table: The source table (``TableName`` or text such as ``'sales."Order Items"'``).
        cursor: The cursor column's exact name; ``None`` is refused (``backfill_cursor_missing``).
        target_table: The target table; defaults to the source table's name.
        ledger: Where the ledger lives (default: schema ``dpone_ledger`` of the target).
        lower: Exclusive lower bound of the partition (an int, datetime, date or text).
        upper: Inclusive upper bound of the partition.
        label: Distinguishes runs whose databases and tables share names on different servers.
        options: How the backfill runs (batch size, reconciliation, ``on_changed``, settle
            timeout, write pause): :class:`BackfillOptions`, the defaults when ``None``.
        connection_options: Session options (application name, timeouts), of both sides unless
            ``target_connection_options`` is given.
        target_connection_options: Options of the target's (and the ledger's) sessions.
        on_phase: Called with ``"copy"``, ``"commit"`` and ``"committed"`` during each batch.
        keyless_load: This run created the target without its primary key
            (``prepare_target(defer_key=True)``) and appends its batches so
            (:mod:`.deferred_key`); the key is built by :meth:`build_key`, or by
            :meth:`reconcile`. Any other run that finds the key deferred builds it when it
            plans.

    Raises:
        TypeError: ``options`` is not a :class:`BackfillOptions`.
        EngineError: ``backfill_cursor_missing`` without a cursor, ``plan_invalid`` for a
            target that is the source itself (a :class:`BackfillOptions` refuses a bad option
            with ``plan_invalid`` when it is built).
        IdentifierError: ``identifier_invalid`` for a name PostgreSQL cannot hold exactly.

    Examples:
        Copy ``public.orders`` in 50,000-row batches, printing progress after each commit::

            backfill = Backfill(
                src, dst, "public.orders", cursor="id",
                options=BackfillOptions(batch_size=50_000),
            )
            result = backfill.run(on_batch=lambda b: print(b.run.progress))
    """

    outage = "backfill_persistence_failed"
    prepared = True  # every batch runs the same ledger and range statements

    def __init__(
        self,
        source_dsn: str,
        target_dsn: str,
        table: TableName | str,
        *,
        cursor: str | None,
        target_table: TableName | str | None = None,
        ledger: LedgerConfig | None = None,
        lower: object = None,
        upper: object = None,
        label: str = "",
        options: BackfillOptions | None = None,
        connection_options: ConnectionOptions | None = None,
        target_connection_options: ConnectionOptions | None = None,
        on_phase: PhaseHook | None = None,
        keyless_load: bool = False,
    ) -> None:
        if cursor is None:
            raise engine_error("backfill_cursor_missing", "No cursor column was given.")
        # A TypeError for anything else (the session options this name took before it).
        self.options = build_options(BackfillOptions, options, caller="Backfill")
        super().__init__(
            source_dsn, target_dsn, table, cursor=cursor, target_table=target_table,
            ledger=ledger or LedgerConfig(), label=label,
            connection_options=connection_options
            or ConnectionOptions(application_name="dpone-backfill"),
            target_connection_options=target_connection_options, on_phase=on_phase,
        )  # fmt: skip
        self.ledger = RunLedger(self.ledger_config.schema)
        self.marks = FixedMark(self.options.settle_timeout, self.options.write_pause)
        self.lower, self.upper = lower, upper
        self.keyless_load = keyless_load
        self._shape: TableShape | None = None
        self._scope: BackfillScope | None = None

    def ensure_ledger(self, conn: Connection) -> None:
        """Creates or migrates the ledger on a new ledger session."""
        self.ledger.ensure(conn)

    # -- planning ---------------------------------------------------------------------------

    def _resolve(self, sessions: Sessions) -> tuple[TableShape, BackfillScope]:
        if self._shape is None or self._scope is None:
            shape = resolve_shape(
                sessions.source, sessions.target, self.source, self.target, self.cursor,
                keyless_load=self.keyless_load,
            )  # fmt: skip
            src_db = str(sessions.source.info.dbname)
            tgt_db = str(sessions.target.info.dbname)
            if (sessions.source.info.host, sessions.source.info.port, src_db, self.source) == (
                sessions.target.info.host,
                sessions.target.info.port,
                tgt_db,
                self.target,
            ):
                raise engine_error("plan_invalid", "The target table is the source table.")
            lower = (
                None if self.lower is None else canonical_cursor(sessions.source, shape, self.lower)
            )
            upper = (
                None if self.upper is None else canonical_cursor(sessions.source, shape, self.upper)
            )
            self._scope = scope_for(
                shape, src_db, tgt_db, label=self.label, lower=lower, upper=upper
            )
            self._shape = shape
        return self._shape, self._scope

    @property
    def run_id(self) -> str:
        """The run's id (reads both catalogs on first use)."""
        return run_id_for(self.guard(lambda s: self._resolve(s)[1]))

    def plan(self) -> BackfillRun:
        """Loads the run of this scope, or takes the high-water mark and stores a new run.

        Raises:
            EngineError: ``plan_invalid``, ``backfill_cursor_missing``,
                ``destination_expansion_incomplete``, ``backfill_high_water_mark_unsettled``,
                ``backfill_run_invalid``, ``backfill_persistence_failed``.
        """
        return self.guard(self._plan)

    def _plan(self, sessions: Sessions) -> BackfillRun:
        if not self.keyless_load:  # a load that deferred the key ended or stopped: finish it
            build_key(sessions.target, self.target)
        shape, scope = self._resolve(sessions)
        existing = self.ledger.fetch(sessions.ledger, run_id_for(scope))
        if existing is not None:
            return existing
        self._refuse_changed_columns(sessions, scope)
        mark = self.marks.take(sessions.source, shape, shape.where(scope.lower, scope.upper))
        sized = width_batch_size(sessions.source, shape)
        run = start_run(
            scope, mark.boundary, rows_at_boundary=mark.rows, boundary_evidence=mark.evidence,
            planned=() if sized is None else (sized,),
        )  # fmt: skip
        try:
            with transaction(sessions.ledger, IsolationLevel.READ_COMMITTED, read_only=False):
                return self.ledger.insert(sessions.ledger, run)
        except BaseException:
            sessions.abandon()
            raise

    def build_key(self) -> bool:
        """Builds the target's deferred primary key, if it is deferred (:mod:`.deferred_key`):
        what the run that loaded the target keyless calls once its batches are in.

        Returns:
            True when this call built the key.

        Raises:
            EngineError: ``backfill_key_duplicated`` (nothing changed),
                ``backfill_persistence_failed``.
        """
        return self.guard(lambda s: build_key(s.target, self.target))

    def _refuse_changed_columns(self, sessions: Sessions, scope: BackfillScope) -> None:
        """A run of the same tables, cursor and range that stopped under other columns would be
        shadowed by a new run of this scope: refused, so its committed batches are not
        silently left with stale columns."""
        same = ("label", "source", "target", "cursor", "lower", "upper")
        for run in self.ledger.runs(sessions.ledger, BackfillStatus.IN_PROGRESS):
            theirs = run.scope
            if all(getattr(theirs, f) == getattr(scope, f) for f in same):
                raise engine_error(
                    "backfill_schema_changed",
                    f"Run {run.run_id} of {self.source} stopped at checkpoint "
                    f"{run.progress.checkpoint} copying columns {list(theirs.columns)} "
                    f"({theirs.copy_format}); the source now has {list(scope.columns)} "
                    f"({scope.copy_format}), key {list(scope.key)}.",
                )

    def load(self) -> BackfillRun | None:
        """The last committed state of this scope's run (``None`` before the first plan)."""
        return self.guard(lambda s: self.ledger.fetch(s.ledger, run_id_for(self._resolve(s)[1])))

    def state(self) -> ScopeState:
        """The run's state from the ledger (times, status, mark) and whether the source holds
        rows of the range past the mark (one index probe; nothing is scanned)."""

        def read(s: Sessions) -> ScopeState:
            shape, scope = self._resolve(s)
            return scope_state(s, self.ledger, shape, run_id_for(scope), (scope.lower, scope.upper))

        return self.guard(read)

    def receipts(self) -> list[BatchReceipt]:
        """Every committed batch receipt, in order."""
        return self.guard(lambda s: self.ledger.receipts(s.ledger, run_id_for(self._resolve(s)[1])))

    def verify(self) -> BackfillRun:
        """Checks the run's integrity and its whole checkpoint chain; returns the run.

        Raises:
            EngineError: ``backfill_run_invalid`` naming the first broken link.
        """
        run = self.load()
        if run is None:
            raise engine_error("backfill_run_invalid", "This scope has no run yet; plan first.")
        verify_chain(run, self.receipts())
        return run

    # -- running ----------------------------------------------------------------------------

    def apply(self, request: BatchRequest) -> BatchResult:
        """Copies the batch ``request`` names and commits it with its receipt, or replays it.

        :meth:`batches` builds each request with :func:`rules.next_request`; an orchestrator
        that keeps its own state may send its own. A failure that hits the COMMIT (the response
        is lost) is resolved here: if the ledger holds the batch's receipt, it is returned as a
        replay.

        Raises:
            EngineError: ``backfill_checkpoint_stale``, ``backfill_batch_changed``,
                ``backfill_batch_unordered``, ``backfill_record_changed``,
                ``backfill_run_invalid`` or ``backfill_persistence_failed``; the durable
                checkpoint is intact.
        """
        shape, _ = self.guard(self._resolve)
        sessions = self.open()
        ledger_pid = sessions.ledger.info.backend_pid
        try:
            return copy_batch(
                sessions, self.ledger, shape, request, on_phase=self.on_phase,
                on_changed=self.options.on_changed,
            )  # fmt: skip
        except (psycopg.Error, LostCommitError) as exc:
            failed = exc if isinstance(exc, psycopg.Error) else exc.__cause__
            assert isinstance(failed, psycopg.Error)
            error = self.database_failure(failed, sessions)
            self.close()
            resolved = self._lost_response(request, ledger_pid)
            if resolved is not None:
                return resolved
            raise error from failed
        except BaseException:
            self.close()
            raise

    def _lost_response(self, request: BatchRequest, ledger_pid: int) -> BatchResult | None:
        """After a failure that may have hit the COMMIT: the stored receipt, if it committed.

        Once the old ledger session is gone its transaction has ended one way or the other, and
        the ledger says which.

        Raises:
            EngineError: ``backfill_persistence_failed`` when the old ledger session is still
                running after the wait (whether the batch committed is not known yet).
        """
        self.after_lost_commit(ledger_pid)

        def look(s: Sessions) -> BatchReceipt | None:
            return replay(request, self.ledger.receipt(s.ledger, request.run_id, request.batch_id))

        try:
            stored = self.guard(look)
            durable = self.load()
        except EngineError:
            return None
        if stored is None or durable is None:
            return None
        return BatchResult(durable, stored, replayed=True)

    def batches(self, max_batches: int | None = None) -> Iterator[BatchResult]:
        """Plans (or loads) the run, then yields each committed batch until the mark.

        Args:
            max_batches: Stop after this many batches (``None``: until the run succeeds).

        Yields:
            Each committed (or replayed) batch with the run after it.
        """
        run = self.plan()
        done = 0
        while run.status in (BackfillStatus.PLANNED, BackfillStatus.IN_PROGRESS):
            if max_batches is not None and done >= max_batches:
                return
            result = self.apply(next_request(run, batch_size_for(run, self.options.batch_size)))
            run = result.run
            done += 1
            yield result

    def run(
        self,
        on_batch: Callable[[BatchResult], None] | None = None,
        *,
        max_batches: int | None = None,
        reconcile: bool | None = None,
        reverify: bool = False,
    ) -> BackfillResult:
        """Runs the backfill to its mark (or ``max_batches``), then reconciles.

        Args:
            on_batch: Called after each committed batch with its receipt and the run (the
                checkpoint, counts, mark and remaining estimate are in ``result.run.progress``).
            max_batches: Stop after this many batches.
            reconcile: Reconcile once the run reaches its mark (again while it is blocked);
                ``None``: as the options say (``BackfillOptions.reconcile``, true by default).
            reverify: Reconcile again a run that already succeeded (a refresh): the target is
                verified against the source as it is now; a range the source changed since is
                rewritten with ``on_changed="repair"``, or blocks the run with
                ``backfill_record_changed`` (the default). Without it a succeeded run is left
                as it is.

        Raises:
            BackfillReconciliationError: a range still differs after repair (run is blocked).
            EngineError: any other code; the last durable checkpoint is intact.
        """
        committed = replayed = 0
        run = None
        for result in self.batches(max_batches):
            run = result.run
            committed += not result.replayed
            replayed += result.replayed
            if on_batch is not None:
                on_batch(result)
        run = run or self.plan()
        report = None
        refresh = reverify and run.status is BackfillStatus.SUCCEEDED
        if reconcile is None:
            reconcile = self.options.reconcile
        if reconcile and (refresh or needs_reconciliation(run)):
            report = self.reconcile()
            run = self.load() or run
            if not report.ok:
                raise BackfillReconciliationError(report)
        return BackfillResult(run, committed, replayed, report)

    def reconcile(self, *, repair: bool = True, row_versions: bool = True) -> ReconciliationReport:
        """Compares source and target per batch range and repairs what it can.

        A range nobody wrote since its batch is proven equal by row versions; every other range
        by count and exact content hash (``row_versions=False`` hashes every range). A differing
        range gets its missing rows; with ``on_changed="repair"`` it is rewritten from the
        source's snapshot (changed rows updated, deleted rows deleted).

        Records every range check in the ledger; a run at its mark becomes ``succeeded`` (label
        ``several_snapshots_reconciled`` when several batch snapshots were used) or ``blocked``.
        """
        return self.guard(lambda s: self._reconcile(s, repair, row_versions))

    def _reconcile(
        self, sessions: Sessions, repair: bool, row_versions: bool
    ) -> ReconciliationReport:
        build_key(sessions.target, self.target)  # a range is read by the key's index
        shape, scope = self._resolve(sessions)
        reader = self._connect(self.target_dsn, "target")
        try:
            return reconcile_run(
                sessions, reader, self.ledger, shape, run_id_for(scope), repair=repair,
                row_versions=row_versions, on_changed=self.options.on_changed,
            )  # fmt: skip
        finally:
            reader.close()
