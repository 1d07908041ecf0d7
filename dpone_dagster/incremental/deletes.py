"""Deleting (``hard``) or marking (``soft``) the target rows whose key the source has lost.

The keys come from the one drill-down compare (:func:`dpone_dagster.reconcile.compare.compare`:
key digests per range, drilled into differing ranges only). A ``soft`` mark is a
``timestamptz`` column of the target (created if missing):
NULL for a live row, the source snapshot's time once its key is gone; a key that arrives again
clears it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg import sql

from dpone_dagster.postgres.catalog import table_columns
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.lock_wait import under_lock_wait
from dpone_dagster.reconcile.compare import Key

from .shape import StreamShape


def matching(shape: StreamShape, keys: Sequence[Key]) -> tuple[sql.Composed, list[object]]:
    """``FROM unnest(...) AS d(k0, ...) WHERE t.key = d.k...`` for ``keys`` (text arrays)."""
    aliases = [sql.Identifier(f"k{i}") for i in range(len(shape.key))]
    unnest = sql.SQL("unnest({}) AS d({})").format(
        sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in shape.key), sql.SQL(", ").join(aliases)
    )
    equal = sql.SQL(" AND ").join(
        sql.SQL("t.{} = CAST(d.{} AS {})").format(k.ident, a, sql.SQL(k.type_sql))
        for k, a in zip(shape.key, aliases, strict=True)
    )
    columns = [[key[i] for key in keys] for i in range(len(shape.key))]
    return sql.SQL("{} WHERE {}").format(unnest, equal), list(columns)


def apply_deletes(tgt: Connection, shape: StreamShape, keys: Sequence[Key], at: datetime) -> int:
    """Deletes (``soft``: marks with ``at``) the target rows of ``keys``; the rows affected."""
    if not keys:
        return 0
    among, params = matching(shape, keys)
    if shape.soft_column is None:
        statement = sql.SQL("DELETE FROM {} AS t USING {}").format(shape.target.ident, among)
        return tgt.execute(statement, params).rowcount
    soft = sql.Identifier(shape.soft_column)
    statement = sql.SQL("UPDATE {} AS t SET {} = %s FROM {} AND t.{} IS NULL").format(
        shape.target.ident, soft, among, soft
    )
    return tgt.execute(statement, [at, *params]).rowcount


def ensure_soft_column(tgt: Connection, shape: StreamShape) -> None:
    """Adds the soft-delete column (``timestamptz``, NULL for live rows) to the target if
    missing (the catalog is read first: an ``ALTER`` would lock the target until the commit; it
    takes its lock in short attempts, :mod:`dpone_dagster.postgres.lock_wait`)."""
    if shape.soft_column is None:
        return
    names = {c.name for c in table_columns(tgt, shape.target)}
    if shape.soft_column not in names:
        statement = sql.SQL("ALTER TABLE {} ADD COLUMN {} timestamptz").format(
            shape.target.ident, sql.Identifier(shape.soft_column)
        )
        under_lock_wait(
            tgt, [shape.target], lambda: tgt.execute(statement), doing="add its soft-delete column"
        )


def revive(tgt: Connection, shape: StreamShape, staging: TableName) -> int:
    """Clears the soft-delete mark of target rows whose key arrives again in ``staging``."""
    if shape.soft_column is None:
        return 0
    ensure_soft_column(tgt, shape)
    soft = sql.Identifier(shape.soft_column)
    equal = sql.SQL(" AND ").join(
        sql.SQL("t.{} = s.{}").format(k.ident, k.ident) for k in shape.key
    )
    statement = sql.SQL("UPDATE {} AS t SET {} = NULL FROM {} AS s WHERE {} AND t.{} IS NOT NULL")
    return tgt.execute(
        statement.format(shape.target.ident, soft, staging.ident, equal, soft)
    ).rowcount
