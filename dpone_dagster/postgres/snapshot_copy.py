"""``copy_tables``: copy a set of tables, read under one source snapshot, into a target.

The steps, whatever the strategy:

1. Plan from both catalogs (a bad name, a missing type or key fails here, nothing written).
2. Extract under one snapshot with the chosen strategy (see :data:`STRATEGIES`).
3. In one target transaction, for each table: a staging table under ``owned_staging_handle``,
   the rows loaded into it, the sink applied. (Partitioned COPY loads its committed staging
   tables from worker sessions first.)
4. COMMIT. Its answer decides every artifact's terminal outcome: ``success`` when acknowledged,
   ``retain_commit_unknown`` when the acknowledgement was lost, ``abort`` on any earlier failure.
   A failure raises :class:`CopyError` carrying the report; staging tables are dropped and the
   target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import (
    DponeError,
    SnapshotEvidence,
    TerminalOutcome,
    owned_staging_handle,
    redact,
    token_digest,
)

from .artifacts import TableArtifact, WholeCopyArtifact
from .batched import BatchedCopyArtifact
from .connection import ConnectionOptions, connect
from .identifiers import TableName
from .internal import InternalQueryArtifact
from .partitioned import PartitionedCopy
from .plan import Sink, TableMapping, TablePlan, TableSpec, plan_tables
from .progress import ProgressCallback
from .report import STRATEGIES, CopyError, CopyReport, SnapshotLabel, Strategy, TableCopyReport
from .sinks import (
    SinkResult,
    TargetCommitUnknownError,
    apply_sink,
    commit_target,
    ensure_schema,
    staging_table,
)
from .snapshot import LazySnapshot, SnapshotSession, read_snapshot
from .streamed import StreamedRowsArtifact

_BEGIN_TARGET = sql.SQL("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
# The internal query reads the source in the target session: REPEATABLE READ gives every
# table of the set the one snapshot of that transaction.
_BEGIN_INTERNAL = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE")
_BEGIN_CATALOG = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
_IDENTITY = (
    "SELECT current_database(), pg_postmaster_start_time()::text, "
    "coalesce(inet_server_port(), 0), (SELECT oid::int FROM pg_database "
    "WHERE datname = current_database())"
)


@dataclass(frozen=True)
class CopyOptions:
    """Tuning and hooks of a copy; the defaults suit most tables.

    Attributes:
        batch_rows: Rows per batch (batched COPY).
        fetch_rows: Rows per fetch (streamed rows).
        spool_dir: Directory of whole-COPY files; a new temporary directory when None.
        source_options: Options of every source session.
        target_options: Options of every target session.
        progress: Called as bytes move.
        progress_every: Bytes between two progress calls.
    """

    batch_rows: int = 250_000
    fetch_rows: int = 5_000
    spool_dir: str | os.PathLike[str] | None = None
    source_options: ConnectionOptions = field(default_factory=ConnectionOptions)
    target_options: ConnectionOptions = field(default_factory=ConnectionOptions)
    progress: ProgressCallback | None = None
    progress_every: int = 64 << 20


def copy_tables(
    source_dsn: str,
    target_dsn: str,
    tables: Sequence[TableSpec] | str | TableName,
    *,
    strategy: Strategy = "batched",
    sink: Sink = "replace",
    workers: int = 2,
    options: CopyOptions | None = None,
) -> CopyReport:
    """Copies ``tables``, read under one source snapshot, into the target.

    Args:
        source_dsn: The source database.
        target_dsn: The target database (for ``internal``, the same database).
        tables: Table names (``"sales.orders"``, ``TableName``), or ``(source, target)``
            pairs to copy into another name.
        strategy: ``whole``, ``streamed``, ``batched``, ``partitioned`` or ``internal``.
        sink: ``replace``, ``append`` or ``merge``.
        workers: Worker sessions of a partitioned copy.
        options: Tuning and hooks.

    Returns:
        The report: per-table receipts, row counts, the ``success`` outcome, the snapshot label.

    Raises:
        CatalogError: ``table_not_found`` for an unknown source table.
        CopyPlanError: a copy that cannot be planned (see :func:`.plan.plan_tables`).
        CopyError: the copy failed and every artifact was settled; ``.report`` says how
            (``target_commit_unknown`` when the target's COMMIT acknowledgement was lost).
    """
    if strategy not in STRATEGIES or workers < 1:
        raise CopyError(
            "copy_options_invalid",
            f"Unknown strategy {strategy!r} or workers={workers}.",
            [f"Use one of {', '.join(STRATEGIES)} and at least one worker."],
        )
    if isinstance(tables, str | TableName | TableMapping):
        tables = [tables]  # one table named on its own
    mappings = [TableMapping.of(t) for t in tables]
    return _CopyRun(source_dsn, target_dsn, strategy, sink, workers, options or CopyOptions()).run(
        mappings
    )


class _CopyRun:
    """One call of :func:`copy_tables`: its sessions, artifacts and results."""

    def __init__(
        self,
        source_dsn: str,
        target_dsn: str,
        strategy: Strategy,
        sink: Sink,
        workers: int,
        options: CopyOptions,
    ) -> None:
        self.source_dsn = source_dsn
        self.target_dsn = target_dsn
        self.strategy: Strategy = strategy
        self.sink: Sink = sink
        self.workers = workers
        self.options = options
        self.plans: list[TablePlan] = []
        self.artifacts: list[TableArtifact | None] = []
        self.loaded: list[int | None] = []
        self.results: list[SinkResult | None] = []
        self.sessions: list[SnapshotSession] = []
        self.lazy: LazySnapshot | None = None
        self.partitioned: PartitionedCopy | None = None
        self.internal_evidence: SnapshotEvidence | None = None
        self.spool: Path | None = None

    # -- the run ------------------------------------------------------------------------------

    def run(self, mappings: list[TableMapping]) -> CopyReport:
        self.target = _connect(self.target_dsn, self.options.target_options, "target")
        try:
            self._plan(mappings)
            try:
                self._copy()
            except TargetCommitUnknownError as exc:
                report = self._settle(TerminalOutcome.RETAIN_COMMIT_UNKNOWN)
                raise CopyError(exc.code, exc.message, exc.next_actions, report=report) from exc
            except Exception as exc:
                code, message, actions = self._failure(exc)
                report = self._settle(TerminalOutcome.ABORT)
                raise CopyError(code, message, actions, report=report) from exc
            except BaseException:  # interrupted (Dagster, Ctrl-C): settle, then let it through
                self._settle(TerminalOutcome.ABORT)
                raise
            return self._settle(TerminalOutcome.SUCCESS)
        finally:
            for session in self.sessions:  # a backstop: settling closed the attached ones
                with contextlib.suppress(psycopg.Error):
                    session.rollback_and_close()
            self.target.close()

    def _plan(self, mappings: list[TableMapping]) -> None:
        with _connect(self.source_dsn, self.options.source_options, "source") as source:
            source.execute(_BEGIN_CATALOG)
            self.target.execute(_BEGIN_CATALOG)
            if self.strategy == "internal" and _identity(source) != _identity(self.target):
                raise CopyError(
                    "internal_query_needs_same_database",
                    "The internal-query strategy copies inside one database, but the source "
                    "and target DSNs reach different databases.",
                    ["Use another strategy, or point both DSNs at the same database."],
                )
            try:
                self.plans = plan_tables(source, self.target, mappings, self.sink)
            finally:
                self.target.rollback()  # read only: nothing to keep
        count = len(self.plans)
        self.artifacts, self.loaded, self.results = [None] * count, [None] * count, [None] * count

    def _copy(self) -> None:
        if self.strategy == "whole":
            self._extract_files()
        elif self.strategy == "batched":
            self._prepare_batches()
        elif self.strategy == "partitioned":
            self._prepare_partitions()
        elif self.strategy == "streamed":
            self._open_session()
        self._begin()
        with ExitStack() as stack:
            guards, stagings = [], []
            for plan in self.plans:
                if not plan.target_exists:
                    ensure_schema(self.target, plan.target.schema)
                staging = staging_table(self.target, plan, dsn=self.target_dsn)
                guards.append(stack.enter_context(owned_staging_handle(staging)))
                stagings.append(staging.name)
            if self.partitioned is not None:
                # Workers load from their own sessions: the staging tables must be committed.
                self.target.commit()
                self.partitioned.run(
                    self.target_dsn,
                    stagings,
                    target_options=self.options.target_options,
                    progress=self.options.progress,
                    progress_every=self.options.progress_every,
                )
                self._begin()
            for index, plan in enumerate(self.plans):
                artifact = self._artifact(index)
                loaded = artifact.load_into(
                    self.target,
                    stagings[index],
                    progress=self.options.progress,
                    progress_every=self.options.progress_every,
                )
                _check_rows(artifact, loaded)
                self.loaded[index] = loaded
                self.results[index] = apply_sink(
                    self.target, plan, stagings[index], self.sink, loaded
                )
            commit_target(self.target)
            for guard in guards:
                guard.transfer(None)

    # -- strategies ---------------------------------------------------------------------------

    def _open_session(self, *, export: bool = False) -> SnapshotSession:
        session = SnapshotSession.open(self.source_dsn, self.options.source_options, export=export)
        self.sessions.append(session)
        return session

    def _extract_files(self) -> None:
        session = self._open_session()
        if self.options.spool_dir is not None:
            directory = Path(self.options.spool_dir)
        else:
            directory = self.spool = Path(tempfile.mkdtemp(prefix="dpone-copy-"))
        for index, plan in enumerate(self.plans):
            artifact = WholeCopyArtifact(
                plan.source, plan.columns, plan.copy_format, directory=directory
            )
            self.artifacts[index] = artifact
            artifact.write(
                session, progress=self.options.progress, progress_every=self.options.progress_every
            )
        # Every file is written and receipted: the read-only transaction commits now.
        session.commit_and_close()

    def _prepare_batches(self) -> None:
        self.lazy = LazySnapshot(self._open_session)
        for index, plan in enumerate(self.plans):
            self.artifacts[index] = BatchedCopyArtifact(
                self.lazy,
                plan.source,
                plan.columns,
                plan.copy_format,
                key=plan.key,
                batch_rows=self.options.batch_rows,
            )

    def _prepare_partitions(self) -> None:
        self.partitioned = PartitionedCopy(self._open_session(export=True), workers=self.workers)
        for index, plan in enumerate(self.plans):
            self.artifacts[index] = self.partitioned.add_table(
                plan.source, plan.columns, key=plan.key, copy_format=plan.copy_format
            ).artifact

    def _begin(self) -> None:
        if self.strategy == "internal":
            self.target.execute(_BEGIN_INTERNAL)
            self.internal_evidence, _ = read_snapshot(self.target)
        else:
            self.target.execute(_BEGIN_TARGET)

    def _artifact(self, index: int) -> TableArtifact:
        """The table's artifact; streamed rows and internal queries open theirs at the read."""
        artifact = self.artifacts[index]
        if artifact is None:
            plan = self.plans[index]
            if self.strategy == "streamed":
                rows = StreamedRowsArtifact(
                    self.sessions[0], plan.source, plan.columns, fetch_rows=self.options.fetch_rows
                )
                self.artifacts[index] = artifact = rows
                rows.declare()
            else:
                artifact = InternalQueryArtifact(
                    plan.source, plan.columns, session_snapshot=self.internal_evidence
                )
                self.artifacts[index] = artifact
        return artifact

    # -- outcome ------------------------------------------------------------------------------

    def _failure(self, exc: Exception) -> tuple[str, str, list[str]]:
        """The stable code, message and next actions of a failed copy."""
        if isinstance(exc, DponeError):
            return exc.code, exc.message, list(exc.next_actions)
        unchanged = "The target was left unchanged and the staging tables were dropped."
        cause = redact(str(exc)).strip().rstrip(".")
        if self._source_failed():
            return (
                "source_read_failed",
                f"Reading the source failed: {cause}. {unchanged}",
                ["Check the source server and its sessions, then run the copy again."],
            )
        return (
            "target_load_failed",
            f"Loading the target failed: {cause}. {unchanged}",
            ["Fix the cause named in the message, then run the copy again."],
        )

    def _source_failed(self) -> bool:
        sources = [s.conn for s in self.sessions]
        if any(c.broken for c in sources):
            return True
        if self.target.broken:
            return False
        errored = pq.TransactionStatus.INERROR
        return any(c.info.transaction_status == errored for c in sources) and (
            self.target.info.transaction_status != errored
        )

    def _settle(self, outcome: TerminalOutcome) -> CopyReport:
        for artifact in self.artifacts:
            if artifact is not None:
                artifact.settle(outcome)
        if self.spool is not None and outcome is not TerminalOutcome.RETAIN_COMMIT_UNKNOWN:
            with contextlib.suppress(OSError):
                self.spool.rmdir()
        evidence = self._evidence()
        return CopyReport(
            strategy=self.strategy,
            sink=self.sink,
            outcome=outcome,
            snapshot_label=SnapshotLabel.SINGLE if evidence else SnapshotLabel.NONE,
            source_token=token_digest(evidence.token) if evidence else None,
            tables=tuple(
                TableCopyReport(
                    source=plan.source,
                    target=plan.target,
                    extraction_receipt=None if artifact is None else artifact.extraction_receipt,
                    terminal_receipt=None if artifact is None else artifact.terminal_receipt,
                    rows_loaded=loaded,
                    sink_result=result,
                    copy_format=plan.copy_format,
                )
                for plan, artifact, loaded, result in zip(
                    self.plans, self.artifacts, self.loaded, self.results, strict=True
                )
            ),
        )

    def _evidence(self) -> SnapshotEvidence | None:
        if self.strategy == "internal":
            return self.internal_evidence
        return self.sessions[0].evidence if self.sessions else None


def _connect(
    dsn: str, options: ConnectionOptions, side: str
) -> psycopg.Connection[tuple[object, ...]]:
    """Opens an autocommit session (transactions are begun explicitly), or says which side
    could not be reached."""
    try:
        return connect(dsn, options, autocommit=True)
    except psycopg.OperationalError as exc:  # the message is already redacted
        raise CopyError(
            f"{side}_unreachable",
            f"The {side} database could not be reached: {exc}",
            [f"Check the {side} DSN, the server and the network, then run the copy again."],
        ) from None


def _check_rows(artifact: TableArtifact, loaded: int) -> None:
    receipt = artifact.extraction_receipt
    if receipt.row_count != loaded:
        raise CopyError(
            "copy_rows_mismatch",
            f"The target took {loaded} rows of {artifact.table}, but the extraction receipt "
            f"counts {receipt.row_count}.",
            ["Report this with both counts: nothing was committed."],
        )


def _identity(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...]:
    row = conn.execute(_IDENTITY).fetchone()
    assert row is not None
    return tuple(row)
