"""What the PostgreSQL catalog says about a table: its columns, types and primary key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import DponeError

from .connection import ConnectionOptions, connect
from .identifiers import TableName


class CatalogError(DponeError):
    """A table or column the catalog does not know."""


@dataclass(frozen=True)
class Column:
    """One column of a table, as the catalog describes it.

    Attributes:
        name: The exact column name.
        type_sql: The type as ``format_type`` prints it (``numeric(14,2)``, ``"My Enum"[]``).
        type_oid: The type's OID on this server.
        not_null: The column has a NOT NULL constraint.
        default_sql: The default expression when it is a constant, else None.
        generated: A generated (computed) column: never written.
        user_type: The type (or its array element) is user-defined (enum, domain, composite):
            its OID differs between databases, so binary COPY cannot carry it across.
        type_schema: Schema of a user-defined type, for messages.
        type_name: Name of a user-defined type (the element type for arrays).
        generation_sql: The expression of a generated column, else None.
    """

    name: str
    type_sql: str
    type_oid: int
    not_null: bool
    default_sql: str | None
    generated: bool
    user_type: bool
    type_schema: str
    type_name: str
    generation_sql: str | None = None

    @property
    def ident(self) -> sql.Identifier:
        """The column's name composed for SQL."""
        return sql.Identifier(self.name)


_COLUMNS = """
SELECT a.attname,
       format_type(a.atttypid, a.atttypmod),
       a.atttypid::bigint,
       a.attnotnull,
       CASE WHEN d.adbin IS NOT NULL AND a.attgenerated = ''
                 AND pg_get_expr(d.adbin, d.adrelid) !~* '(nextval|\\()'
            THEN pg_get_expr(d.adbin, d.adrelid) END,
       a.attgenerated <> '',
       base.oid >= 16384,
       bn.nspname,
       base.typname,
       CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type base ON base.oid = CASE WHEN t.typelem <> 0 AND t.typcategory = 'A'
                                     THEN t.typelem ELSE t.oid END
JOIN pg_namespace bn ON bn.oid = base.typnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s::bigint::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_RELATION = """
SELECT c.oid::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
"""

_PRIMARY_KEY = """
SELECT a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s::bigint::oid AND i.indisprimary
ORDER BY k.ord
"""


def relation_oid(conn: psycopg.Connection[tuple[object, ...]], table: TableName) -> int | None:
    """The table's OID, or None when it does not exist (exact names, no search_path)."""
    row = conn.execute(_RELATION, (table.schema, table.name)).fetchone()
    return int(row[0]) if row else None  # type: ignore[call-overload]


def table_columns(conn: psycopg.Connection[tuple[object, ...]], table: TableName) -> list[Column]:
    """Returns the table's columns in order.

    Raises:
        CatalogError: ``table_not_found`` when the table does not exist.
    """
    oid = relation_oid(conn, table)
    if oid is None:
        raise CatalogError(
            "table_not_found",
            f"Table {table} does not exist in database {conn.info.dbname!r}.",
            [
                "Check the schema and table name (quoted names keep their case).",
                "Check that the DSN points at the right database.",
            ],
        )
    rows = conn.execute(_COLUMNS, (oid,)).fetchall()
    return [
        Column(
            name=str(r[0]),
            type_sql=str(r[1]),
            type_oid=int(r[2]),  # type: ignore[call-overload]
            not_null=bool(r[3]),
            default_sql=None if r[4] is None else str(r[4]),
            generated=bool(r[5]),
            user_type=bool(r[6]),
            type_schema=str(r[7]),
            type_name=str(r[8]),
            generation_sql=None if r[9] is None else str(r[9]),
        )
        for r in rows
    ]


def primary_key(conn: psycopg.Connection[tuple[object, ...]], table: TableName) -> list[str]:
    """The table's primary-key columns in key order (empty when it has none)."""
    oid = relation_oid(conn, table)
    if oid is None:
        return []
    return [str(r[0]) for r in conn.execute(_PRIMARY_KEY, (oid,)).fetchall()]


def column_list(columns: Sequence[Column] | Sequence[str]) -> sql.Composed:
    """``"a", "b", "c"`` for SQL text."""
    names = [c.name if isinstance(c, Column) else c for c in columns]
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


@dataclass(frozen=True)
class Constraint:
    """One constraint of a table, as the catalog describes it.

    Attributes:
        kind: ``primary_key``, ``unique``, ``foreign_key``, ``check`` or ``exclusion``.
        columns: The constrained columns, in the constraint's order (empty for a check on an
            expression the catalog does not tie to columns).
        definition: The constraint as ``pg_get_constraintdef`` prints it (``PRIMARY KEY (id)``).
    """

    kind: str
    columns: tuple[str, ...]
    definition: str


@dataclass(frozen=True)
class TableDescription:
    """A table's columns and constraints: what a data catalog shows a user about it.

    Attributes:
        database: The database the table is in.
        table: The table.
        columns: Its columns, in order.
        constraints: Its constraints, the primary key first.
    """

    database: str
    table: TableName
    columns: tuple[Column, ...]
    constraints: tuple[Constraint, ...]

    @property
    def qualified_name(self) -> str:
        """``database.schema.table``, as a data catalog names a table."""
        return f"{self.database}.{self.table.qualified}"


_CONSTRAINT_KINDS = {
    "p": "primary_key",
    "u": "unique",
    "f": "foreign_key",
    "c": "check",
    "x": "exclusion",
}

_CONSTRAINTS = """
SELECT c.contype::text,
       coalesce(array(SELECT a.attname::text
                      FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
                      JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
                      ORDER BY k.ord), '{}'),
       pg_get_constraintdef(c.oid)
FROM pg_constraint c
WHERE c.conrelid = %s::bigint::oid AND c.contype IN ('p', 'u', 'f', 'c', 'x')
ORDER BY c.contype = 'p' DESC, c.conname
"""


def describe_table(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName
) -> TableDescription:
    """The table's columns (in order) and its constraints (the primary key first).

    Raises:
        CatalogError: ``table_not_found`` when the table does not exist.
    """
    columns = table_columns(conn, table)
    oid = relation_oid(conn, table)
    rows = conn.execute(_CONSTRAINTS, (oid,)).fetchall()
    constraints = tuple(
        Constraint(
            kind=_CONSTRAINT_KINDS[str(r[0])],
            columns=tuple(str(c) for c in r[1]),  # type: ignore[attr-defined]
            definition=str(r[2]),
        )
        for r in rows
    )
    return TableDescription(
        database=conn.info.dbname,
        table=table,
        columns=tuple(columns),
        constraints=constraints,
    )


def describe_tables(
    dsn: str, tables: Sequence[TableName], options: ConnectionOptions | None = None
) -> list[TableDescription]:
    """Describes ``tables`` of the target database over one short read-only session.

    Raises:
        SessionError: ``target_unreachable`` / ``target_login_failed``.
        CatalogError: ``table_not_found`` for a table that does not exist.
    """
    with connect(dsn, options, side="target", autocommit=True) as conn:
        return [describe_table(conn, table) for table in tables]
