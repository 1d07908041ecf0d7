"""``copy_tables``: copy a set of tables, read under one source snapshot, into a target.

The steps, whatever the strategy (:class:`~.strategy.Strategy`):

1. **plan**: both catalogs are read (a bad name, a type the target has otherwise, an
   extension it lacks or a missing key fails here, nothing written; the types a created table
   needs are planned here, :mod:`~dpone_dagster.postgres.target_types`);
2. **extract**: the strategy acquires the snapshot and reads what it reads ahead of the load;
3. **load**: the one load path (:mod:`~dpone_dagster.postgres.load`): staging tables, rows,
   sinks, one COMMIT whose answer settles every artifact. A failure raises
   :class:`~.copy_report.CopyError` carrying the report; staging tables are dropped and the
   target is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import psycopg
from psycopg import pq

from dpone_dagster.lifecycle import DponeError, SnapshotLabel, TerminalOutcome, redact, token_digest
from dpone_dagster.lifecycle.options import build_options
from dpone_dagster.postgres.connection import Connection, connect, set_transaction_mode
from dpone_dagster.postgres.extensions import extension_names
from dpone_dagster.postgres.failures import (
    DATABASE_ERRORS,
    DatabaseError,
    FailureSide,
    database_error,
)
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.load import TargetLoad, settle_load
from dpone_dagster.postgres.target_plan import (
    Sink,
    TableMapping,
    TablePlan,
    TableSpec,
    TargetRules,
    plan_tables,
)

from .copy_report import CopyError, CopyReport, TableCopyReport
from .options import SnapshotCopyOptions, Strategy
from .registry import open_strategy
from .strategy import ExtractionStrategy, SourceReads
from .tuning import CopyOptions

_IDENTITY = (
    "SELECT current_database(), pg_postmaster_start_time()::text, "
    "coalesce(inet_server_port(), 0), (SELECT oid::bigint FROM pg_database "
    "WHERE datname = current_database())"
)


def copy_tables(
    source_dsn: str,
    target_dsn: str,
    tables: Sequence[TableSpec] | str | TableName,
    *,
    options: SnapshotCopyOptions | None = None,
    strategy: Strategy | str | None = None,
    sink: Sink | str | None = None,
    tuning: CopyOptions | None = None,
    create_extensions: Collection[str] = (),
    **legacy: Any,
) -> CopyReport:
    """Copies ``tables``, read under one source snapshot, into the target.

    Args:
        source_dsn: The source database.
        target_dsn: The target database (for ``internal_query``, the same database).
        tables: Table names (``"sales.orders"``, ``TableName``), or ``(source, target)``
            pairs to copy into another name.
        options: The copy's options (strategy, sink, workers, batch size, schema changes).
        strategy: Shortcut for ``options.strategy``.
        sink: Shortcut for ``options.sink``.
        tuning: Sessions' options, a held snapshot, the progress hook, the spool directory.
        create_extensions: Extensions the copy may create in the target (``CREATE
            EXTENSION``, in the load's transaction) when a table's types need them and the
            target lacks them; any other is refused with ``target_extension_missing``.
        **legacy: ``workers``, ``batch_size``, ``schema_changes`` as keywords: deprecated
            (``options=SnapshotCopyOptions(...)``).

    Returns:
        The report: per-table receipts, row counts, the ``success`` outcome, the snapshot label.

    Raises:
        CopyError: the copy failed and every artifact was settled; ``.report`` says how
            (``target_commit_unknown`` when the target's COMMIT acknowledgement was lost).
        DponeError: before anything is read: ``copy_options_invalid``, ``table_not_found``,
            ``source_unreachable``, ``target_login_failed``, ``schema_change_incompatible``,
            ``target_type_missing``, ``target_type_differs``, ``target_extension_missing``,
            ``target_extension_unavailable`` and the other plan errors.

    Examples:
        .. code-block:: python

            report = copy_tables(source_dsn, target_dsn, ["shop.orders"], strategy="batched_copy")
            report.outcome  # TerminalOutcome.SUCCESS
    """
    chosen = build_options(
        SnapshotCopyOptions, options, caller="copy_tables",
        shortcuts={"strategy": strategy, "sink": sink}, legacy=legacy,
    )  # fmt: skip
    copy = SnapshotCopy(
        source_dsn, target_dsn, tables, options=chosen, tuning=tuning,
        create_extensions=create_extensions,
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
        target_dsn: The target database (for ``internal_query``, the same database).
        tables: Table names, or ``(source, target)`` pairs.
        options: The copy's options (the defaults when None).
        tuning: Sessions' options, a held snapshot, the progress hook, the spool directory.
        create_extensions: Extensions the copy may create (see :func:`copy_tables`).

    Raises:
        DponeError: ``copy_options_invalid`` for an unknown extension name in
            ``create_extensions`` (parsed here, where a caller's text enters).
        IdentifierError: ``identifier_invalid`` for a table name PostgreSQL would not read.
    """

    def __init__(
        self,
        source_dsn: str,
        target_dsn: str,
        tables: Sequence[TableSpec] | str | TableName,
        *,
        options: SnapshotCopyOptions | None = None,
        tuning: CopyOptions | None = None,
        create_extensions: Collection[str] = (),
    ) -> None:
        self.options = options or SnapshotCopyOptions()
        self.strategy, self.sink = self.options.strategy, self.options.sink
        self.rules = TargetRules(
            self.options.schema_changes,
            create_extensions=extension_names(create_extensions, refusal="copy_options_invalid"),
        )
        if isinstance(tables, str | TableName | TableMapping):
            tables = [tables]  # one table named on its own
        self.mappings = [TableMapping.of(t) for t in tables]
        self.source_dsn = source_dsn
        self.target_dsn = target_dsn
        self.tuning = tuning or CopyOptions()
        self.plans: list[TablePlan] = []
        self.report: CopyReport | None = None
        self._strategy: ExtractionStrategy | None = None
        self._load: TargetLoad | None = None
        self._target: Connection | None = None

    def __enter__(self) -> SnapshotCopy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def target(self) -> Connection:
        """The target session (opened by :meth:`plan`)."""
        if self._target is None:
            raise _not_planned()
        return self._target

    @property
    def extraction(self) -> ExtractionStrategy:
        """The source side: the strategy, its sessions and artifacts (built by :meth:`plan`)."""
        if self._strategy is None:
            raise _not_planned()
        return self._strategy

    # -- the steps ----------------------------------------------------------------------------

    def plan(self) -> list[TablePlan]:
        """Reads both catalogs and plans every table; nothing is read or written yet.

        Raises:
            CatalogError: ``table_not_found``.
            CopyPlanError: the other plan errors
                (:func:`~dpone_dagster.postgres.target_plan.plan_tables`).
            SessionError: ``source_unreachable``, ``target_unreachable``,
                ``source_login_failed``, ``target_login_failed``.
            CopyError: ``internal_query_needs_same_database``.
        """
        try:
            self.plans = self._read_catalogs()
        except BaseException:
            if self._target is not None:
                self._target.close()
                self._target = None
            raise
        reads = SourceReads(self.source_dsn, self.plans, options=self.options, tuning=self.tuning)
        self._strategy = open_strategy(self.strategy, reads)
        self._load = TargetLoad(
            self.target, self.target_dsn, self.plans, self.sink, options=self.tuning.target_options
        )
        return self.plans

    def extract(self) -> None:
        """Acquires the snapshot and extracts what the strategy extracts before the load.

        ``whole_copy`` writes and receipts every file, then commits its read-only transaction;
        ``partitioned_copy`` exports the snapshot and computes every table's bounds inside it;
        ``batched_copy`` builds its lazy artifacts (they acquire when the load consumes them);
        ``stream_rows`` opens the snapshot session; ``internal_query`` reads in the load's
        transaction.
        """
        self._step(self.extraction.plan_reads)

    def load(self, before_commit: Callable[[Connection], None] | None = None) -> CopyReport:
        """Stages, loads and applies every table in one target transaction, commits, and
        settles every artifact by the commit's answer.

        Args:
            before_commit: Writes what must commit with the rows (an engine's ledger state),
                in the load's transaction after every sink.

        Returns:
            The report of a ``success``.

        Raises:
            CopyError: the load failed (``abort``) or its acknowledgement was lost
                (``target_commit_unknown``, ``retain_commit_unknown``); ``.report`` tells.
        """
        strategy, load = self.extraction, self._load
        assert load is not None
        self._step(
            lambda: load.run(
                strategy.artifact,
                begin=strategy.begin_load,
                fill_stagings=strategy.fill_stagings,
                before_commit=before_commit,
            )
        )
        return self._settle(TerminalOutcome.SUCCESS)

    def abort(self) -> CopyReport:
        """Settles every artifact still undecided with ``abort``; returns the report."""
        return self._settle(TerminalOutcome.ABORT)

    def close(self) -> None:
        """Settles what is undecided (``abort``) and closes every session."""
        try:
            if self._strategy is not None:
                self.abort()
        finally:
            if self._strategy is not None:
                self._strategy.close()
            if self._target is not None:
                self._target.close()

    def _read_catalogs(self) -> list[TablePlan]:
        tuning = self.tuning
        self._target = connect(self.target_dsn, tuning.target_options, side="target")
        with connect(self.source_dsn, tuning.source_options, side="source") as source:
            for conn in (source, self.target):
                set_transaction_mode(conn, psycopg.IsolationLevel.REPEATABLE_READ, read_only=True)
            try:
                if self.strategy is Strategy.INTERNAL_QUERY and (
                    _identity(source) != _identity(self.target)
                ):
                    raise CopyError(
                        "internal_query_needs_same_database",
                        "The internal_query strategy copies inside one database, but the "
                        "source and target DSNs reach different databases.",
                        ["Use another strategy, or point both DSNs at the same database."],
                    )
                return plan_tables(source, self.target, self.mappings, self.sink, self.rules)
            except psycopg.Error as exc:
                target = self.target
                failed = (
                    target.broken or target.info.transaction_status is pq.TransactionStatus.INERROR
                )
                side: FailureSide = "target" if failed else "source"
                known = [t for m in self.mappings for t in (m.source, m.target)]
                conn = target if failed else source
                raise database_error(exc, side, conn=conn, known=known) from exc
            finally:
                self.target.rollback()  # read only: nothing to keep

    def _step(self, step: Callable[[], None]) -> None:
        if self.report is not None:
            raise CopyError(
                "copy_already_settled",
                f"This copy was already settled ({self.report.outcome.value}).",
                ["Start a new copy."],
            )
        settle_load(step, settle=self._settle, failure=self._failure, error=_copy_error)

    # -- outcome ------------------------------------------------------------------------------

    def _failure(self, exc: Exception) -> DponeError:
        """The stable error of a failed copy (which side failed, read before settling)."""
        if isinstance(exc, DponeError):
            return exc
        unchanged = "The target was left unchanged and the staging tables were dropped."
        cause = redact(str(exc)).strip().rstrip(".")
        side: FailureSide = "source" if self.extraction.source_failed(self.target) else "target"
        code = "source_read_failed" if side == "source" else "target_load_failed"
        outage = DatabaseError.from_catalog(DATABASE_ERRORS, code, f"{cause}. {unchanged}")
        if not isinstance(exc, psycopg.Error):
            return outage
        known = [t for p in self.plans for t in (p.source, p.target)]
        conn = None if side == "source" else self._target
        return database_error(exc, side, outage=outage, conn=conn, known=known)

    def _settle(self, outcome: TerminalOutcome) -> CopyReport:
        if self.report is not None:  # the first decision wins
            return self.report
        strategy, load = self.extraction, self._load
        assert load is not None
        strategy.settle(outcome)
        evidence = strategy.evidence
        self.report = CopyReport(
            strategy=self.strategy,
            sink=self.sink,
            outcome=outcome,
            snapshot_label=(
                SnapshotLabel.SINGLE_SNAPSHOT if evidence else SnapshotLabel.NO_SNAPSHOT_CLAIM
            ),
            source_token=token_digest(evidence.token) if evidence else None,
            tables=tuple(
                TableCopyReport(
                    source=table.plan.source,
                    target=table.plan.target,
                    extraction_receipt=None if artifact is None else artifact.extraction_receipt,
                    terminal_receipt=None if artifact is None else artifact.terminal_receipt,
                    rows_loaded=table.rows_loaded,
                    sink_result=table.sink_result,
                    copy_format=table.plan.copy_format,
                    copy_format_reason=table.plan.copy_format_reason,
                    columns=table.plan.column_names,
                    row_versions=table.row_versions if outcome is TerminalOutcome.SUCCESS else None,
                    schema_changes=table.plan.schema_changes,
                    target_types=table.plan.target_types,
                    virtual_as_stored=table.plan.virtual_as_stored,
                )
                for table, artifact in zip(load.tables, strategy.artifacts, strict=True)
            ),
        )
        return self.report


def _copy_error(error: DponeError, report: CopyReport) -> CopyError:
    return CopyError(error.code, error.message, error.next_actions, report=report)


def _not_planned() -> CopyError:
    return CopyError("copy_step_out_of_order", "The copy was not planned.", ["Call plan() first."])


def _identity(conn: Connection) -> tuple[object, ...]:
    row = conn.execute(_IDENTITY).fetchone()
    assert row is not None
    return tuple(row)
