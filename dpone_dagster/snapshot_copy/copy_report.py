"""What a snapshot copy reports: per-table receipts, the terminal outcome, the snapshot label."""

from __future__ import annotations

from dataclasses import dataclass, field

from dpone_dagster.lifecycle import (
    ArtifactTerminalReceipt,
    DponeError,
    ExtractionLifecycleReceipt,
    SnapshotLabel,
    TerminalOutcome,
)
from dpone_dagster.postgres.evidence import RowVersionEvidence
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.schema_change import ColumnChange
from dpone_dagster.postgres.sinks import SinkResult
from dpone_dagster.postgres.target_plan import Sink
from dpone_dagster.postgres.target_types import TargetTypes

from .options import Strategy


@dataclass(frozen=True)
class TableCopyReport:
    """One table's copy.

    Attributes:
        source: The source table.
        target: The target table.
        extraction_receipt: The extraction's latest receipt (None if the table was never
            reached because an earlier table failed).
        terminal_receipt: The artifact's terminal receipt.
        rows_loaded: Rows the target's command tags reported for the staging table.
        sink_result: What the sink did (None when the copy failed before it ran).
        copy_format: The COPY format used.
        columns: The copied columns' names, in order (generated columns excluded): the list a
            reconciliation digests on both sides.
        row_versions: Who wrote the target's rows, when the load can vouch that it wrote them
            all exactly (the reconciliation then proves them without hashing).
        copy_format_reason: Why the rows moved as text, when they did (a user-defined type, or
            a type whose binary form is not certified between the servers' major versions).
        schema_changes: What the load changed in the existing target's schema (applied only
            when the outcome is ``success``).
        target_types: What the load created in the target for the table's user-defined types:
            extensions and types (committed with the rows, so only when the outcome is
            ``success``) and enum labels added (committed just before the load, whatever its
            outcome: PostgreSQL lets no transaction use a label it added).
        virtual_as_stored: The source's ``VIRTUAL`` generated columns that the target this load
            created defines as ``STORED`` (a target before PostgreSQL 18); same values.
    """

    source: TableName
    target: TableName
    extraction_receipt: ExtractionLifecycleReceipt | None
    terminal_receipt: ArtifactTerminalReceipt | None
    rows_loaded: int | None
    sink_result: SinkResult | None
    copy_format: str
    columns: tuple[str, ...] = ()
    row_versions: RowVersionEvidence | None = None
    copy_format_reason: str | None = None
    schema_changes: tuple[ColumnChange, ...] = ()
    target_types: TargetTypes = field(default_factory=TargetTypes)
    virtual_as_stored: tuple[str, ...] = ()

    @property
    def rows_extracted(self) -> int | None:
        """Rows the extraction receipt counted (None until it completed)."""
        receipt = self.extraction_receipt
        return None if receipt is None else receipt.row_count


@dataclass(frozen=True)
class CopyReport:
    """The result of :func:`~dpone_dagster.snapshot_copy.engine.copy_tables`.

    Attributes:
        strategy: The extraction strategy.
        sink: The sink.
        outcome: The terminal outcome every table's artifact was settled with.
        snapshot_label: ``single_snapshot`` when all tables were read under one snapshot, else
            ``no_snapshot_claim``.
        source_token: Digest of that snapshot's server-issued token (never the token).
        tables: One report per table, in the order given.
    """

    strategy: Strategy
    sink: Sink
    outcome: TerminalOutcome
    snapshot_label: SnapshotLabel
    source_token: str | None
    tables: tuple[TableCopyReport, ...]

    @property
    def rows_loaded(self) -> int:
        """Rows loaded over all tables."""
        return sum(t.rows_loaded or 0 for t in self.tables)


class CopyError(DponeError):
    """A snapshot copy failed; every artifact was settled and nothing was half-written.

    Attributes:
        report: The copy's report: the receipts and the terminal outcome (``abort``, or
            ``retain_commit_unknown`` for ``target_commit_unknown``).
    """

    def __init__(
        self,
        code: str,
        message: str,
        next_actions: tuple[str, ...] | list[str] = (),
        *,
        report: CopyReport | None = None,
    ) -> None:
        super().__init__(code, message, next_actions)
        self.report = report
