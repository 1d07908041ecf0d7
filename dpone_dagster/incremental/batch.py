"""One batch of a stream: read under its own snapshot, merged through the one load path, and
committed with its receipt and the stream's new state in ONE target transaction, through the
cursor engine's batch-commit protocol (:mod:`dpone_dagster.cursor.batch_commit`).

1. The target transaction begins with the stream's advisory lock and its durable state: the
   batch starts strictly after the state's checkpoint, so two runs of one stream (or a retry of
   a killed one) never copy a batch twice.
2. The source opens a ``REPEATABLE READ READ ONLY`` transaction (its snapshot and clock go into
   the batch's lifecycle receipt) and the next ``batch_size`` rows in ``(cursor, key)`` order,
   up to the run's mark, stream as COPY into the load path's staging table
   (:class:`~dpone_dagster.postgres.load.TargetLoad`), which applies the ``merge`` sink.
3. A batch with fewer rows than ``batch_size`` reached the mark: in the same source snapshot,
   after the merge, the delete detection compares both key sets (:mod:`.deletes`).
4. The receipt and the state (compare-and-swap) are written, then the protocol COMMITs; a lost
   answer to that COMMIT is waited out and the run continues from the durable state."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from psycopg import IsolationLevel

from dpone_dagster.core.read_window import ReadWindow, close_read_window, open_read_window
from dpone_dagster.core.sessions import Sessions, transaction
from dpone_dagster.cursor.batch_commit import Answered, Landed, PhaseHook, commit_batch
from dpone_dagster.cursor.cursor_ledger import StreamLedger
from dpone_dagster.cursor.stream_documents import (
    Checkpoint,
    RunInProgress,
    StreamReceipt,
    StreamState,
)
from dpone_dagster.lifecycle import ExtractionLifecycleReceipt
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import copy_in_statement, copy_out_statement, relay
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.load import TargetLoad
from dpone_dagster.postgres.schema_change import ColumnChange
from dpone_dagster.postgres.target_plan import (
    Sink,
    TableMapping,
    TablePlan,
    TargetRules,
    new_target_plan,
    plan_target,
)
from dpone_dagster.postgres.target_types import TargetTypes

from .deletes import ensure_soft_column, revive
from .options import IncrementalOptions
from .repair import repair_keys
from .row_count import moved
from .shape import StreamCatalogs, StreamShape, read_catalogs
from .sweep import SweepLedger
from .verify import FinalCheck, RunCheck, final_check


@dataclass
class _Rows:
    """The batch's rows, as the load path takes them (a :class:`Loadable`)."""

    src: Connection
    shape: StreamShape
    plan: TablePlan
    run: RunInProgress
    size: int
    window: ReadWindow
    on_phase: PhaseHook
    receipt: ExtractionLifecycleReceipt | None = None
    last: Checkpoint | None = None
    rows: int = 0
    revived: int = 0
    exact_rows: bool = False
    writers: Sequence[int] = field(default_factory=tuple)

    @property
    def source_label(self) -> str:
        """What is read."""
        return str(self.shape.source)

    @property
    def extraction_receipt(self) -> ExtractionLifecycleReceipt:
        """The batch's lifecycle receipt (completed once its rows were read)."""
        return self.receipt or self.window.authority.receipt

    def load_into(self, conn: Connection, staging: TableName) -> int:
        """Streams the batch into ``staging``; notes its last ``(cursor, key)``."""
        self.on_phase("copy")
        # The plan's columns: the source's in this batch's snapshot (the target evolved to them).
        moving = replace(self.shape, columns=self.plan.columns)
        query, params = moving.select_batch(
            self.run.lower, self.run.checkpoint, self.run.mark, self.size
        )
        fmt = self.plan.copy_format
        copy_in = copy_in_statement(staging, list(self.plan.column_names), fmt)
        moved = relay(self.src, copy_out_statement(query, fmt), conn, copy_in, params=params)
        self.receipt = close_read_window(self.src, self.window, moved.rows_out, moved.bytes)
        self.rows = moved.rows_in
        row = conn.execute(self.shape.last_row(staging)).fetchone()
        if row is not None:
            self.last = Checkpoint(cursor=str(row[0]), key=tuple(row[1]))
        if self.plan.target_exists:
            self.revived = revive(conn, self.shape, staging)
        self.on_phase("apply")
        return self.rows


@dataclass(frozen=True)
class BatchOutcome:
    """A committed batch: the state after it, its receipt, what its load changed in the
    target's schema (:mod:`dpone_dagster.postgres.schema_change`) and what it created there
    for the table's types (:mod:`dpone_dagster.postgres.target_types`; the ``VIRTUAL``
    generated columns a target before PostgreSQL 18 got as ``STORED``)."""

    state: StreamState
    receipt: StreamReceipt
    schema_changes: tuple[ColumnChange, ...] = ()
    target_types: TargetTypes = field(default_factory=TargetTypes)
    virtual_as_stored: tuple[str, ...] = ()


@dataclass(frozen=True)
class MergeBatch:
    """How a moving mark's batch lands (a :class:`~dpone_dagster.cursor.batch_commit.Landing`):
    its rows merged into the target through the one load path, then, after the run's final
    batch, its deletes found and its check run, in the batch's transaction.

    Attributes:
        sessions: The run's sessions (the ledger's is the target's).
        ledger: The stream's records.
        shape: The stream.
        stream_id: The stream's id.
        number: The run the batch belongs to.
        options: How the stream runs (batch size, deletes, the check and repair, schema
            changes, fillfactor), whole.
        target_dsn: The target database (the load's staging guard drops from a fresh session).
        create_extensions: Extensions a target the batch creates may get.
        on_phase: The batch's phase calls.
    """

    sessions: Sessions
    ledger: StreamLedger
    shape: StreamShape
    stream_id: str
    number: int
    options: IncrementalOptions
    target_dsn: str
    create_extensions: Collection[str] = ()
    on_phase: PhaseHook = lambda _: None

    def admit(self, _: Connection, state: StreamState | None) -> StreamState | Answered[None]:
        """The stream's state when its run ``number`` is still in progress, else no batch."""
        if state is None or state.run is None or state.run.number != self.number:
            return Answered(None)  # the run is over: another process completed it
        return state

    def land(self, state: StreamState) -> tuple[Landed[StreamState, StreamReceipt], TablePlan]:
        """Merges the next rows after the state's checkpoint; the state and receipt after it,
        and the load's plan (what it changed in the target's schema and types)."""
        assert state.run is not None
        src, tgt, how = self.sessions.source, self.sessions.target, self.options
        with transaction(src, IsolationLevel.REPEATABLE_READ, read_only=True):
            window = open_read_window(src)
            plan = stream_plan(src, tgt, self.shape, how, create_extensions=self.create_extensions)
            rows = _Rows(src, self.shape, plan, state.run, how.batch_size, window, self.on_phase)
            # The initial load's keys are new to the target, bar a late commit's.
            initial = state.run.lower is None and state.mark is None
            load = TargetLoad(tgt, self.target_dsn, [plan], Sink.MERGE, new_keys_expected=initial)
            landed: list[Landed[StreamState, StreamReceipt]] = []

            def finish(conn: Connection) -> None:
                landed.append(self._finish(conn, state, rows, load))

            load.run(lambda _: rows, begin=lambda _: None, before_commit=finish, commit=False)
        return landed[0], plan

    def _finish(
        self, conn: Connection, state: StreamState, rows: _Rows, load: TargetLoad
    ) -> Landed[StreamState, StreamReceipt]:
        """After the final batch, finds deletes and verifies (as asked), repairs what differs
        (with ``repair``); then derives the receipt and the new state."""
        run, how, shape = state.run, self.options, self.shape
        assert run is not None
        final = rows.rows < rows.size
        found = FinalCheck()
        if final:
            ensure_soft_column(conn, shape)
            at = rows.window.authority.receipt.snapshot_acquired_at or run.taken_at
            check = RunCheck(how.check, how.sweep, SweepLedger(self.ledger.store),
                             state.stream_id, run.lower)  # fmt: skip
            found = final_check(rows.src, conn, shape, deletes=how.deletes, verify=how.reconcile,
                                how=check, mark=run.mark, at=at)  # fmt: skip
            if how.repair and found.unexplained and found.verification is not None:
                found = _repaired(rows.src, conn, shape, rows.plan, found, at)
        sink = load.tables[0].sink_result
        inserted, updated = (sink.rows_inserted, sink.rows_updated) if sink else (0, 0)
        live = found.target_rows
        if live is None:
            live = moved(state.target_rows, gained=inserted + rows.revived, lost=found.deleted)
        receipt = StreamReceipt(
            stream_id=state.stream_id, sequence=state.sequence + 1, run=run.number,
            after=run.checkpoint, last=rows.last, rows=rows.rows, inserted=inserted,
            updated=updated, deleted=found.deleted, keys_compared=found.keys_compared,
            final=final, extraction=rows.extraction_receipt, verification=found.verification,
        )  # fmt: skip
        progressed = run.model_copy(
            update={"checkpoint": rows.last or run.checkpoint, "inserted": run.inserted + inserted,
                    "updated": run.updated + updated, "batches": run.batches + 1}
        )  # fmt: skip
        after = state.model_copy(
            update={"revision": state.revision + 1, "sequence": state.sequence + 1,
                    "run": progressed, "target_rows": live}
        )  # fmt: skip
        if final:
            after = complete_run(after, progressed)
        return Landed(after, receipt)


def copy_batch(landing: MergeBatch) -> BatchOutcome | None:
    """Copies and commits the next batch of ``landing``'s run through the cursor engine's
    batch-commit protocol (:func:`~dpone_dagster.cursor.batch_commit.commit_batch`).

    ``on_phase`` is called with ``"copy"`` (the rows start moving), ``"apply"`` (they are
    staged; the merge follows), ``"commit"`` (just before the COMMIT) and ``"committed"``. The
    batch plans its load from both catalogs inside its own transactions, so a source whose
    columns changed evolves the target (``schema_changes="evolve"``) with the batch's rows, in
    the batch's commit. A target the batch creates takes the options' ``fillfactor`` and brings
    the user-defined types its columns need (the extensions they come from only when named in
    ``create_extensions``). A verified run's final batch checks it as the options' ``check``
    says (its scope and the sweep's budget, :class:`.verify.RunCheck`); with ``repair``, the
    keys it finds differing for no known reason are rewritten from the source in the same
    transaction (:mod:`.repair`).

    Returns:
        The committed batch, or ``None`` when the run is no longer in progress (another
        process completed it).

    Raises:
        EngineError: ``incremental_stream_stale`` (the compare-and-swap lost).
        SchemaChangeError: ``schema_change_incompatible``; nothing of the batch was written.
        LostCommitError: the COMMIT's answer was lost (the caller waits the session out and
            continues from the durable state).
        DponeError, psycopg.Error: the load failed; nothing of the batch was committed (every
            open transaction is rolled back first).
    """
    done = commit_batch(
        landing.sessions, landing.ledger, landing.stream_id, landing.admit, landing.land,
        on_phase=landing.on_phase,
    )  # fmt: skip
    if isinstance(done, Answered):
        return None
    plan = done.landing
    return BatchOutcome(
        done.after, done.receipt, plan.schema_changes, plan.target_types, plan.virtual_as_stored
    )


def stream_plan(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    options: IncrementalOptions,
    found: StreamCatalogs | None = None,
    *,
    create_extensions: Collection[str] = (),
) -> TablePlan:
    """The load's plan of the stream's table (the soft-delete column is the stream's own), from
    both catalogs (``found``, else read now), as the options' ``schema_changes`` allow; a
    target it creates takes the options' ``fillfactor`` and the types its columns need
    (extensions only when named in ``create_extensions``).

    Raises:
        SchemaChangeError: ``schema_change_incompatible`` (see :func:`.schema_change.decide`).
    """
    found = found or read_catalogs(src, tgt, shape.source, shape.target)
    own = () if shape.soft_column is None else (shape.soft_column,)
    mapping = TableMapping(shape.source, shape.target)
    fillfactor = options.fillfactor
    packed = fillfactor is None or fillfactor == 100  # PostgreSQL's own default: no option
    plan = new_target_plan(mapping, found.source, src, tgt)
    plan = replace(plan, storage=() if packed else (f"fillfactor={fillfactor}",))
    rules = TargetRules(options.schema_changes, own, create_extensions)
    return plan_target(tgt, plan, Sink.MERGE, rules=rules, found=found.target)


def _repaired(
    src: Connection, tgt: Connection, shape: StreamShape, plan: TablePlan, found: FinalCheck,
    at: datetime,
) -> FinalCheck:  # fmt: skip
    """Rewrites the keys ``found`` names from the source; the check, labelled repaired (its
    count of the target, when it took one, moved by what the repair wrote)."""
    done = repair_keys(src, tgt, shape, plan, found.unexplained, at)
    check = found.verification
    assert check is not None
    repaired = check.model_copy(
        update={"ok": True, "unexplained": 0, "repaired_keys": len(found.unexplained),
                "repaired_rows": done.rows, "repaired_ranges": check.differing_ranges}
    )  # fmt: skip
    rows = moved(found.target_rows, gained=done.inserted + done.revived, lost=done.deleted)
    return replace(found, verification=repaired, unexplained=(), target_rows=rows)


def complete_run(state: StreamState, run: RunInProgress) -> StreamState:
    """The state once ``run`` reached its mark: the mark advances, the run is over."""
    return state.model_copy(
        update={"mark": run.mark, "mark_taken_at": run.taken_at, "runs": state.runs + 1,
                "unsettled": run.unsettled, "rescan_from": run.rescan_from, "run": None}
    )  # fmt: skip
