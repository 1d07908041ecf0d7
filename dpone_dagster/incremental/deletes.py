"""Finding the target rows whose key the source no longer has, and deleting or marking them.

Both sides digest their key sets with the one reconciliation's server-side digest
(:mod:`dpone_dagster.reconcile.digest`: a count and the sum of 64-bit row hashes, here over the
key columns) per range of the key's hash, each server over its own rows, in two levels:

1. 4,096 ranges (the hash's low 12 bits): 4,096 ``(count, sum)`` pairs per side at most;
2. each range that differs is split in 256 (the next 8 bits), for those ranges only;
3. only the sub-ranges that still differ send their keys (a few per difference), and the keys
   the target has and the source lacks are the deleted ones.

So keys cross the wire only for the ranges that differ, and their number is reported. The
source side reads in the caller's snapshot (the run's last batch's); the target side in the
caller's open transaction, after the batch was merged. A key the source has and the target
lacks is a row not yet copied (it is the next run's), never a delete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import psycopg
from psycopg import sql

from dpone_dagster.postgres.catalog import column_list, table_columns
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile.digest import row_hash

from .shape import StreamShape

Conn = psycopg.Connection[tuple[object, ...]]
Key = tuple[str, ...]
_T = TypeVar("_T")

FIRST_BITS = 12
"""The first level splits the key hash space into 2**12 ranges."""
SECOND_BITS = 8
"""A differing first-level range is split into 2**8."""


@dataclass(frozen=True)
class DeleteScan:
    """What the comparison found.

    Attributes:
        deleted: Keys the target holds (live) and the source does not.
        keys_compared: Keys that crossed the wire (both sides).
        ranges_differing: First-level ranges whose digests differed.
    """

    deleted: list[Key]
    keys_compared: int
    ranges_differing: int


def _both(source: Callable[[], _T], target: Callable[[], _T]) -> tuple[_T, _T]:
    """Runs the source side and the target side at once (two sessions, two servers)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        other = pool.submit(source)
        mine = target()
        return other.result(), mine


class _Side:
    """One side's key digests: its table, its live-row filter and the key hash expression."""

    def __init__(self, conn: Conn, table: TableName, live: sql.Composable, h: sql.Composed):
        self.conn, self.table, self.live, self.h = conn, table, live, h

    def _hashed(self, columns: sql.Composable) -> sql.Composed:
        return sql.SQL("(SELECT {} AS h{} FROM {} WHERE {}) AS s").format(
            self.h, columns, self.table.ident, self.live
        )

    def first(self) -> dict[int, tuple[int, str]]:
        """``{range: (count, hash sum)}`` of the first level."""
        query = sql.SQL("SELECT h & {m}, count(*), sum(h)::text FROM {s} GROUP BY 1").format(
            m=sql.Literal((1 << FIRST_BITS) - 1), s=self._hashed(sql.SQL(""))
        )
        return {int(r[0]): (int(r[1]), str(r[2])) for r in self.conn.execute(query)}  # type: ignore[call-overload]

    def _code(self) -> sql.Composed:
        return sql.SQL("((h & {m1}) << {b}) | ((h >> {s1}) & {m2})").format(
            m1=sql.Literal((1 << FIRST_BITS) - 1), b=sql.Literal(SECOND_BITS),
            s1=sql.Literal(FIRST_BITS), m2=sql.Literal((1 << SECOND_BITS) - 1),
        )  # fmt: skip

    def second(self, ranges: Sequence[int]) -> dict[int, tuple[int, str]]:
        """``{sub-range code: (count, hash sum)}`` inside the given first-level ranges."""
        query = sql.SQL(
            "SELECT {code}, count(*), sum(h)::text FROM {s} WHERE h & {m} = ANY(%s) GROUP BY 1"
        ).format(
            code=self._code(), s=self._hashed(sql.SQL("")),
            m=sql.Literal((1 << FIRST_BITS) - 1),
        )  # fmt: skip
        rows = self.conn.execute(query, (list(ranges),))
        return {int(r[0]): (int(r[1]), str(r[2])) for r in rows}  # type: ignore[call-overload]

    def keys(self, key: Sequence[str], codes: Sequence[int]) -> set[Key]:
        """The keys (as text) inside the given sub-ranges."""
        cols = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in key)
        query = sql.SQL("SELECT ARRAY[{k}] FROM {s} WHERE {code} = ANY(%s)").format(
            k=cols, s=self._hashed(sql.SQL(", ") + column_list(list(key))), code=self._code()
        )
        return {tuple(r[0]) for r in self.conn.execute(query, (list(codes),))}  # type: ignore[arg-type]


def _differing(a: dict[int, tuple[int, str]], b: dict[int, tuple[int, str]]) -> list[int]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def find_deleted(src: Conn, tgt: Conn, shape: StreamShape) -> DeleteScan:
    """Compares the key sets of both sides range by range; the keys the source has lost.

    Args:
        src: The source session, inside the snapshot to compare with.
        tgt: The target session, inside the transaction that holds the merged rows.
        shape: The stream (its soft-delete column excludes marked rows on the target side).
    """
    h = row_hash(src, shape.key)
    live: sql.Composable = sql.SQL("true")
    if shape.soft_column is not None:
        live = sql.SQL("{} IS NULL").format(sql.Identifier(shape.soft_column))
    source = _Side(src, shape.source, sql.SQL("true"), h)
    target = _Side(tgt, shape.target, live, h)
    first = _differing(*_both(source.first, target.first))
    if not first:
        return DeleteScan([], 0, 0)
    codes = _differing(*_both(lambda: source.second(first), lambda: target.second(first)))
    names = shape.key_names
    have, held = _both(lambda: source.keys(names, codes), lambda: target.keys(names, codes))
    return DeleteScan(sorted(held - have), len(have) + len(held), len(first))


def _matching(shape: StreamShape, keys: Sequence[Key]) -> tuple[sql.Composed, list[object]]:
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


def apply_deletes(tgt: Conn, shape: StreamShape, keys: Sequence[Key], at: datetime) -> int:
    """Deletes (``soft``: marks with ``at``) the target rows of ``keys``; the rows affected."""
    if not keys:
        return 0
    matching, params = _matching(shape, keys)
    if shape.soft_column is None:
        statement = sql.SQL("DELETE FROM {} AS t USING {}").format(shape.target.ident, matching)
        return tgt.execute(statement, params).rowcount
    soft = sql.Identifier(shape.soft_column)
    statement = sql.SQL("UPDATE {} AS t SET {} = %s FROM {} AND t.{} IS NULL").format(
        shape.target.ident, soft, matching, soft
    )
    return tgt.execute(statement, [at, *params]).rowcount


def ensure_soft_column(tgt: Conn, shape: StreamShape) -> None:
    """Adds the soft-delete column (``timestamptz``, NULL for live rows) to the target if
    missing (the catalog is read first: an ``ALTER`` would lock the target until the commit)."""
    if shape.soft_column is None:
        return
    names = {c.name for c in table_columns(tgt, shape.target)}
    if shape.soft_column not in names:
        tgt.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN {} timestamptz").format(
                shape.target.ident, sql.Identifier(shape.soft_column)
            )
        )


def revive(tgt: Conn, shape: StreamShape, staging: TableName) -> int:
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
