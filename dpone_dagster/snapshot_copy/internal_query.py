"""Internal query: a same-database copy by ``INSERT INTO staging ... SELECT``.

No file and no cursor exist: the target session reads the source table itself. The receipt's
window opens right before that statement and completes right after it, by the server's clock.
Extraction completion does not mean target commit: the sink runs afterwards in the same
transaction. The receipt claims a snapshot only when the session supplies native evidence of
one (a ``REPEATABLE READ`` transaction whose ``pg_current_snapshot()`` was read first).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import SnapshotEvidence
from dpone_dagster.postgres.catalog import Column, column_list
from dpone_dagster.postgres.connection import Connection, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import (
    POSTGRES_CLOCK,
    read_snapshot,
    server_clock,
    set_transaction_snapshot,
)

from .copy_progress import ProgressMeter
from .options import Strategy
from .strategy import ExtractionStrategy, SourceReads
from .table_artifact import TableArtifact


class InternalQueryArtifact(TableArtifact):
    """A table copied inside one database by the target session's ``INSERT ... SELECT``.

    Args:
        table: The source table (in the target session's database).
        columns: The columns copied.
        session_snapshot: The snapshot evidence of the target session's transaction, when it
            has one; without it the receipt makes no snapshot claim.
    """

    def __init__(
        self,
        table: TableName,
        columns: Sequence[Column],
        *,
        session_snapshot: SnapshotEvidence | None = None,
    ) -> None:
        super().__init__(table, columns, "text")
        self.session_snapshot = session_snapshot

    @property
    def exact_rows(self) -> bool:
        """True: ``INSERT ... SELECT`` in one database copies the stored values."""
        return True

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """Runs ``INSERT INTO staging (...) SELECT ... FROM table`` and publishes the receipt
        (no progress: one statement)."""
        names = column_list(self.columns)
        statement = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
            staging.ident, names, names, self.table.ident
        )
        self.lifecycle.acquire(started_at=server_clock(conn), clock_authority=POSTGRES_CLOCK)
        if self.session_snapshot is not None:
            self.lifecycle.acquire_snapshot(self.session_snapshot)
        rows = conn.execute(statement).rowcount
        self.lifecycle.complete(row_count=rows, completed_at=server_clock(conn))
        return rows


class InternalQueryStrategy(ExtractionStrategy):
    """Reads in the load's own target transaction: nothing is read before the load."""

    name = Strategy.INTERNAL_QUERY

    def __init__(self, reads: SourceReads) -> None:
        super().__init__(reads)
        self.session_snapshot: SnapshotEvidence | None = None

    def begin_load(self, target: Connection) -> None:
        """Begins a ``REPEATABLE READ READ WRITE`` transaction whose first statement fixes its
        snapshot (the caller's, when one is held): every table of the set is read in it."""
        set_transaction_mode(target, psycopg.IsolationLevel.REPEATABLE_READ, read_only=False)
        token = self.reads.tuning.snapshot_token
        if token is None:
            self.session_snapshot, _ = read_snapshot(target)
        else:
            self.session_snapshot = set_transaction_snapshot(target, token)

    def _open(self, index: int) -> TableArtifact:
        plan = self.reads.plans[index]
        return InternalQueryArtifact(
            plan.source, plan.columns, session_snapshot=self.session_snapshot
        )

    @property
    def evidence(self) -> SnapshotEvidence | None:
        """The target transaction's snapshot evidence."""
        return self.session_snapshot
