"""The one load path: stage -> schema change -> sink -> commit -> settle.

Every load into the PostgreSQL target goes through here, whatever read the rows (a snapshot
copy's strategy, a generic source):

1. **stage**: in one target transaction, the extensions and user-defined types the plans
   create come first (:mod:`.target_types`; enum labels to add commit just before, on their
   own, as PostgreSQL requires), then each table gets a staging table under the staging guard
   (:func:`~dpone_dagster.lifecycle.owned_staging_handle`) and its rows are written into it (a
   partitioned copy's workers fill theirs first, from sessions of their own); the rows the
   target took must equal the rows the extraction receipt counted;
2. **schema change**: what the plan decided for an existing target whose columns differ
   (:mod:`.schema_change`: add, widen, keep) is applied in the same transaction: to the staging
   table that will be swapped in as the target, or to the target itself just before its sink
   (its ``ALTER TABLE`` is taken in short attempts, :mod:`.lock_wait`; once granted, the lock
   is held from there to the commit, so a reader waits, then sees the new columns with their
   data; a failure leaves the old schema and rows);
3. **sink**: each staging table is applied to its target (:mod:`.sinks`), same transaction;
4. **commit**: the target's answer to COMMIT is the evidence of the outcome;
5. **settle**: :func:`settle_load` is the one place that turns how a load ended into the
   terminal outcome of its artifacts: ``success`` once the COMMIT was acknowledged,
   ``retain_commit_unknown`` when its acknowledgement was lost, ``abort`` on any earlier failure
   or interruption. Staging tables are dropped and the target is left as it was on every path but
   ``success``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Protocol, TypeVar

import psycopg

from dpone_dagster.lifecycle import (
    DponeError,
    ExtractionLifecycleReceipt,
    TerminalOutcome,
    owned_staging_handle,
    redact,
)

from .catalog import ensure_schema
from .connection import Connection, ConnectionOptions, set_transaction_mode
from .evidence import RowVersionEvidence, load_writers
from .identifiers import TableName
from .lock_wait import under_lock_wait
from .schema_change import ColumnChange, alter_statement, apply_changes
from .sinks import SinkResult, apply_sink
from .staging import staging_table
from .target_plan import Sink, TablePlan
from .target_types import commit_enum_labels, create_types

R = TypeVar("R")


class TargetCommitUnknownError(DponeError):
    """COMMIT was sent to the target but its acknowledgement never arrived."""


class Loadable(Protocol):
    """What the load path needs of one table's rows (an extraction artifact)."""

    @property
    def source_label(self) -> str:
        """What was read, for messages."""

    @property
    def extraction_receipt(self) -> ExtractionLifecycleReceipt:
        """The extraction's latest receipt."""

    @property
    def exact_rows(self) -> bool:
        """The rows reach staging exactly as the source stores them (binary COPY between equal
        types, or ``INSERT ... SELECT`` in one database): row versions can then prove them."""

    @property
    def writers(self) -> Sequence[int]:
        """64-bit ids of other transactions that wrote the rows into staging (none: the load's
        own transaction did)."""

    def load_into(self, conn: Connection, staging: TableName) -> int:
        """Writes the rows into ``staging`` in ``conn``'s transaction; the rows the target took."""


@dataclass
class TableLoad:
    """What the target did with one table of a load (filled in as the load goes).

    Attributes:
        plan: The table's plan.
        rows_loaded: Rows the staging table took, by the target's command tag.
        sink_result: What the sink did.
        row_versions: Who wrote the target's rows, when a ``replace`` wrote them all exactly
            (the reconciliation proves them from it without hashing).
    """

    plan: TablePlan
    rows_loaded: int | None = None
    sink_result: SinkResult | None = None
    row_versions: RowVersionEvidence | None = None


def begin_read_write(target: Connection) -> None:
    """The load's usual transaction: ``READ COMMITTED READ WRITE``."""
    set_transaction_mode(target, psycopg.IsolationLevel.READ_COMMITTED, read_only=False)


StagingFiller = Callable[[Connection, str, Sequence[TableName]], None]
"""Fills staging tables from other sessions before the load writes its own rows."""


class TargetLoad:
    """One load into the target: every table staged, applied and committed together.

    Args:
        target: The target session (idle, not autocommit).
        target_dsn: The target DSN (a broken session's staging tables are dropped from a new one).
        plans: The tables' plans.
        sink: How each target takes its rows.
        new_keys_expected: For ``merge``: try a plain ``INSERT`` first (see
            :func:`~dpone_dagster.postgres.sinks.apply_sink`).
        options: Options of the short session that adds enum labels before the load.

    Attributes:
        tables: What the target did with each table, in plan order.
    """

    def __init__(
        self,
        target: Connection,
        target_dsn: str,
        plans: Sequence[TablePlan],
        sink: Sink,
        *,
        new_keys_expected: bool = False,
        options: ConnectionOptions | None = None,
    ) -> None:
        self.target = target
        self.options = options
        self.target_dsn = target_dsn
        self.sink: Sink = sink
        self.new_keys_expected = new_keys_expected
        self.tables = [TableLoad(plan) for plan in plans]

    def run(
        self,
        rows: Callable[[int], Loadable],
        *,
        begin: Callable[[Connection], None] = begin_read_write,
        fill_stagings: StagingFiller | None = None,
        before_commit: Callable[[Connection], None] | None = None,
        commit: bool = True,
    ) -> None:
        """Stages every table, applies the sinks and commits.

        Args:
            rows: The rows of the table at an index (opened when the load reaches it).
            begin: Sets (or begins) the target transaction.
            fill_stagings: Fills the staging tables from other sessions first.
            before_commit: Writes what must commit with the rows (a ledger's state), in the
                load's transaction after every sink.
            commit: Commit the load's transaction; ``False`` leaves it open for the caller to
                commit (a cursor batch's protocol, which answers a lost COMMIT itself). The
                staging tables are gone either way: each sink drops or renames its own.

        Raises:
            TargetCommitUnknownError: the COMMIT's acknowledgement was lost.
            DponeError: ``copy_rows_mismatch`` and the errors of the rows' sources.
            psycopg.Error: the target failed or refused the COMMIT (nothing committed).
        """
        types = [table.plan.target_types for table in self.tables]
        commit_enum_labels(self.target_dsn, self.options, [x for t in types for x in t.labels])
        begin(self.target)
        with ExitStack() as stack:
            guards, stagings = [], []
            create_types(self.target, types)
            for table in self.tables:
                if not table.plan.target_exists:
                    ensure_schema(self.target, table.plan.target.schema)
                staging = staging_table(self.target, table.plan, dsn=self.target_dsn)
                guards.append(stack.enter_context(owned_staging_handle(staging)))
                stagings.append(staging.name)
                if table.plan.swap:  # the staging table becomes the target: it takes the change
                    apply_changes(self.target, staging.name, table.plan.schema_changes)
            if fill_stagings is not None:
                fill_stagings(self.target, self.target_dsn, stagings)
            for index, (table, staging_name) in enumerate(zip(self.tables, stagings, strict=True)):
                self._load(table, rows(index), staging_name)
            if before_commit is not None:
                before_commit(self.target)
            if commit:
                commit_target(self.target)
            for guard in guards:
                guard.transfer(None)

    def _load(self, table: TableLoad, source: Loadable, staging: TableName) -> None:
        loaded = source.load_into(self.target, staging)
        table.rows_loaded = loaded
        counted = source.extraction_receipt.row_count
        if counted != loaded:
            raise DponeError(
                "copy_rows_mismatch",
                f"The target took {loaded} rows of {source.source_label}, but the extraction "
                f"receipt counts {counted}.",
                ["Report this with both counts: nothing was committed."],
            )
        if not table.plan.swap:
            evolve_target(self.target, table.plan.target, table.plan.schema_changes)
        table.sink_result = apply_sink(
            self.target, table.plan, staging, self.sink, loaded,
            new_keys_expected=self.new_keys_expected,
        )  # fmt: skip
        if self.sink == "replace" and source.exact_rows:
            table.row_versions = load_writers(
                self.target, table.plan.target, table.plan.columns, others=source.writers
            )


def evolve_target(conn: Connection, target: TableName, changes: Sequence[ColumnChange]) -> None:
    """Runs the ``ALTER TABLE`` of ``changes`` on an existing target, under the lock wait
    (:func:`~.lock_wait.under_lock_wait`): its readers never queue behind it for longer than one
    attempt; nothing runs when no change needs DDL.

    Raises:
        LockTimeoutError: ``target_lock_timeout`` at the session's ``lock_wait`` deadline.
    """
    statement = alter_statement(target, changes)
    if statement is not None:
        under_lock_wait(conn, [target], lambda: conn.execute(statement), doing="evolve its columns")


def commit_target(conn: Connection) -> None:
    """Commits the target transaction; the answer decides the terminal outcome.

    Raises:
        TargetCommitUnknownError: ``target_commit_unknown`` when the session was lost while COMMIT
            was in flight: the target may or may not hold the rows.
        psycopg.Error: the server answered with an error (it did not commit).
    """
    try:
        conn.commit()
    except psycopg.Error as exc:
        if conn.broken or conn.closed:
            raise TargetCommitUnknownError(
                "target_commit_unknown",
                "COMMIT was sent to the target but its acknowledgement was lost "
                f"({redact(str(exc)).strip()}): the target may or may not hold the rows.",
                [
                    "Check the target table before rerunning; a rerun with replace or merge "
                    "is safe, an append could add the rows twice.",
                    "Retained files (whole COPY) are the evidence of what was sent.",
                ],
            ) from exc
        raise


def settle_load(
    step: Callable[[], None],
    *,
    settle: Callable[[TerminalOutcome], R],
    failure: Callable[[Exception], DponeError],
    error: Callable[[DponeError, R], DponeError],
) -> None:
    """Runs one step of a load; if it fails, settles every artifact by how it failed.

    This is where a failed load's terminal outcome is decided: a lost COMMIT acknowledgement
    retains (``retain_commit_unknown``), any other failure aborts, and an interruption (a
    ``BaseException`` such as Dagster's) aborts and propagates unchanged.

    Args:
        step: The step.
        settle: Settles every artifact with an outcome and returns the report.
        failure: The stable error of a failure (read before settling closes the sessions).
        error: The error raised, from the stable error and the settled report.

    Raises:
        DponeError: ``error(...)`` of the failure; the original is its cause.
    """
    try:
        step()
    except TargetCommitUnknownError as exc:
        raise error(exc, settle(TerminalOutcome.RETAIN_COMMIT_UNKNOWN)) from exc
    except Exception as exc:
        stable = failure(exc)
        raise error(stable, settle(TerminalOutcome.ABORT)) from exc
    except BaseException:  # interrupted (Dagster, Ctrl-C): settle, then let it through
        settle(TerminalOutcome.ABORT)
        raise
