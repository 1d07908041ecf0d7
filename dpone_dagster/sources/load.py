"""Loading a generic source into PostgreSQL: the PostgreSQL copies' staging, sinks and outcomes.

The steps are those of a snapshot copy, for one source:

1. ``extract()`` maps the source's types (an unmappable type fails here, before any row moves
   and before the target is touched); the target side is planned from the target's catalog.
2. In one target transaction: a staging table under ``owned_staging_handle`` (the shape the
   sink needs: the target's, or the source's for a target this load creates), the rows written
   into it with ``COPY ... write_row()``, the sink (``replace``, ``append``, ``merge``) applied.
3. COMMIT. Its answer decides the artifact's terminal outcome: ``success`` when acknowledged,
   ``retain_commit_unknown`` when the acknowledgement was lost, ``abort`` on any earlier failure
   (or interruption). A failure raises :class:`SourceLoadError` carrying the report; the staging
   table is dropped and the target is left as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import (
    ArtifactTerminalReceipt,
    DponeError,
    ExtractionLifecycleReceipt,
    TerminalOutcome,
    owned_staging_handle,
)
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.connection import ConnectionOptions, connect
from dpone_dagster.postgres.plan import SINKS, Sink, TablePlan, plan_target
from dpone_dagster.postgres.report import SnapshotLabel
from dpone_dagster.postgres.sinks import (
    SinkResult,
    TargetCommitUnknownError,
    apply_sink,
    commit_target,
    ensure_schema,
    staging_table,
)

from .protocol import RowStreamArtifact, SourceAdapter, SourceColumn, SourceError
from .staging import ProgressHook, copy_rows

_BEGIN_TARGET = sql.SQL("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")


def check_sink(sink: str) -> Sink:
    """Returns ``sink`` if it is one of ``replace``, ``append``, ``merge``.

    Raises:
        SourceError: ``copy_options_invalid`` for another sink.
    """
    if sink not in SINKS:
        raise SourceError(
            "copy_options_invalid", f"Unknown sink {sink!r}.", [f"Use one of {', '.join(SINKS)}."]
        )
    return sink


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
    """

    source_label: str
    target: TableName
    sink: Sink
    outcome: TerminalOutcome
    extraction_receipt: ExtractionLifecycleReceipt
    terminal_receipt: ArtifactTerminalReceipt | None
    rows_loaded: int | None
    sink_result: SinkResult | None

    @property
    def sink_method(self) -> str | None:
        """What the sink did (``create``, ``swap``, ``rewrite``, ``append``, ``merge``)."""
        return None if self.sink_result is None else self.sink_result.method

    @property
    def snapshot_label(self) -> SnapshotLabel:
        """Always ``no_snapshot_claim``: a generic source has no snapshot to prove."""
        return SnapshotLabel.NONE


class SourceLoadError(DponeError):
    """A generic load failed; :attr:`report` says what became of the artifact."""

    def __init__(self, error: DponeError, report: SourceLoadReport) -> None:
        super().__init__(error.code, error.message, error.next_actions)
        self.report = report


def _failure(exc: Exception, label: str) -> DponeError:
    if isinstance(exc, DponeError):
        return exc
    return DponeError(
        "target_load_failed",
        f"Loading {label} into the target failed: {exc}. The target was left unchanged and "
        "the staging table was dropped.",
        ["Fix the cause named in the message, then run the load again."],
    )


def load_source(
    source: SourceAdapter,
    target_dsn: str,
    target: TableName,
    *,
    sink: Sink = "replace",
    primary_key: Sequence[str] = (),
    options: ConnectionOptions | None = None,
    on_progress: ProgressHook | None = None,
) -> SourceLoadReport:
    """Copies a generic source into ``target`` through a staging table and a sink.

    Args:
        source: The source adapter (:class:`MySQLSource`, :class:`RestSource`...).
        target_dsn: The PostgreSQL target.
        target: The target table; created (with ``primary_key``) when it does not exist.
        sink: ``replace``, ``append`` or ``merge`` (merge matches on the target's primary key).
        primary_key: The primary key of a target this load creates.
        options: Options of the target session.
        on_progress: Called with the rows staged so far, every 10,000 rows.

    Returns:
        The report of a committed load (outcome ``success``).

    Raises:
        SourceError: the source could not be described (``mysql_type_unmappable``,
            ``rest_type_unmappable``...): nothing was read or written.
        SourceLoadError: the load failed and the artifact was settled (``abort``, or
            ``retain_commit_unknown`` with code ``target_commit_unknown``); see ``.report``.
    """
    check_sink(sink)
    artifact = source.extract().artifact
    run = _Load(artifact, target, sink, primary_key)
    with connect(target_dsn, options, autocommit=True) as conn:
        try:
            run.load(conn, target_dsn, on_progress)
        except TargetCommitUnknownError as exc:
            raise SourceLoadError(exc, run.settle(TerminalOutcome.RETAIN_COMMIT_UNKNOWN)) from exc
        except Exception as exc:
            report = run.settle(TerminalOutcome.ABORT)
            raise SourceLoadError(_failure(exc, artifact.source_label), report) from exc
        except BaseException:  # interrupted (Dagster, Ctrl-C): settle, then let it through
            run.settle(TerminalOutcome.ABORT)
            raise
    return run.settle(TerminalOutcome.SUCCESS)


class _Load:
    """One :func:`load_source` call: its artifact and what the target did."""

    def __init__(
        self, artifact: RowStreamArtifact, target: TableName, sink: Sink, key: Sequence[str]
    ) -> None:
        self.artifact = artifact
        self.target = target
        self.sink: Sink = sink
        self.key = tuple(key)
        self.loaded: int | None = None
        self.result: SinkResult | None = None

    @property
    def label(self) -> str:
        """The source's label, for messages."""
        return self.artifact.source_label

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

    def load(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        dsn: str,
        on_progress: ProgressHook | None,
    ) -> None:
        plan = plan_target(conn, self.new_target_plan(), self.sink, source_label=self.label)
        conn.execute(_BEGIN_TARGET)
        if not plan.target_exists:
            ensure_schema(conn, self.target.schema)
        staging = staging_table(conn, plan, dsn=dsn)
        with owned_staging_handle(staging) as guard:
            with conn.cursor() as cursor:
                self.loaded = copy_rows(
                    cursor, staging.name, self.artifact, on_progress=on_progress
                )
            counted = self.artifact.extraction_receipt.row_count
            if counted != self.loaded:
                raise SourceError(
                    "copy_rows_mismatch",
                    f"The target took {self.loaded} rows of {self.artifact.source_label}, but "
                    f"the extraction receipt counts {counted}.",
                    ["Report this with both counts: nothing was committed."],
                )
            self.result = apply_sink(conn, plan, staging.name, self.sink, self.loaded)
            commit_target(conn)
            guard.transfer(None)

    def settle(self, outcome: TerminalOutcome) -> SourceLoadReport:
        terminal = self.artifact.settle(outcome)
        return SourceLoadReport(
            source_label=self.artifact.source_label,
            target=self.target,
            sink=self.sink,
            outcome=terminal.outcome,
            extraction_receipt=self.artifact.extraction_receipt,
            terminal_receipt=terminal,
            rows_loaded=self.loaded,
            sink_result=self.result,
        )
