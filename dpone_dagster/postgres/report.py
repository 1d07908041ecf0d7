"""What a snapshot copy reports: per-table receipts, the terminal outcome, the snapshot label."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from dpone_dagster.lifecycle import (
    ArtifactTerminalReceipt,
    DponeError,
    ExtractionLifecycleReceipt,
    TerminalOutcome,
)

from .identifiers import TableName
from .plan import Sink
from .sinks import SinkResult

Strategy = Literal["whole", "streamed", "batched", "partitioned", "internal"]
STRATEGIES: tuple[Strategy, ...] = ("whole", "streamed", "batched", "partitioned", "internal")


class SnapshotLabel(StrEnum):
    """Whether a materialization's rows came from one source snapshot."""

    SINGLE = "single_snapshot"
    """Every table of the copy was read under one snapshot (its token digest is reported)."""
    NONE = "no_snapshot_claim"
    """No snapshot can be claimed (the reading session supplied no snapshot evidence)."""


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
            reconciliation fingerprints on both sides.
    """

    source: TableName
    target: TableName
    extraction_receipt: ExtractionLifecycleReceipt | None
    terminal_receipt: ArtifactTerminalReceipt | None
    rows_loaded: int | None
    sink_result: SinkResult | None
    copy_format: str
    columns: tuple[str, ...] = ()

    @property
    def rows_extracted(self) -> int | None:
        """Rows the extraction receipt counted (None until it completed)."""
        receipt = self.extraction_receipt
        return None if receipt is None else receipt.row_count


@dataclass(frozen=True)
class CopyReport:
    """The result of :func:`~dpone_dagster.postgres.snapshot_copy.copy_tables`.

    Attributes:
        strategy: The extraction strategy.
        sink: The sink.
        outcome: The terminal outcome every table's artifact was settled with.
        snapshot_label: ``single_snapshot`` when all tables were read under one snapshot.
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
