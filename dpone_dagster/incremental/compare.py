"""Comparing the two sides of a stream range by range, with the one reconciliation's digest.

Each side digests its rows with the one reconciliation's server-side digest
(:mod:`dpone_dagster.reconcile.digest`: a count and the sum of 64-bit row hashes) per range of
the KEY's hash, each server over its own rows, in two levels:

1. 4,096 ranges (the key hash's low 12 bits): at most 4,096 ``(count, sum)`` pairs per side;
2. each range that differs is split in 256 (the next 8 bits), for those ranges only;
3. only the sub-ranges that still differ send their keys (with each row's hash and, from the
   source, its cursor), a few per difference.

The summed hash is the key's own (the key sets are compared: the delete detection) or the whole
row's (every copied column: the run's verification). Keys cross the wire only for the ranges
that differ, and their number is reported. The two sides run at once, in two sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from psycopg import sql

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile.digest import row_hash

from .shape import StreamShape

Key = tuple[str, ...]
_T = TypeVar("_T")

FIRST_BITS = 12
"""The first level splits the key hash space into 2**12 ranges."""
SECOND_BITS = 8
"""A differing first-level range is split into 2**8."""


@dataclass(frozen=True)
class Comparison:
    """What differs between the two sides.

    Attributes:
        source_only: Keys only the source holds, with their cursor (text).
        target_only: Keys only the target holds (live rows).
        differing: Keys both hold with different rows, with the source's cursor.
        keys_compared: Keys that crossed the wire (both sides).
        ranges_differing: First-level ranges whose digests differed.
    """

    source_only: dict[Key, str] = field(default_factory=dict)
    target_only: set[Key] = field(default_factory=set)
    differing: dict[Key, str] = field(default_factory=dict)
    keys_compared: int = 0
    ranges_differing: int = 0


def both(source: Callable[[], _T], target: Callable[[], _T]) -> tuple[_T, _T]:
    """Runs the source side and the target side at once (two sessions, two servers)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        other = pool.submit(source)
        mine = target()
        return other.result(), mine


_MASK1 = sql.Literal((1 << FIRST_BITS) - 1)
_CODE = sql.SQL("((b & {m1}) << {bits}) | ((b >> {shift}) & {m2})").format(
    m1=_MASK1, bits=sql.Literal(SECOND_BITS), shift=sql.Literal(FIRST_BITS),
    m2=sql.Literal((1 << SECOND_BITS) - 1),
)  # fmt: skip


@dataclass(frozen=True)
class _Side:
    """One side: its table, its live-row filter, and the bucket (key) and content hashes."""

    conn: Connection
    table: TableName
    live: sql.Composable
    bucket: sql.Composable
    content: sql.Composable
    key_text: sql.Composable
    cursor: sql.Composable

    def _rows(self) -> sql.Composed:
        return sql.SQL(
            "(SELECT {b} AS b, {h} AS h, ARRAY[{k}] AS k, {c}::text AS c FROM {t} WHERE {w}) AS s"
        ).format(
            b=self.bucket, h=self.content, k=self.key_text, c=self.cursor, t=self.table.ident,
            w=self.live,
        )  # fmt: skip

    def first(self) -> dict[int, tuple[int, str]]:
        """``{range: (count, hash sum)}`` of the first level."""
        query = sql.SQL("SELECT b & {m}, count(*), sum(h)::text FROM {s} GROUP BY 1").format(
            m=_MASK1, s=self._rows()
        )
        return {int(r[0]): (int(r[1]), str(r[2])) for r in self.conn.execute(query)}

    def second(self, ranges: Sequence[int]) -> dict[int, tuple[int, str]]:
        """``{sub-range code: (count, hash sum)}`` inside the given first-level ranges."""
        query = sql.SQL(
            "SELECT {code}, count(*), sum(h)::text FROM {s} WHERE b & {m} = ANY(%s) GROUP BY 1"
        ).format(code=_CODE, s=self._rows(), m=_MASK1)
        rows = self.conn.execute(query, (list(ranges),))
        return {int(r[0]): (int(r[1]), str(r[2])) for r in rows}

    def keys(self, codes: Sequence[int]) -> dict[Key, tuple[str, str]]:
        """``{key: (row hash, cursor)}`` of the rows inside the given sub-ranges."""
        query = sql.SQL("SELECT k, h::text, c FROM {s} WHERE {code} = ANY(%s)").format(
            s=self._rows(), code=_CODE
        )
        rows = self.conn.execute(query, (list(codes),))
        return {tuple(r[0]): (str(r[1]), str(r[2])) for r in rows}


def _differing(a: dict[int, tuple[int, str]], b: dict[int, tuple[int, str]]) -> list[int]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _sides(src: Connection, tgt: Connection, shape: StreamShape, rows: bool) -> tuple[_Side, _Side]:
    bucket = row_hash(src, shape.key)
    content = row_hash(src, shape.columns) if rows else bucket
    key_text = sql.SQL(", ").join(sql.SQL("{}::text").format(k.ident) for k in shape.key)
    live: sql.Composable = sql.SQL("true")
    if shape.soft_column is not None:
        live = sql.SQL("{} IS NULL").format(sql.Identifier(shape.soft_column))
    cursor = shape.cursor.ident
    return (
        _Side(src, shape.source, sql.SQL("true"), bucket, content, key_text, cursor),
        _Side(tgt, shape.target, live, bucket, content, key_text, cursor),
    )


def compare(src: Connection, tgt: Connection, shape: StreamShape, *, rows: bool) -> Comparison:
    """Compares both sides range by range; the keys that differ.

    Args:
        src: The source session, inside the snapshot to compare with.
        tgt: The target session (rows marked by a ``soft`` delete are left out).
        shape: The stream.
        rows: Compare whole rows (every copied column); else the key sets only.
    """
    source, target = _sides(src, tgt, shape, rows)
    first = _differing(*both(source.first, target.first))
    if not first:
        return Comparison()
    codes = _differing(*both(lambda: source.second(first), lambda: target.second(first)))
    have, held = both(lambda: source.keys(codes), lambda: target.keys(codes))
    return Comparison(
        source_only={k: v[1] for k, v in have.items() if k not in held},
        target_only={k for k in held if k not in have},
        differing={k: v[1] for k, v in have.items() if k in held and held[k][0] != v[0]},
        keys_compared=len(have) + len(held),
        ranges_differing=len(first),
    )
