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
