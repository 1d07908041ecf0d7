"""The soft-delete column of a target: a ``timestamptz`` set when the row's key left the
source, NULL for a live row; shared by every engine that marks deletes instead of applying
them (the incremental stream, the replication)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from .catalog import columns_equal, table_columns
from .connection import Connection
from .identifiers import TableName
from .lock_wait import under_lock_wait


def ensure_soft_column(conn: Connection, target: TableName, column: str) -> None:
    """Adds the soft-delete column (``timestamptz``) to ``target`` if missing (the catalog is
    read first: an ``ALTER`` would lock the target until the commit; it takes its lock in short
    attempts, :mod:`.lock_wait`)."""
    if column in {c.name for c in table_columns(conn, target)}:
        return
    statement = sql.SQL("ALTER TABLE {} ADD COLUMN {} timestamptz").format(
        target.ident, sql.Identifier(column)
    )
    under_lock_wait(
        conn, [target], lambda: conn.execute(statement), doing="add its soft-delete column"
    )


def revive(
    conn: Connection, target: TableName, column: str, key: Sequence[str], staged: TableName
) -> int:
    """Clears the soft-delete mark of ``target`` rows whose ``key`` arrives again in
    ``staged`` (adding the column first when missing); the rows revived."""
    ensure_soft_column(conn, target, column)
    soft = sql.Identifier(column)
    equal = columns_equal("t", "s", key)
    statement = sql.SQL("UPDATE {} AS t SET {} = NULL FROM {} AS s WHERE {} AND t.{} IS NOT NULL")
    return conn.execute(statement.format(target.ident, soft, staged.ident, equal, soft)).rowcount
