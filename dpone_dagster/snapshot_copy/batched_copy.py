"""Batched COPY: a lazy generator of primary-key-range batches, all read under one snapshot.

Nothing happens when the artifact is built. The first ``next()`` opens (or joins) the
``REPEATABLE READ READ ONLY`` snapshot transaction and opens the receipt's window. Each batch is
one ``COPY (SELECT ... WHERE key > lower AND key <= upper) TO STDOUT`` whose upper key is read
first from the primary-key index; the batches follow the key order. When no key lies beyond the
last batch, the generator completes the receipt and yields the terminal empty batch: exhaustion
is proved, not assumed. A table without a primary key is one batch.

Key values go back to the server as the text PostgreSQL printed for them (exact for every key
type), as parameters of the range query and of the ``COPY`` (``cursor.copy(statement, params)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from psycopg import sql
from psycopg.abc import Buffer

from dpone_dagster.lifecycle import ExtractResult, LifecycleError
from dpone_dagster.postgres.catalog import Column, column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import (
    CopyFormat,
    RelayResult,
    copy_in_statement,
    copy_out_statement,
    relay,
    select_columns,
)
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.options import SNAPSHOT_COPY_BATCH_SIZE
from dpone_dagster.postgres.snapshot import LazySnapshot, SnapshotSession

from .copy_progress import ProgressMeter
from .options import Strategy
from .strategy import ExtractionStrategy
from .table_artifact import TableArtifact, open_window

KeyValue = tuple[str, ...]
Where = tuple[sql.Composable | None, list[str]]


class CopyBatch:
    """One batch: the rows whose key lies in ``(lower, upper]``, read by one COPY.

    A batch is read live from the source session and must be consumed (through :meth:`blocks`
    or :meth:`relay_into`) before the next batch is requested.

    Attributes:
        index: The batch's position, from 0.
        lower: The exclusive lower key (None for the first batch).
        upper: The inclusive upper key (None for an unkeyed batch and the terminal batch).
        terminal: The empty batch that proves the table is exhausted.
        rows: Rows read, from the COPY command tag (known once consumed).
        bytes: Bytes read.
    """

    def __init__(
        self,
        session: SnapshotSession | None,
        statement: sql.Composed | None,
        params: Sequence[str] = (),
        *,
        index: int,
        lower: KeyValue | None,
        upper: KeyValue | None,
    ) -> None:
        self._session = session
        self._statement = statement
        self._params = list(params)
        self.index = index
        self.lower = lower
        self.upper = upper
        self.terminal = statement is None
        self.rows: int | None = 0 if self.terminal else None
        self.bytes = 0

    @property
    def consumed(self) -> bool:
        """True once the batch's rows were read."""
        return self.rows is not None

    def _start(self) -> tuple[SnapshotSession, sql.Composed]:
        if self.consumed or self._session is None or self._statement is None:
            raise LifecycleError(
                "batch_already_consumed",
                f"Batch {self.index} was already consumed (or is the terminal batch).",
                ["Read each batch once."],
            )
        return self._session, self._statement

    def blocks(self) -> Iterator[Buffer]:
        """Yields the batch's COPY blocks as the server sends them (the terminal batch: none)."""
        if self.terminal:
            return
        session, statement = self._start()
        cur = session.conn.cursor()
        with cur.copy(statement, self._params or None) as copy:
            for block in copy:
                self.bytes += len(block)
                yield block
        self.rows = cur.rowcount

    def relay_into(
        self,
        target: Connection,
        copy_in: sql.Composed,
        *,
        on_write: Callable[[int], None] | None = None,
    ) -> RelayResult:
        """Relays the batch into a target ``COPY ... FROM STDIN`` without parsing rows."""
        if self.terminal:
            return RelayResult(rows_out=0, rows_in=0, bytes=0)
        session, statement = self._start()
        result = relay(
            session.conn, statement, target, copy_in, params=self._params, on_write=on_write
        )
        self.rows, self.bytes = result.rows_out, result.bytes
        return result


class BatchedCopyArtifact(TableArtifact):
    """A table read as a lazy sequence of :class:`CopyBatch` under one snapshot.

    Args:
        snapshot: Opens (or shares) the snapshot session on first consumption.
        table: The source table.
        columns: The columns read.
        copy_format: The COPY format.
        key: The primary-key columns, in key order (empty: one batch).
        batch_size: Rows per batch.
    """

    def __init__(
        self,
        snapshot: LazySnapshot,
        table: TableName,
        columns: Sequence[Column],
        copy_format: CopyFormat | None = None,
        *,
        key: Sequence[str] = (),
        batch_size: int = SNAPSHOT_COPY_BATCH_SIZE,
    ) -> None:
        super().__init__(table, columns, copy_format)
        self.key = tuple(key)
        self.batch_size = batch_size
        self._snapshot = snapshot
        self._started = False

    def batches(self) -> Iterator[CopyBatch]:
        """The batches, then the terminal empty batch; can be iterated once.

        Raises:
            LifecycleError: ``batches_already_iterated`` on a second call;
                ``batch_not_consumed`` when a batch was skipped without reading it.
        """
        if self._started:
            raise LifecycleError(
                "batches_already_iterated",
                f"The batches of {self.table} were already iterated.",
                ["Extract again for a second pass."],
            )
        self._started = True
        return self._generate()

    def _generate(self) -> Iterator[CopyBatch]:
        session = self._snapshot.get()  # the first consumption opens the transaction
        self.attach_source(session.transaction)
        open_window(self.lifecycle, session)
        rows = size = 0
        lower: KeyValue | None = None
        for index in itertools.count():
            upper = self._next_upper(session, lower) if self.key else None
            if (upper is None) if self.key else index > 0:
                # No key beyond the last batch (or the one unkeyed batch was read): exhausted.
                self.lifecycle.complete(
                    row_count=rows, byte_count=size, completed_at=session.clock_timestamp()
                )
                yield CopyBatch(None, None, index=index, lower=lower, upper=None)
                return
            where, params = self._where(lower, upper)
            statement = copy_out_statement(
                select_columns(self.table, self.columns, where=where), self.copy_format
            )
            batch = CopyBatch(session, statement, params, index=index, lower=lower, upper=upper)
            yield batch
            if batch.rows is None:
                raise LifecycleError(
                    "batch_not_consumed",
                    f"Batch {index} of {self.table} was not read before the next was requested.",
                    ["Read every batch (blocks() or relay_into()) before asking for the next."],
                )
            rows, size, lower = rows + batch.rows, size + batch.bytes, upper

    def _where(self, lower: KeyValue | None, upper: KeyValue | None) -> Where:
        """``(key) > (lower) AND (key) <= (upper)`` and its parameters (absent bounds omitted)."""
        keys = sql.SQL("({})").format(column_list(self.key))
        row = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() for _ in self.key))
        parts: list[sql.Composable] = []
        params: list[str] = []
        for bound, op in ((lower, ">"), (upper, "<=")):
            if bound is not None:
                parts.append(sql.SQL("{} {} {}").format(keys, sql.SQL(op), row))
                params.extend(bound)
        return (sql.SQL(" AND ").join(parts) if parts else None), params

    def _next_upper(self, session: SnapshotSession, lower: KeyValue | None) -> KeyValue | None:
        """The key of the last row of the next batch, read from the key index (None: no rows).

        That is the ``batch_size``-th key after ``lower`` (an index-only scan that skips the
        keys before it) or, when fewer rows remain, the last key.
        """
        # Qualified: a bare name would sort by the ::text output column of the same name.
        keys = [sql.Identifier(self.table.schema, self.table.name, k) for k in self.key]
        where, params = self._where(lower, None)
        base = sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(k) for k in keys),
            self.table.ident,
            sql.SQL("") if where is None else sql.SQL(" WHERE {}").format(where),
        )
        ascending = sql.SQL(", ").join(keys)
        descending = sql.SQL(", ").join(sql.SQL("{} DESC").format(k) for k in keys)
        for order, offset in ((ascending, self.batch_size - 1), (descending, 0)):
            query = sql.SQL("{} ORDER BY {} LIMIT 1 OFFSET %s").format(base, order)
            row = session.conn.execute(query, [*params, offset]).fetchone()
            if row is not None:
                return tuple(str(v) for v in row)
        return None

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """Relays every batch into ``staging``, one COPY per batch."""
        copy_in = copy_in_statement(
            staging, self.columns, self.copy_format, freeze=self.freeze_load
        )
        return sum(
            batch.relay_into(conn, copy_in, on_write=meter).rows_in for batch in self.batches()
        )


def batched_copy(
    snapshot: LazySnapshot,
    table: TableName,
    columns: Sequence[Column],
    *,
    key: Sequence[str] = (),
    batch_size: int = SNAPSHOT_COPY_BATCH_SIZE,
    copy_format: CopyFormat | None = None,
) -> ExtractResult[BatchedCopyArtifact]:
    """Builds a lazy batched-COPY artifact; nothing is read (and the receipt stays pending)
    until its batches are first consumed.

    Args:
        snapshot: The (lazy) snapshot session the batches read in.
        table: The source table.
        columns: The columns to read.
        key: The primary-key columns in key order; empty reads the table as one batch.
        batch_size: Rows per batch.
        copy_format: ``binary`` or ``text``; chosen from the column types when omitted.

    Returns:
        The pending artifact.
    """
    return ExtractResult(
        BatchedCopyArtifact(snapshot, table, columns, copy_format, key=key, batch_size=batch_size)
    )


class BatchedCopyStrategy(ExtractionStrategy):
    """Builds lazy artifacts sharing one snapshot, opened when the load first reads a batch."""

    name = Strategy.BATCHED_COPY

    def plan_reads(self) -> None:
        """Builds every table's lazy artifact (nothing is read yet)."""
        lazy = LazySnapshot(self.reads.open_session)
        for index, plan in enumerate(self.reads.plans):
            self.artifacts[index] = BatchedCopyArtifact(
                lazy,
                plan.source,
                plan.columns,
                plan.copy_format,
                key=plan.key,
                batch_size=self.reads.options.batch_size,
            )
