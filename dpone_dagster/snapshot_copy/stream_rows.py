"""Streamed rows: a server-side cursor whose transaction lives until the terminal outcome.

Rows reach Python one by one, so this is the strategy for callers that want to look at rows
(and the slowest way to move them: every value is handed over and written again). Each value
is the text PostgreSQL prints for it (``None`` for NULL), which is exact for every type,
including ``NaN``, ``infinity`` and user-defined types that have no Python equivalent.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

from psycopg import sql

from dpone_dagster.lifecycle import ExtractResult, LifecycleError
from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import copy_in_statement
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import SnapshotSession

from .copy_progress import ProgressMeter
from .options import Strategy
from .strategy import ExtractionStrategy
from .table_artifact import TableArtifact, open_window

TextRow = tuple[str | None, ...]


class StreamRowsArtifact(TableArtifact):
    """A table read row by row through a server-side cursor.

    The cursor and its read-only transaction stay open until the terminal decision: ``success``
    commits and closes them, ``abort`` and ``retain_commit_unknown`` roll back and close them.
    The receipt completes when the cursor is exhausted, with the number of rows handed out.

    Args:
        session: The snapshot session; its transaction becomes the artifact's live source.
        table: The source table.
        columns: The columns read.
        fetch_rows: Rows fetched from the server per round trip.
    """

    def __init__(
        self,
        session: SnapshotSession,
        table: TableName,
        columns: Sequence[Column],
        *,
        fetch_rows: int = 5000,
    ) -> None:
        super().__init__(table, columns, "text")
        self.fetch_rows = max(1, fetch_rows)
        self._session = session
        self._consumed = False
        self.attach_source(session.transaction)
        self._cursor = session.conn.cursor(name=f"dpone_rows_{uuid.uuid4().hex[:12]}")
        session.transaction.add_cursor(self._cursor)

    @property
    def exact_rows(self) -> bool:
        """False: the rows travel as text, parsed again by the target."""
        return False

    def declare(self) -> None:
        """Opens the window (server clock) and declares the cursor: the read begins."""
        # Every value as text: the type's own output function, exact for every value.
        select = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(c.ident) for c in self.columns),
            self.table.ident,
        )
        open_window(self.lifecycle, self._session)
        self._cursor.execute(select)

    def rows(self) -> Iterator[TextRow]:
        """Yields every row once, as PostgreSQL's text of each value.

        Raises:
            LifecycleError: ``stream_already_consumed`` on a second call.
        """
        if self._consumed:
            raise LifecycleError(
                "stream_already_consumed",
                f"The row stream of {self.table} was already consumed.",
                ["Extract again for a second pass."],
            )
        self._consumed = True
        return self._generate()

    def _generate(self) -> Iterator[TextRow]:
        count = 0
        while batch := self._cursor.fetchmany(self.fetch_rows):
            count += len(batch)
            yield from batch
        self.lifecycle.complete(row_count=count, completed_at=self._session.clock_timestamp())

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """Writes every row into ``staging`` with a text ``COPY ... FROM STDIN`` (progress
        counts the characters of the values)."""
        cur = conn.cursor()
        statement = copy_in_statement(staging, self.columns, "text", freeze=self.freeze_load)
        with cur.copy(statement) as copy:
            for row in self.rows():
                copy.write_row(row)
                if meter is not None:
                    meter(sum(len(v) for v in row if v is not None))
        return cur.rowcount


def stream_rows(
    session: SnapshotSession,
    table: TableName,
    columns: Sequence[Column],
    *,
    fetch_rows: int = 5000,
) -> ExtractResult[StreamRowsArtifact]:
    """Opens a server-side cursor over ``table`` in ``session``'s snapshot.

    The window opens now (server clock), before the cursor is declared; the session's
    transaction becomes a live source of the artifact.

    Args:
        session: The snapshot session (its transaction stays open until the terminal outcome).
        table: The source table.
        columns: The columns to read.
        fetch_rows: Rows per fetch.

    Returns:
        The artifact, acquired and not yet completed.
    """
    artifact = StreamRowsArtifact(session, table, columns, fetch_rows=fetch_rows)
    try:
        artifact.declare()
    except BaseException:
        artifact.abort()  # rolls back and closes the session; nobody else holds the artifact
        raise
    return ExtractResult(artifact)


class StreamRowsStrategy(ExtractionStrategy):
    """Opens the snapshot session before the load; each table's cursor opens at its read."""

    name = Strategy.STREAM_ROWS

    def plan_reads(self) -> None:
        """Opens the snapshot session the cursors will read in."""
        self.reads.open_session()

    def _open(self, index: int) -> TableArtifact:
        plan = self.reads.plans[index]
        session = self.reads.sessions[0]
        artifact = StreamRowsArtifact(
            session, plan.source, plan.columns, fetch_rows=self.reads.tuning.fetch_rows
        )
        self.artifacts[index] = artifact  # settled with the others even if declaring fails
        artifact.declare()
        return artifact
