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

from collections.abc import Callable, Sequence
from contextlib import ExitStack

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import (
    DponeError,
    TerminalOutcome,
    owned_staging_handle,
    redact,
    token_digest,
)

from .artifacts import TableArtifact
from .connection import ConnectionOptions, connect
from .extraction import Extraction
from .identifiers import TableName
from .options import CopyOptions
from .plan import Sink, TableMapping, TablePlan, TableSpec, plan_tables
from .report import STRATEGIES, CopyError, CopyReport, SnapshotLabel, Strategy, TableCopyReport
from .sinks import (
    SinkResult,
    TargetCommitUnknownError,
    apply_sink,
    commit_target,
    ensure_schema,
    staging_table,
)

_BEGIN_CATALOG = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
_IDENTITY = (
    "SELECT current_database(), pg_postmaster_start_time()::text, "
    "coalesce(inet_server_port(), 0), (SELECT oid::int FROM pg_database "
    "WHERE datname = current_database())"
)


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
    copy = SnapshotCopy(
        source_dsn, target_dsn, tables, strategy=strategy, sink=sink, workers=workers,
        options=options,
    )  # fmt: skip
    with copy:
        copy.plan()
        copy.extract()
        return copy.load()


class SnapshotCopy:
    """One snapshot copy, step by step: :meth:`plan`, :meth:`extract`, :meth:`load`.

    :func:`copy_tables` runs the three steps; a caller that runs them apart (a Dagster job of
    ``acquire -> extract -> load -> settle`` ops in one process) holds this object between them.
    A failed step settles every artifact (``abort``, or ``retain_commit_unknown`` when the
    target's COMMIT acknowledgement was lost) and raises :class:`CopyError` with the report.
    Leaving the ``with`` block (or :meth:`close`) settles whatever is still undecided with
    ``abort`` and closes every session: nothing stays open after a failed or abandoned step.

    Args:
        source_dsn: The source database.
        target_dsn: The target database (for ``internal``, the same database).
        tables: Table names, or ``(source, target)`` pairs.
        strategy: ``whole``, ``streamed``, ``batched``, ``partitioned`` or ``internal``.
        sink: ``replace``, ``append`` or ``merge``.
        workers: Worker sessions of a partitioned copy.
        options: Tuning and hooks.

    Raises:
        CopyError: ``copy_options_invalid`` for an unknown strategy or no worker.
        IdentifierError: ``identifier_invalid`` for a table name PostgreSQL would not read.
    """

    def __init__(
        self,
        source_dsn: str,
        target_dsn: str,
        tables: Sequence[TableSpec] | str | TableName,
        *,
        strategy: Strategy = "batched",
        sink: Sink = "replace",
        workers: int = 2,
        options: CopyOptions | None = None,
    ) -> None:
        if strategy not in STRATEGIES or workers < 1:
            raise CopyError(
                "copy_options_invalid",
                f"Unknown strategy {strategy!r} or workers={workers}.",
                [f"Use one of {', '.join(STRATEGIES)} and at least one worker."],
            )
        if isinstance(tables, str | TableName | TableMapping):
            tables = [tables]  # one table named on its own
        self.mappings = [TableMapping.of(t) for t in tables]
        self.source_dsn = source_dsn
        self.target_dsn = target_dsn
        self.strategy: Strategy = strategy
        self.sink: Sink = sink
        self.workers = workers
        self.options = options or CopyOptions()
        self.plans: list[TablePlan] = []
        self.loaded: list[int | None] = []
        self.results: list[SinkResult | None] = []
        self.report: CopyReport | None = None
        self._extraction: Extraction | None = None
        self._target: psycopg.Connection[tuple[object, ...]] | None = None

    def __enter__(self) -> SnapshotCopy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def target(self) -> psycopg.Connection[tuple[object, ...]]:
        """The target session (opened by :meth:`plan`)."""
        if self._target is None:
            raise _not_planned()
        return self._target

    @property
    def extraction(self) -> Extraction:
        """The source side: sessions and artifacts (built by :meth:`plan`)."""
        if self._extraction is None:
            raise _not_planned()
        return self._extraction

    # -- the steps ----------------------------------------------------------------------------

    def plan(self) -> list[TablePlan]:
        """Reads both catalogs and plans every table; nothing is read or written yet.

        Raises:
            CatalogError: ``table_not_found``.
            CopyPlanError: see :func:`.plan.plan_tables`.
            CopyError: ``source_unreachable``, ``target_unreachable``,
                ``internal_query_needs_same_database``.
        """
        self._target = _connect(self.target_dsn, self.options.target_options, "target")
        with _connect(self.source_dsn, self.options.source_options, "source") as source:
            source.execute(_BEGIN_CATALOG)
            self.target.execute(_BEGIN_CATALOG)
            try:
                if self.strategy == "internal" and _identity(source) != _identity(self.target):
                    raise CopyError(
                        "internal_query_needs_same_database",
                        "The internal-query strategy copies inside one database, but the "
                        "source and target DSNs reach different databases.",
                        ["Use another strategy, or point both DSNs at the same database."],
                    )
                self.plans = plan_tables(source, self.target, self.mappings, self.sink)
            finally:
                self.target.rollback()  # read only: nothing to keep
        self.loaded, self.results = [None] * len(self.plans), [None] * len(self.plans)
        self._extraction = Extraction(
            self.source_dsn, self.plans, self.strategy, workers=self.workers, options=self.options
        )
        return self.plans

    def extract(self) -> None:
        """Acquires the snapshot and extracts what the strategy extracts before the load.

        ``whole`` writes and receipts every file, then commits its read-only transaction;
        ``partitioned`` exports the snapshot and computes every table's bounds inside it;
        ``batched`` builds its lazy artifacts (they acquire when the load consumes them);
        ``streamed`` opens the snapshot session; ``internal`` reads in the load's transaction.
        """
        self._step(self.extraction.extract)

    def load(self) -> CopyReport:
        """Stages, loads and applies every table in one target transaction, commits, and
        settles every artifact by the commit's answer.

        Returns:
            The report of a ``success``.

        Raises:
            CopyError: the load failed (``abort``) or its acknowledgement was lost
                (``target_commit_unknown``, ``retain_commit_unknown``); ``.report`` tells.
        """
        self._step(self._load)
        return self._settle(TerminalOutcome.SUCCESS)

    def abort(self) -> CopyReport:
        """Settles every artifact still undecided with ``abort``; returns the report."""
        return self._settle(TerminalOutcome.ABORT)

    def close(self) -> None:
        """Settles what is undecided (``abort``) and closes every session."""
        try:
            if self._extraction is not None:
                self.abort()
        finally:
            if self._extraction is not None:
                self._extraction.close()
            if self._target is not None:
                self._target.close()

    def _step(self, step: Callable[[], None]) -> None:
        if self.report is not None:
            raise CopyError(
                "copy_already_settled",
                f"This copy was already settled ({self.report.outcome.value}).",
                ["Start a new copy."],
            )
        try:
            step()
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

    def _load(self) -> None:
        extraction = self.extraction
        extraction.begin(self.target)
        with ExitStack() as stack:
            guards, stagings = [], []
            for plan in self.plans:
                if not plan.target_exists:
                    ensure_schema(self.target, plan.target.schema)
                staging = staging_table(self.target, plan, dsn=self.target_dsn)
                guards.append(stack.enter_context(owned_staging_handle(staging)))
                stagings.append(staging.name)
            if extraction.partitioned is not None:
                # Workers load from their own sessions: the staging tables must be committed.
                self.target.commit()
                extraction.run_workers(self.target_dsn, stagings)
                extraction.begin(self.target)
            for index, plan in enumerate(self.plans):
                artifact = extraction.artifact(index)
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

    # -- outcome ------------------------------------------------------------------------------

    def _failure(self, exc: Exception) -> tuple[str, str, list[str]]:
        """The stable code, message and next actions of a failed copy."""
        if isinstance(exc, DponeError):
            return exc.code, exc.message, list(exc.next_actions)
        unchanged = "The target was left unchanged and the staging tables were dropped."
        cause = redact(str(exc)).strip().rstrip(".")
        if self.extraction.source_failed(self.target):
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

    def _settle(self, outcome: TerminalOutcome) -> CopyReport:
        if self.report is not None:  # the first decision wins
            return self.report
        extraction = self.extraction
        extraction.settle(outcome)
        evidence = extraction.evidence
        self.report = CopyReport(
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
                    columns=plan.column_names,
                )
                for plan, artifact, loaded, result in zip(
                    self.plans, extraction.artifacts, self.loaded, self.results, strict=True
                )
            ),
        )
        return self.report


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


def _not_planned() -> CopyError:
    return CopyError("copy_step_out_of_order", "The copy was not planned.", ["Call plan() first."])


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
