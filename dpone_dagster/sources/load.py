"""Loading a generic source into PostgreSQL through the one load path.

1. ``extract()`` maps the source's types (an unmappable type fails here, before any row moves
   and before the target is touched); the target side is planned from the target's catalog.
2. The load path of every copy (:mod:`dpone_dagster.postgres.load`): a staging table under the
   staging guard (shaped as the sink needs: the target's, or the source's for a target this
   load creates), the rows written into it with ``COPY ... write_row()``, the sink applied, one
   COMMIT whose answer settles the artifact: ``success``, ``retain_commit_unknown`` when the
   acknowledgement was lost, ``abort`` on any earlier failure (or interruption). A failure raises
   :class:`SourceLoadError` carrying the report; the staging table is dropped and the target is
   left as it was.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dpone_dagster.core.options import build_options
from dpone_dagster.lifecycle import (
    ArtifactTerminalReceipt,
    DponeError,
    ExtractionLifecycleReceipt,
    SnapshotLabel,
    TerminalOutcome,
    owned_staging_handle,
)
from dpone_dagster.postgres import Column, ConnectionOptions, TableName
from dpone_dagster.postgres.connection import Connection, connect, set_transaction_mode
from dpone_dagster.postgres.failures import database_error
from dpone_dagster.postgres.load import TargetLoad, begin_read_write, settle_load
from dpone_dagster.postgres.schema_change import ColumnChange, SchemaChanges
from dpone_dagster.postgres.sinks import SinkResult
from dpone_dagster.postgres.staging import (
    PostgresStagingTable,
    staging_name_for,
    table_definition,
)
from dpone_dagster.postgres.target_plan import Sink, TablePlan, TargetRules, plan_target

from .copy_options import SourceCopyOptions
from .protocol import ProgressHook, RowStreamArtifact, SourceAdapter, SourceColumn


def target_columns(columns: Sequence[SourceColumn]) -> list[Column]:
    """The source's columns as the catalog would describe them in a target it creates."""
    return [
        Column(
            name=c.name,
            type_sql=c.pg_type,
            type_oid=0,
            not_null=not c.nullable,
            default_sql=None,
            generated=False,
            user_type=False,
            type_schema="pg_catalog",
            type_name=c.pg_type,
        )
        for c in columns
    ]


@dataclass(frozen=True)
class SourceLoadReport:
    """What one generic load did.

    Attributes:
        source_label: What was read (no secrets).
        target: The target table.
        sink: The sink asked for.
        outcome: The artifact's terminal outcome.
        extraction_receipt: The extraction's latest receipt (no snapshot claim, ever).
        terminal_receipt: The artifact's terminal receipt.
        rows_loaded: Rows the staging COPY's command tag reported (None before it finished).
        sink_result: What the sink did (None when the load failed before it ran).
        schema_changes: What the load changed in the existing target's schema (applied only
            when the outcome is ``success``).
    """

    source_label: str
    target: TableName
    sink: Sink
    outcome: TerminalOutcome
    extraction_receipt: ExtractionLifecycleReceipt
    terminal_receipt: ArtifactTerminalReceipt | None
    rows_loaded: int | None
    sink_result: SinkResult | None
    schema_changes: tuple[ColumnChange, ...] = ()

    @property
    def sink_method(self) -> str | None:
        """What the sink did (``create``, ``swap``, ``rewrite``, ``append``, ``merge``)."""
        return None if self.sink_result is None else self.sink_result.method

    @property
    def snapshot_label(self) -> SnapshotLabel:
        """Always ``no_snapshot_claim``: a generic source has no snapshot to prove."""
        return SnapshotLabel.NO_SNAPSHOT_CLAIM


class SourceLoadError(DponeError):
    """A generic load failed; :attr:`report` says what became of the artifact."""

    def __init__(self, error: DponeError, report: SourceLoadReport) -> None:
        super().__init__(error.code, error.message, error.next_actions)
        self.report = report


def load_source(
    source: SourceAdapter,
    target_dsn: str,
    target: TableName,
    *,
    options: SourceCopyOptions | None = None,
    sink: Sink | str | None = None,
    primary_key: Sequence[str] | None = None,
    connection_options: ConnectionOptions | None = None,
    on_progress: ProgressHook | None = None,
    begin: Callable[[Connection], None] = begin_read_write,
    before_commit: Callable[[Connection], None] | None = None,
    **legacy: Any,
) -> SourceLoadReport:
    """Copies a generic source into ``target`` through a staging table and a sink.

    Args:
        source: The source adapter (:class:`MySQLSource`, :class:`RestSource`...).
        target_dsn: The PostgreSQL target.
        target: The target table; created (with the options' ``primary_key``) when it does not
            exist.
        options: The copy's options (:class:`~.copy_options.SourceCopyOptions`: ``sink``,
            ``primary_key``, ``schema_changes``; the defaults when None).
        sink: Shortcut for ``options.sink``.
        primary_key: Shortcut for ``options.primary_key``.
        connection_options: Options of the target session.
        on_progress: Called with the rows staged so far, every 10,000 rows.
        begin: Begins the load's target transaction, before any row is read (a source whose
            position lives in the ledger takes its lock and reads it here).
        before_commit: Writes what must commit with the rows (a source's position in the
            ledger), in the load's transaction after the sink.
        **legacy: ``schema_changes`` as a keyword: deprecated
            (``options=SourceCopyOptions(...)``), for one release.

    Returns:
        The report of a committed load (outcome ``success``).

    Raises:
        CopyPlanError: ``copy_options_invalid`` for an unknown sink or ``schema_changes`` or a
            bad primary key (parsed here, where a caller's text enters).
        SourceError: the source could not be described (``mysql_type_unmappable``,
            ``rest_type_unmappable``...): nothing was read or written.
        SourceLoadError: the load failed and the artifact was settled (``abort``, or
            ``retain_commit_unknown`` with code ``target_commit_unknown``); see ``.report``.
    """
    if isinstance(options, ConnectionOptions):  # the session's options, before they were renamed
        warnings.warn(
            "load_source(..., options=ConnectionOptions(...)) is deprecated and will be removed "
            "in the next release: pass connection_options=ConnectionOptions(...) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        options, connection_options = None, options
    chosen = build_options(
        SourceCopyOptions, options, caller="load_source",
        shortcuts={"sink": sink, "primary_key": primary_key}, legacy=legacy,
    )  # fmt: skip
    artifact = source.extract().artifact
    artifact.on_progress = on_progress
    load = _SourceLoad(artifact, target, chosen)
    settle_load(
        lambda: load.run(target_dsn, connection_options, begin, before_commit),
        settle=load.settle,
        failure=load.failure,
        error=SourceLoadError,
    )
    return load.settle(TerminalOutcome.SUCCESS)


@dataclass(frozen=True)
class StagedRows:
    """A staging table filled from a generic source, now the caller's.

    Attributes:
        staging: The staging table (the caller drops it or hands it to a sink).
        copied: Rows the COPY command tag reported.
    """

    staging: PostgresStagingTable
    copied: int


def stage_rows(
    conn: Connection,
    target: TableName,
    artifact: RowStreamArtifact,
    *,
    dsn: str | None = None,
    on_progress: ProgressHook | None = None,
) -> StagedRows:
    """Fills a staging table beside ``target`` from ``artifact``, for the caller to read.

    The table is created under the staging guard: any failure before this function returns (a
    lost source connection, a record that fails validation, an interrupt) drops it.

    Args:
        conn: The target session; the staging table is created in its current transaction.
        target: The target table the rows are meant for (the staging table lives in its schema).
        artifact: The pending stream.
        dsn: The target DSN, to drop the staging table from a fresh session if ``conn`` broke.
        on_progress: Called with the rows written so far every 10,000 rows.

    Returns:
        The filled staging table, now the caller's.
    """
    columns = target_columns(artifact.columns)
    definition = table_definition(columns, constraints=False)
    staging = PostgresStagingTable(conn, staging_name_for(target), columns=definition, dsn=dsn)
    artifact.on_progress = on_progress
    with owned_staging_handle(staging) as guard:
        copied = artifact.load_into(conn, staging.name)
        return guard.transfer(StagedRows(staging, copied))


class _SourceLoad:
    """One :func:`load_source` call: its artifact and the target's load."""

    def __init__(
        self, artifact: RowStreamArtifact, target: TableName, options: SourceCopyOptions
    ) -> None:
        self.schema_changes: SchemaChanges = options.schema_changes
        self.artifact = artifact
        self.target = target
        self.sink: Sink = options.sink
        self.key = options.primary_key
        self.load: TargetLoad | None = None

    def new_target_plan(self) -> TablePlan:
        """The plan as if the target did not exist: created from the source's mapped columns.

        A generic source has no PostgreSQL source table, so the plan names the target on both
        sides; messages name the source by its label.
        """
        columns = tuple(target_columns(self.artifact.columns))
        return TablePlan(
            source=self.target,
            target=self.target,
            columns=columns,
            written=columns,
            source_columns=columns,
            key=self.key,
            target_exists=False,
            target_key=self.key,
            target_pk_name=None,
            copy_format="text",
            swap=True,
        )

    def run(
        self,
        target_dsn: str,
        options: ConnectionOptions | None,
        begin: Callable[[Connection], None] = begin_read_write,
        before_commit: Callable[[Connection], None] | None = None,
    ) -> None:
        """Plans the target from its catalog, then loads through the one load path."""
        with connect(target_dsn, options, side="target") as conn:
            set_transaction_mode(conn, psycopg.IsolationLevel.REPEATABLE_READ, read_only=True)
            label = self.artifact.source_label
            plan = plan_target(
                conn,
                self.new_target_plan(),
                self.sink,
                source_label=label,
                rules=TargetRules(self.schema_changes),
            )
            conn.rollback()  # read only: nothing to keep
            self.load = TargetLoad(conn, target_dsn, [plan], self.sink)
            self.load.run(lambda _: self.artifact, begin=begin, before_commit=before_commit)

    def failure(self, exc: Exception) -> DponeError:
        """The stable error of a failed load."""
        if isinstance(exc, DponeError):
            return exc
        outage = DponeError(
            "target_load_failed",
            f"Loading {self.artifact.source_label} into the target failed: {exc}. The target "
            "was left unchanged and the staging table was dropped.",
            ["Fix the cause named in the message, then run the load again."],
        )
        if isinstance(exc, psycopg.Error):  # the source is no PostgreSQL: the target failed
            conn = self.load.target if self.load is not None else None
            return database_error(exc, "target", outage=outage, conn=conn)
        return outage

    def settle(self, outcome: TerminalOutcome) -> SourceLoadReport:
        """Settles the artifact (the first decision wins) and reports."""
        terminal = self.artifact.settle(outcome)
        table = None if self.load is None else self.load.tables[0]
        return SourceLoadReport(
            source_label=self.artifact.source_label,
            target=self.target,
            sink=self.sink,
            outcome=terminal.outcome,
            extraction_receipt=self.artifact.extraction_receipt,
            terminal_receipt=terminal,
            rows_loaded=None if table is None else table.rows_loaded,
            sink_result=None if table is None else table.sink_result,
            schema_changes=() if table is None else table.plan.schema_changes,
        )
