"""The shape of a backfill: which columns move, which key identifies a row, how the cursor sorts.

Any legal PostgreSQL identifier works (``"Order Items"`` included), because no name is ever
pasted into SQL text: every name (schema, table, column, the cursor's type) reaches SQL through
:class:`psycopg.sql.Identifier`. Every cursor value is a bind parameter cast from text to the
cursor's own type (``%s::text::"pg_catalog"."int8"``), so values compare by the column's
ordering, never as text. Cursor values are kept as the server's canonical text in a session
pinned to ``TimeZone=UTC`` and ISO dates, so the same value always has the same spelling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import psycopg
from psycopg import sql

from dpone_dagster.core.cursors import is_cursor_type
from dpone_dagster.core.errors import cursor_not_found, engine_error
from dpone_dagster.core.tables import TablePair
from dpone_dagster.postgres.catalog import (
    CatalogError,
    Column,
    TableCatalog,
    column_list,
    normal_type,
    table_catalog,
)
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import CopyFormat, copy_format_for, major_versions
from dpone_dagster.postgres.evidence import TableKeys, keys_for
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.privileges import require_table
from dpone_dagster.postgres.schema_change import column_differences

from .protocol import BackfillScope, TableRef


@dataclass(frozen=True)
class TableShape(TablePair):
    """A backfill's resolved tables (see :class:`~dpone_dagster.core.tables.TablePair`).

    Attributes:
        key: The primary-key column names (equal on both sides).
        fmt: ``binary``, or ``text`` when a user-defined type is copied.
        versions: Both tables' row-version keys, or ``None`` when row versions cannot prove
            their content (:mod:`dpone_dagster.postgres.evidence`).
    """

    key: tuple[str, ...]
    fmt: CopyFormat
    versions: TableKeys | None = None

    @property
    def cursor_type(self) -> sql.Identifier:
        """The cursor's type, composed for SQL (``"pg_catalog"."timestamptz"``)."""
        return sql.Identifier(self.cursor.type_schema, self.cursor.type_name)

    def value(self) -> sql.Composed:
        """A bind parameter cast to the cursor's type."""
        return sql.SQL("%s::text::{}").format(self.cursor_type)

    def where(self, after: str | None, upper: str | None) -> tuple[sql.Composable, list[str]]:
        """``cursor > after AND cursor <= upper`` (omitting absent bounds) and its parameters."""
        parts: list[sql.Composable] = []
        params: list[str] = []
        if after is not None:
            parts.append(sql.SQL("{} > {}").format(self.cursor.ident, self.value()))
            params.append(after)
        if upper is not None:
            parts.append(sql.SQL("{} <= {}").format(self.cursor.ident, self.value()))
            params.append(upper)
        return (sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")), params

    def order_by(self) -> sql.Composed:
        """The cursor, then the key: a total, deterministic order of the rows."""
        names = [self.cursor.name, *(k for k in self.key if k != self.cursor.name)]
        return column_list(names)

    def select_range(
        self, table: TableName, after: str | None, upper: str | None
    ) -> tuple[sql.Composed, list[str]]:
        """``SELECT <columns> FROM table WHERE <range> ORDER BY cursor, key`` and parameters."""
        where, params = self.where(after, upper)
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {}").format(
            column_list(self.columns), table.ident, where, self.order_by()
        )
        return query, params


def cursor_text(value: object) -> str:
    """A Python cursor bound (int, datetime, date, str) as text the server can cast."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def canonical_cursor(conn: Connection, shape: TableShape, value: object) -> str:
    """The server's canonical spelling of ``value`` as the cursor's type.

    Raises:
        EngineError: ``plan_invalid`` when the value is not of the cursor's type.
    """
    try:
        row = conn.execute(
            sql.SQL("SELECT {}::text").format(shape.value()), (cursor_text(value),)
        ).fetchone()
    except psycopg.DataError as exc:
        raise engine_error(
            "plan_invalid",
            f"{value!r} is not a {shape.cursor.type_sql}: {exc.diag.message_primary}",
        ) from None
    assert row is not None
    return str(row[0])


def _catalog(conn: Connection, table: TableName, code: str) -> TableCatalog:
    try:
        return table_catalog(conn, table)
    except CatalogError as exc:
        raise engine_error(code, exc.message) from None


def check_columns_unchanged(src: Connection, shape: TableShape) -> None:
    """Refuses a batch whose source no longer has the run's copied columns and types.

    Called inside the batch's source transaction after its first read of the table, whose
    lock keeps the columns as they are until the transaction ends.

    Raises:
        EngineError: ``backfill_schema_changed`` listing each column's before and after.
    """
    found = _catalog(src, shape.source, "backfill_schema_changed")
    now = [c for c in found.columns if not c.generated]
    changed = column_differences(shape.columns, now)
    if changed:
        raise engine_error(
            "backfill_schema_changed",
            f"Source {shape.source}: {'; '.join(changed)}. Nothing of this batch was written.",
        )


def resolve_shape(
    src: Connection, tgt: Connection, source: TableName, target: TableName, cursor: str
) -> TableShape:
    """Reads both catalogs and checks that the backfill can run and prove what it copies.

    Raises:
        EngineError: ``plan_invalid`` (no source table, no primary key, an unsupported cursor
            type, no index on the source cursor), ``cursor_not_found`` (no such cursor
            column), ``destination_expansion_incomplete`` (no target table, a missing or
            differently typed column, another primary key, no index on the target cursor).
    """
    found = _catalog(src, source, "plan_invalid")
    require_table(src, "source", source, ["SELECT"])
    columns = [c for c in found.columns if not c.generated]
    by_name = {c.name: c for c in columns}
    if cursor not in by_name:
        raise cursor_not_found(source, cursor, columns)
    cur = by_name[cursor]
    if not is_cursor_type(cur):
        raise engine_error(
            "plan_invalid",
            f"Cursor {cursor!r} is a {cur.type_sql}; supported: integers, numeric, date, "
            "timestamp, timestamptz.",
        )
    key = found.key
    if not key:
        raise engine_error(
            "plan_invalid",
            f"Table {source} has no primary key; rows need one to be matched in the target.",
        )
    if cursor not in found.index_leads:
        raise engine_error(
            "plan_invalid",
            f"No index on {source} starts with {cursor!r}: every batch would scan the table.",
        )
    _check_target(tgt, target, columns, key, cursor)
    versions = keys_for(src, tgt, source, target, columns)
    fmt = copy_format_for(columns, major_versions(src, tgt))
    return TableShape(source, target, tuple(columns), cur, key=key, fmt=fmt, versions=versions)


def _check_target(
    tgt: Connection, target: TableName, columns: Sequence[Column], key: tuple[str, ...], cursor: str
) -> None:
    found = _catalog(tgt, target, "destination_expansion_incomplete")
    require_table(tgt, "target", target, ["SELECT", "INSERT"])
    have = {c.name: c for c in found.columns}
    problems = [
        f"{c.name!r} {c.type_sql}"
        for c in columns
        if c.name not in have
        or normal_type(have[c.name]) != normal_type(c)  # equal however spelled
        or have[c.name].generated
    ]
    if problems:
        raise engine_error(
            "destination_expansion_incomplete",
            f"Target {target} lacks or retypes columns: {', '.join(problems)}.",
        )
    if found.key != key:
        raise engine_error(
            "destination_expansion_incomplete",
            f"Target {target} needs the primary key ({', '.join(key)}).",
        )
    if cursor not in found.index_leads:
        raise engine_error(
            "destination_expansion_incomplete",
            f"No index on target {target} starts with {cursor!r} (needed to count and compare "
            "each batch range).",
        )


def scope_for(
    shape: TableShape,
    source_database: str,
    target_database: str,
    *,
    label: str = "",
    lower: str | None = None,
    upper: str | None = None,
) -> BackfillScope:
    """The run's scope: the tables (with their databases), cursor, key, columns and range."""
    return BackfillScope(
        label=label,
        source=TableRef(
            database=source_database, schema_name=shape.source.schema, name=shape.source.name
        ),
        target=TableRef(
            database=target_database, schema_name=shape.target.schema, name=shape.target.name
        ),
        cursor=shape.cursor.name,
        cursor_type=shape.cursor.type_sql,
        key=shape.key,
        columns=tuple(c.name for c in shape.columns),
        copy_format=shape.fmt,
        lower=lower,
        upper=upper,
    )
