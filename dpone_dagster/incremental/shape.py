"""The shape of a stream: the columns that move, the key, the cursor, and the keyset order.

A stream reads its rows in ``(cursor, key)`` order with strict row comparison: a batch starts
strictly after the last ``(cursor, key)`` the previous batch copied, so rows with equal cursor
values split across batches (or runs) are neither lost nor read twice. Every value reaches SQL
as a bind parameter cast from text to its column's type; every name through
:class:`psycopg.sql.Identifier`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.keyed import keyed_sides, live_rows
from dpone_dagster.cursor.stream_documents import Checkpoint
from dpone_dagster.cursor.table_check import MOVING_MARK_CHECK, CursorTables
from dpone_dagster.postgres import check_identifier
from dpone_dagster.postgres.catalog import Column, TableCatalog, column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_catalog import TargetCatalog, target_catalog
from dpone_dagster.postgres.threads import at_once
from dpone_dagster.reconcile.compare import Rows, Side


@dataclass(frozen=True)
class StreamShape(CursorTables):
    """A resolved stream (see :class:`~dpone_dagster.cursor.table_check.CursorTables`).

    Attributes:
        soft_column: The target's deleted-at column for ``soft`` deletes (else ``None``).
    """

    soft_column: str | None = None

    @property
    def cursor_is_time(self) -> bool:
        """The cursor is a date or a timestamp (a ``lookback`` applies, a lag is measured)."""
        return self.cursor.type_name in ("date", "timestamp", "timestamptz")

    def live(self) -> sql.Composable:
        """The target's live rows: those a ``soft`` delete has not marked."""
        return live_rows(self.soft_column)

    def sides(
        self, src: Connection, tgt: Connection, *, rows: bool,
        where: sql.Composable | None = None, params: Sequence[object] = (),
    ) -> tuple[Side, Side, Rows]:  # fmt: skip
        """Both sides of the one drill-down compare (:func:`dpone_dagster.core.sweep.
        keyed_sides`), the source's cursor sent with a difference."""
        return keyed_sides(self, src, tgt, rows=rows, where=where, params=params,
                           cursor=self.cursor)  # fmt: skip

    def cast(self, column: Column) -> sql.Composed:
        """A bind parameter cast from text to ``column``'s type."""
        return sql.SQL("CAST(%s::text AS {})").format(sql.SQL(column.type_sql))

    def order(self) -> list[Column]:
        """The keyset order: the cursor, then the key columns that are not the cursor."""
        return [self.cursor, *(k for k in self.key if k.name != self.cursor.name)]

    def range_where(
        self, lower: str | None, after: Checkpoint | None, mark: str | None
    ) -> tuple[sql.Composable, list[str]]:
        """The rows after ``after`` (or above ``lower``) and at most ``mark``, with parameters
        (no row when there is no mark: the table was empty)."""
        if mark is None:
            return sql.SQL("false"), []
        parts: list[sql.Composable] = [
            sql.SQL("{} <= {}").format(self.cursor.ident, self.cast(self.cursor))
        ]
        params: list[str] = [mark]
        if after is not None:
            order = self.order()
            parts.append(
                sql.SQL("({}) > ({})").format(
                    column_list(order), sql.SQL(", ").join(self.cast(c) for c in order)
                )
            )
            params += [after.cursor, *self._key_after(after)]
        elif lower is not None:
            parts.append(sql.SQL("{} > {}").format(self.cursor.ident, self.cast(self.cursor)))
            params.append(lower)
        return sql.SQL(" AND ").join(parts), params

    def _key_after(self, after: Checkpoint) -> list[str]:
        return [v for k, v in zip(self.key, after.key, strict=True) if k.name != self.cursor.name]

    def select_batch(
        self, lower: str | None, after: Checkpoint | None, mark: str | None, size: int
    ) -> tuple[sql.Composed, list[object]]:
        """The next batch's rows in keyset order, and their parameters."""
        where, params = self.range_where(lower, after, mark)
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT {}").format(
            column_list(self.columns), self.source.ident, where, column_list(self.order()),
            sql.Literal(size),
        )  # fmt: skip
        return query, list(params)

    def last_row(self, table: TableName) -> sql.Composed:
        """The last ``(cursor, key)`` of ``table`` in keyset order, as text.

        The inner query orders the table's own columns and keeps one row, so only that row is
        spelled as text (an outer cast would spell every row before the sort).
        """
        order = self.order()  # the cursor and every key column
        query = (
            "SELECT r.{}::text, ARRAY[{}]::text[] FROM (SELECT {} FROM {} ORDER BY {} LIMIT 1) AS r"
        )
        return sql.SQL(query).format(
            self.cursor.ident,
            sql.SQL(", ").join(sql.SQL("r.{}::text").format(k.ident) for k in self.key),
            column_list(order),
            table.ident,
            sql.SQL(", ").join(sql.SQL("{} DESC").format(c.ident) for c in order),
        )


@dataclass(frozen=True)
class StreamCatalogs:
    """What both catalogs say of a stream's tables.

    Attributes:
        source: The source table's columns, key and index-leading columns.
        target: The target's catalog (``None``: it does not exist yet).
    """

    source: TableCatalog
    target: TargetCatalog | None


def read_catalogs(
    src: Connection, tgt: Connection, source: TableName, target: TableName
) -> StreamCatalogs:
    """Reads both tables' catalogs, each side in its own session at the same time.

    Raises:
        EngineError: ``table_not_found`` for a source table that does not exist.
        DatabaseError: ``source_permission_denied`` without ``SELECT`` on it.
    """
    found, target_side = at_once(
        partial(MOVING_MARK_CHECK.source_catalog, src, source),
        partial(target_catalog, tgt, target, swap=False),
    )
    return StreamCatalogs(found, target_side)


def resolve_stream(
    found: StreamCatalogs, source: TableName, target: TableName, cursor: str, soft: str | None
) -> StreamShape:
    """Refuses a stream that cannot be copied incrementally, from both catalogs (the one table
    check with the stream's codes, :data:`~dpone_dagster.cursor.table_check.MOVING_MARK_CHECK`:
    an existing target must have the source's key).

    Raises:
        EngineError: ``cursor_not_found``, ``incremental_cursor_invalid``,
            ``incremental_primary_key_missing``, ``incremental_cursor_unindexed``,
            ``incremental_target_key_differs``, ``incremental_options_invalid`` (a soft-delete
            column that is also a source column).
    """
    target_found = None if found.target is None else found.target.table
    tables = MOVING_MARK_CHECK.tables(found.source, target_found, source, target, cursor)
    if soft is not None:
        check_identifier(soft, what="soft-delete column")
        if soft in {c.name for c in tables.columns}:
            raise engine_error(
                "incremental_options_invalid",
                f"The soft-delete column {soft!r} is a column of the source {source}.",
                ["Name a column the source does not have (the default is _dpone_deleted_at)."],
            )
    return StreamShape(
        tables.source, tables.target, tables.columns, tables.cursor, tables.key, soft_column=soft
    )
