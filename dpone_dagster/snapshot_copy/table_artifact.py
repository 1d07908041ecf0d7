"""PostgreSQL extraction artifacts: one table read under a snapshot, loadable into staging.

Every artifact publishes its receipt through its lifecycle authority at the strategy's truthful
boundaries, dated by the server's ``clock_timestamp()`` (clock authority
``postgresql.clock_timestamp``): the window opens with a timestamp read *before* the first row is
read and closes with one read *after* the last byte arrived and was counted.

This module holds the base every strategy's artifact builds on; each strategy lives in the
module named after it (``whole_copy``, ``stream_rows``, ``batched_copy``, ``partitioned_copy``,
``internal_query``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dpone_dagster.lifecycle import ExtractionArtifact, ExtractionLifecycleAuthority
from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import CopyFormat, copy_format_for
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import POSTGRES_CLOCK, SnapshotSession

from .copy_progress import ProgressCallback, ProgressMeter, progress_hook


class TableArtifact(ExtractionArtifact):
    """Base of the PostgreSQL artifacts: one table's rows, on their way to a staging table.

    Args:
        table: The source table.
        columns: The columns read, in order (generated columns excluded by the planner).
        copy_format: The COPY format of the rows (``binary`` unless a column needs ``text``).
        share_with: Build a view sharing another artifact's authorities.

    Attributes:
        freeze_load: :meth:`load_into` writes the rows with ``COPY ... FREEZE``
            (:func:`~dpone_dagster.postgres.copy.copy_in_statement`): set by a load whose
            staging tables are created in the transaction that loads them
            (:class:`~.strategy.ExtractionStrategy`).
    """

    def __init__(
        self,
        table: TableName,
        columns: Sequence[Column],
        copy_format: CopyFormat | None = None,
        *,
        share_with: ExtractionArtifact | None = None,
    ) -> None:
        super().__init__(share_with=share_with)
        self.table = table
        self.columns = tuple(columns)
        self.copy_format: CopyFormat = copy_format or copy_format_for(self.columns)
        self.load_meter: ProgressMeter | None = None
        self.freeze_load = False

    @property
    def source_label(self) -> str:
        """The source table, for messages."""
        return str(self.table)

    @property
    def exact_rows(self) -> bool:
        """True when the rows travel as binary COPY (the source's bytes, exactly)."""
        return self.copy_format == "binary"

    @property
    def writers(self) -> tuple[int, ...]:
        """Other transactions that wrote the rows into staging (none: the load's own did)."""
        return ()

    def report_progress(self, progress: ProgressCallback | None, every: int = 64 << 20) -> None:
        """Calls ``progress`` each time another ``every`` bytes were loaded."""
        self.load_meter = progress_hook(progress, self.table, "load", every)

    def load_into(self, conn: Connection, staging: TableName) -> int:
        """Writes this artifact's rows into ``staging`` in ``conn``'s current transaction.

        Args:
            conn: The target session.
            staging: The staging table (its columns carry the same names).

        Returns:
            The rows the target's command tag reported.
        """
        return self._load(conn, staging, self.load_meter)

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """Writes the rows (the strategy's own way); ``meter`` counts the bytes, if anyone
        listens."""
        raise NotImplementedError


def open_window(
    lifecycle: ExtractionLifecycleAuthority, session: SnapshotSession
) -> ExtractionLifecycleAuthority:
    """Opens a receipt's window now, by the server's clock, and records the session's snapshot.

    Call it right before the first read: the timestamp is read first, so the window starts at
    or before the first row.
    """
    lifecycle.acquire(started_at=session.clock_timestamp(), clock_authority=POSTGRES_CLOCK)
    lifecycle.acquire_snapshot(session.evidence)
    return lifecycle
