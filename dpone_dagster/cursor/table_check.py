"""The cursor engine's one table check: what both policies refuse in a job's tables, in one
order, with one refusal vocabulary (:class:`~dpone_dagster.core.errors.TableRefusal`).

Before anything is written the check refuses, in this order: a source table that does not
exist, a cursor that is not one of its copied columns, a cursor whose type cannot order a copy
(:data:`CURSOR_TYPES`), a source without a primary key, a cursor that no index of the source
starts with; then the target, by its rule (:class:`TargetRule`); and last, with an index probe
of the source, NULL cursor values (:func:`refuse_null_cursor`). Each refusal's code is the
policy's own (:data:`~dpone_dagster.core.errors.TABLE_REFUSALS`): the backfill's and the
stream's codes stay what they were.

Cursor values are kept as the server's canonical text, in a session pinned to ``TimeZone=UTC``
and ISO dates (:func:`dpone_dagster.core.sessions.prepared_session`), and reach SQL as bind
parameters cast back to the cursor's own type, so they always compare by the column's ordering.
The engines also compare them without a server (the backfill's pure rules): numbers as numbers,
dates and timestamps as instants, which is PostgreSQL's order for exactly these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from psycopg import sql

from dpone_dagster.core.errors import RefusalColumn, TableRefusal, refusal_error
from dpone_dagster.postgres.catalog import (
    CatalogError,
    Column,
    TableCatalog,
    normal_type,
    table_catalog,
)
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.privileges import require_table

CURSOR_TYPES: Final = frozenset(
    {"int2", "int4", "int8", "numeric", "date", "timestamp", "timestamptz"}
)
"""The built-in types a cursor may have."""


def is_cursor_type(column: Column) -> bool:
    """True when ``column``'s type is a built-in type of :data:`CURSOR_TYPES`."""
    return column.type_schema == "pg_catalog" and column.type_name in CURSOR_TYPES


class TargetRule(Enum):
    """What the check asks of the target table."""

    EXACT = "exact"
    """It exists with the source's columns and types, its primary key and an index that starts
    with the cursor (the fixed mark's target, made by ``prepare_target``)."""
    KEY_ONLY = "key_only"
    """If it exists, its primary key is the source's (the moving mark creates or evolves it)."""


@dataclass(frozen=True)
class CursorTables:
    """A job's checked tables (each engine's shape adds its own facts).

    Attributes:
        source: The source table.
        target: The target table.
        columns: The copied columns (the source's, generated ones left out).
        cursor: The cursor column (one of the copied columns).
        key: The primary key's columns, in key order (equal on both sides).
    """

    source: TableName
    target: TableName
    columns: tuple[Column, ...]
    cursor: Column
    key: tuple[Column, ...]

    @property
    def key_names(self) -> tuple[str, ...]:
        """The key's column names."""
        return tuple(k.name for k in self.key)


@dataclass(frozen=True)
class SideCatalogs:
    """What both catalogs say of a job's tables.

    Attributes:
        source: The source table's columns, key and index-leading columns.
        target: The target table's (``None``: it does not exist).
    """

    source: TableCatalog
    target: TableCatalog | None


def source_catalog(conn: Connection, table: TableName, column: RefusalColumn) -> TableCatalog:
    """The source table's catalog, once its ``SELECT`` privilege is checked.

    Raises:
        EngineError: :attr:`~TableRefusal.SOURCE_MISSING`'s code for a table that does not
            exist.
        DatabaseError: ``source_permission_denied`` without ``SELECT`` on the table.
    """
    try:
        found = table_catalog(conn, table)
    except CatalogError as exc:  # the only one it raises: no such table
        raise refusal_error(
            TableRefusal.SOURCE_MISSING, column, exc.message, exc.next_actions
        ) from None
    require_table(conn, "source", table, ["SELECT"])
    return found


def check_source(
    found: TableCatalog, source: TableName, target: TableName, cursor: str, column: RefusalColumn
) -> CursorTables:
    """The source's checks: its cursor is a column of a cursor type that an index starts
    with, and it has a primary key.

    Raises:
        EngineError: the code of :attr:`~TableRefusal.CURSOR_MISSING`,
            :attr:`~TableRefusal.CURSOR_TYPE`, :attr:`~TableRefusal.PRIMARY_KEY` or
            :attr:`~TableRefusal.CURSOR_INDEX` under ``column``, the first that applies.
    """
    columns = tuple(c for c in found.columns if not c.generated)
    by_name = {c.name: c for c in columns}
    cur = by_name.get(cursor)
    if cur is None:
        names = ", ".join(repr(c.name) for c in columns)
        detail = f"Table {source} has no column {cursor!r}: {names}."
        raise refusal_error(TableRefusal.CURSOR_MISSING, column, detail)
    if not is_cursor_type(cur):
        detail = (
            f"Cursor {cursor!r} of {source} is a {cur.type_sql}; supported: integers, numeric, "
            "date, timestamp, timestamptz."
        )
        raise refusal_error(TableRefusal.CURSOR_TYPE, column, detail)
    if not found.key:
        detail = f"Table {source} has no primary key; rows need one to be matched in the target."
        raise refusal_error(TableRefusal.PRIMARY_KEY, column, detail)
    if cursor not in found.index_leads:
        detail = f"No index on {source} starts with {cursor!r}: every batch would scan the table."
        raise refusal_error(TableRefusal.CURSOR_INDEX, column, detail)
    every = {c.name: c for c in found.columns}
    return CursorTables(source, target, columns, cur, tuple(every[k] for k in found.key))


def check_tables(
    found: SideCatalogs,
    source: TableName,
    target: TableName,
    cursor: str,
    rule: TargetRule,
    column: RefusalColumn,
) -> CursorTables:
    """Checks a job's tables from both catalogs: the source (:func:`check_source`), then the
    target by ``rule``.

    Raises:
        EngineError: the first refusal that applies, with its code under ``column``:
            :func:`check_source`'s, then :attr:`~TableRefusal.TARGET_NOT_READY` (``EXACT``: no
            target, a column it lacks or types otherwise, no index starting with the cursor)
            or :attr:`~TableRefusal.TARGET_KEY` (another primary key).
    """
    tables = check_source(found.source, source, target, cursor, column)
    if rule is TargetRule.EXACT:
        _check_exact_target(found.target, tables, column)
    elif found.target is not None:
        _check_target_key(found.target, tables, column)
    return tables


def _check_exact_target(
    have: TableCatalog | None, tables: CursorTables, column: RefusalColumn
) -> None:
    """Refuses a missing target, one that lacks, retypes or generates a copied column, one with
    another primary key, and one without an index that starts with the cursor."""
    if have is None:
        detail = f"Target table {tables.target} does not exist."
        raise refusal_error(TableRefusal.TARGET_NOT_READY, column, detail)
    by_name = {c.name: c for c in have.columns}
    problems = [
        f"{c.name!r} {c.type_sql}"
        for c in tables.columns
        if c.name not in by_name
        or normal_type(by_name[c.name]) != normal_type(c)  # equal however spelled
        or by_name[c.name].generated
    ]
    if problems:
        detail = f"Target {tables.target} lacks or retypes columns: {', '.join(problems)}."
        raise refusal_error(TableRefusal.TARGET_NOT_READY, column, detail)
    _check_target_key(have, tables, column)
    if tables.cursor.name not in have.index_leads:
        detail = (
            f"No index on target {tables.target} starts with {tables.cursor.name!r} (needed to "
            "count and compare each batch range)."
        )
        raise refusal_error(TableRefusal.TARGET_NOT_READY, column, detail)


def _check_target_key(have: TableCatalog, tables: CursorTables, column: RefusalColumn) -> None:
    """Refuses a target whose primary key is not the source's."""
    if have.key != tables.key_names:
        detail = (
            f"Target {tables.target} has primary key ({', '.join(have.key) or 'none'}); the "
            f"source's is ({', '.join(tables.key_names)})."
        )
        raise refusal_error(TableRefusal.TARGET_KEY, column, detail)


@dataclass(frozen=True)
class TableCheck:
    """The one table check bound to a policy: what it asks of the target and whose codes its
    refusals carry (:data:`FIXED_MARK_CHECK`, :data:`MOVING_MARK_CHECK`).

    Attributes:
        rule: What the target must be.
        column: The policy's column of :data:`~dpone_dagster.core.errors.TABLE_REFUSALS`.
    """

    rule: TargetRule
    column: RefusalColumn

    def source_catalog(self, conn: Connection, table: TableName) -> TableCatalog:
        """The source's catalog, its privilege checked (:func:`source_catalog`)."""
        return source_catalog(conn, table, self.column)

    def source(
        self, found: TableCatalog, source: TableName, target: TableName, cursor: str
    ) -> CursorTables:
        """The source's checks alone (:func:`check_source`)."""
        return check_source(found, source, target, cursor, self.column)

    def tables(
        self,
        source_found: TableCatalog,
        target_found: TableCatalog | None,
        source: TableName,
        target: TableName,
        cursor: str,
    ) -> CursorTables:
        """The source's checks, then the target's by :attr:`rule` (:func:`check_tables`)."""
        found = SideCatalogs(source_found, target_found)
        return check_tables(found, source, target, cursor, self.rule, self.column)

    def refuse_null(self, conn: Connection, tables: CursorTables) -> None:
        """The last step, an index probe for NULL cursor values (:func:`refuse_null_cursor`)."""
        refuse_null_cursor(conn, tables, self.column)


FIXED_MARK_CHECK: Final = TableCheck(TargetRule.EXACT, RefusalColumn.FIXED_MARK)
"""The fixed mark's check: an exact target (made by ``prepare_target``), the backfill's codes."""
MOVING_MARK_CHECK: Final = TableCheck(TargetRule.KEY_ONLY, RefusalColumn.MOVING_MARK)
"""The moving mark's check: a target with the source's key if it exists, the stream's codes."""


def refuse_null_cursor(conn: Connection, tables: CursorTables, column: RefusalColumn) -> None:
    """Refuses a source with a NULL cursor value (an index probe), the check's last step: no
    range holds such a row, so no batch would ever copy it.

    Raises:
        EngineError: :attr:`~TableRefusal.CURSOR_NULL`'s code under ``column``.
    """
    found = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} IS NULL)").format(
            tables.source.ident, tables.cursor.ident
        )
    ).fetchone()
    if found is not None and found[0]:
        detail = (
            f"Rows of {tables.source} have a NULL cursor {tables.cursor.name!r}: no range holds "
            "them, so they would never be copied. Fill them, or choose a NOT NULL cursor."
        )
        raise refusal_error(TableRefusal.CURSOR_NULL, column, detail)
