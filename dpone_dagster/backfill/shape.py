"""The shape of a backfill: which columns move, which key identifies a row, how the cursor sorts.

Any legal PostgreSQL identifier works (``"Order Items"`` included), because no name is ever
pasted into SQL text: every name (schema, table, column, the cursor's type) reaches SQL through
:class:`psycopg.sql.Identifier`. Every cursor value is a bind parameter cast from text to the
cursor's own type (``%s::text::"pg_catalog"."int8"``), so values compare by the column's
ordering, never as text. Cursor values are kept as the server's canonical text in a session
pinned to ``TimeZone=UTC`` and ISO dates, so the same value always has the same spelling.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.cursor.backfill_documents import BackfillScope, TableRef
from dpone_dagster.cursor.table_check import FIXED_MARK_CHECK, CursorTables
from dpone_dagster.postgres.catalog import CatalogError, TableCatalog, column_list, table_catalog
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import CopyFormat, copy_format_for, major_versions
from dpone_dagster.postgres.evidence import TableKeys, keys_for
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.privileges import require_table
from dpone_dagster.postgres.schema_change import column_differences
from dpone_dagster.postgres.target_catalog import target_catalog

from .deferred_key import deferred_key


@dataclass(frozen=True)
class TableShape(CursorTables):
    """A backfill's resolved tables (see :class:`~dpone_dagster.cursor.table_check.CursorTables`).

    Attributes:
        fmt: ``binary``, or ``text`` when a user-defined type is copied.
        versions: Both tables' row-version keys, or ``None`` when row versions cannot prove
            their content (:mod:`dpone_dagster.postgres.evidence`).
        keyless: The target's primary key is deferred and this run loads it without one
            (:mod:`.deferred_key`).
    """

    fmt: CopyFormat
    versions: TableKeys | None = None
    keyless: bool = False

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
        names = [self.cursor.name, *(k for k in self.key_names if k != self.cursor.name)]
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


def check_columns_unchanged(src: Connection, shape: TableShape) -> None:
    """Refuses a batch whose source no longer has the run's copied columns and types.

    Called inside the batch's source transaction after its first read of the table, whose
    lock keeps the columns as they are until the transaction ends.

    Raises:
        EngineError: ``backfill_schema_changed`` listing each column's before and after.
    """
    try:
        found = table_catalog(src, shape.source)
    except CatalogError as exc:
        raise engine_error("backfill_schema_changed", exc.message) from None
    now = [c for c in found.columns if not c.generated]
    changed = column_differences(shape.columns, now)
    if changed:
        raise engine_error(
            "backfill_schema_changed",
            f"Source {shape.source}: {'; '.join(changed)}. Nothing of this batch was written.",
        )


def resolve_shape(
    src: Connection,
    tgt: Connection,
    source: TableName,
    target: TableName,
    cursor: str,
    *,
    keyless_load: bool = False,
) -> TableShape:
    """Reads both catalogs and checks that the backfill can run and prove what it copies (the one
    table check with the backfill's codes and an exact target,
    :data:`~dpone_dagster.cursor.table_check.FIXED_MARK_CHECK`).

    A target whose primary key is deferred (:mod:`.deferred_key`) is checked as the table it
    will be once its key is built; with ``keyless_load`` the shape is ``keyless``.

    Raises:
        EngineError: ``plan_invalid`` (no source table, no primary key, an unsupported cursor
            type, no index on the source cursor), ``cursor_not_found`` (no such cursor
            column), ``destination_expansion_incomplete`` (no target table, a missing or
            differently typed column, another primary key, no index on the target cursor).
        DatabaseError: ``source_permission_denied``, ``target_permission_denied`` (no
            ``SELECT`` on the source, no ``SELECT`` or ``INSERT`` on the target).
    """
    found = FIXED_MARK_CHECK.source_catalog(src, source)
    have = _target(tgt, target)
    deferred = deferred_key(tgt, target) if have is not None else None
    if have is not None and deferred is not None:  # checked as it will be once keyed
        have = replace(have, key=deferred, index_leads=have.index_leads | {deferred[0]})
    tables = FIXED_MARK_CHECK.tables(found, have, source, target, cursor)
    versions = keys_for(src, tgt, source, target, tables.columns)
    fmt = copy_format_for(tables.columns, major_versions(src, tgt))
    return TableShape(
        tables.source, tables.target, tables.columns, tables.cursor, tables.key, fmt=fmt,
        versions=versions, keyless=keyless_load and deferred is not None,
    )  # fmt: skip


def _target(tgt: Connection, target: TableName) -> TableCatalog | None:
    """The target's catalog (``None``: no such table), once its privileges are checked."""
    found = target_catalog(tgt, target, swap=False)
    if found is None:
        return None
    require_table(tgt, "target", target, ["SELECT", "INSERT"])
    return found.table


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
        key=shape.key_names,
        columns=tuple(c.name for c in shape.columns),
        copy_format=shape.fmt,
        lower=lower,
        upper=upper,
    )
