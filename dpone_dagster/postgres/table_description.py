"""What a data catalog shows about a target table: its columns and constraints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import Column, relation_oid, table_columns
from .connection import Connection, ConnectionOptions, connect
from .identifiers import TableName


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


def describe_table(conn: Connection, table: TableName) -> TableDescription:
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
            columns=tuple(str(c) for c in r[1]),
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


@dataclass(frozen=True)
class TableComments:
    """A table's ``COMMENT ON TABLE`` and ``COMMENT ON COLUMN`` texts.

    Attributes:
        table: The table's comment, None without one.
        columns: Each commented column's comment, by column name.
    """

    table: str | None
    columns: dict[str, str]


_COMMENTS = """
SELECT a.attname::text, col_description(a.attrelid, a.attnum)
FROM pg_attribute a
WHERE a.attrelid = %s::bigint::oid AND a.attnum > 0 AND NOT a.attisdropped
  AND col_description(a.attrelid, a.attnum) IS NOT NULL
"""


def table_comments(
    dsn: str, tables: Sequence[TableName], options: ConnectionOptions | None = None
) -> list[TableComments]:
    """The comments of ``tables`` of the source database, over one short session (none for a
    table that is not there).

    Raises:
        SessionError: ``source_unreachable`` / ``source_login_failed``.
    """
    result = []
    with connect(dsn, options, side="source", autocommit=True) as conn:
        for table in tables:
            oid = relation_oid(conn, table)
            if oid is None:
                result.append(TableComments(table=None, columns={}))
                continue
            found = conn.execute("SELECT obj_description(%s::bigint::oid, 'pg_class')", (oid,))
            row = found.fetchone()
            columns = {str(r[0]): str(r[1]) for r in conn.execute(_COMMENTS, (oid,)).fetchall()}
            result.append(TableComments(table=None if row is None else row[0], columns=columns))
    return result
