"""The one drill-down compare: which keys differ between two sides, digesting ranges of the key's
hash and drilling into the differing ones only.

Each side digests its rows with the one reconciliation digest (:mod:`.digest`: a count and the
sum of 64-bit row hashes) per range of the KEY's hash, each server over its own rows (a
:class:`Side` may be restricted to a range of rows, such as a backfill's batch range or a
stream's sweep slice), in levels (:func:`drill`):

1. 4,096 ranges (the key hash's low 12 bits): at most 4,096 ``(count, sum)`` pairs per side;
2. each range that differs is split in 256 (the next 8 bits), for those ranges only;
3. only the sub-ranges that still differ send their keys (with each row's hash and, from the
   source, its cursor), a few per difference.

A small range (``direct=True``: a caller that knows it holds few rows) skips the levels and sends
its keys at once. The summed hash is the key's own (the key sets are compared: a stream's delete
detection) or the whole row's (every copied column: a verification, a repair). Keys cross the wire
only for the ranges that differ, and their number is reported. The two sides run at once, in two
sessions.

Callers: the stream's deletes and checks (:mod:`dpone_dagster.incremental.verify`,
:mod:`dpone_dagster.incremental.sweep`) and the backfill's ``on_changed="repair"``
(:mod:`dpone_dagster.backfill.reconcile`, which then rewrites only the keys found). The stream's
count-based delete scan (:mod:`dpone_dagster.incremental.ranges`) drills with the same skeleton
(:func:`drill`) over ranges of key values instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from psycopg import sql

from dpone_dagster.postgres import Column, TableName
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.threads import at_once

from .digest import row_hash

Key = tuple[str, ...]
"""A key as the text of each of its columns (``column::text``), in key order."""

_T = TypeVar("_T")
_R = TypeVar("_R")

FIRST_BITS = 12
"""The first level splits the key hash space into 2**12 ranges."""
SECOND_BITS = 8
"""A differing first-level range is split into 2**8."""
DIRECT_ROWS = 4096
"""A range holding at most this many rows on either side is compared key by key at once (its
keys cost less to send than the levels cost to digest)."""


def both(source: Callable[[], _T], target: Callable[[], _T]) -> tuple[_T, _T]:
    """Runs the source side and the target side at once (two sessions, two servers)."""
    mine, other = at_once(target, source)
    return other, mine


def drill(
    ranges: list[_R],
    differing: Callable[[list[_R]], list[_R]],
    split: Callable[[_R], list[_R]],
    leaf: Callable[[_R], bool],
) -> list[_R]:
    """The drill-down skeleton: the ranges that differ, down to leaves.

    Each level measures its ranges on both sides (``differing`` returns those whose measures
    differ); a differing range that is a ``leaf`` is kept, any other is ``split`` and its parts
    are measured at the next level.

    Args:
        ranges: The first level.
        differing: Of a level's ranges, those whose two sides differ (one query per side).
        split: The parts of a differing range, for the next level.
        leaf: A range small enough to compare key by key.

    Returns:
        The differing leaves, in the order found.
    """
    leaves: list[_R] = []
    while ranges:
        deeper: list[_R] = []
        for found in differing(ranges):
            if leaf(found):
                leaves.append(found)
            else:
                deeper += split(found)
        ranges = deeper
    return leaves


@dataclass(frozen=True)
class Comparison:
    """What differs between the two sides.

    Attributes:
        source_only: Keys only the source holds, with their cursor (text; empty without one).
        target_only: Keys only the target holds.
        differing: Keys both hold with different rows, with the source's cursor.
        keys_compared: Keys that crossed the wire (both sides).
        ranges_differing: First-level ranges whose digests differed.
        target_rows: The rows of the target side, as its first level counted them (or its
            keys sent at once); ``None`` when not counted.
    """

    source_only: dict[Key, str] = field(default_factory=dict)
    target_only: set[Key] = field(default_factory=set)
    differing: dict[Key, str] = field(default_factory=dict)
    keys_compared: int = 0
    ranges_differing: int = 0
    target_rows: int | None = None

    @property
    def to_copy(self) -> list[Key]:
        """The keys whose source row the target lacks or holds otherwise, sorted."""
        return sorted({*self.source_only, *self.differing})

    @property
    def empty(self) -> bool:
        """Nothing differs."""
        return not (self.source_only or self.target_only or self.differing)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its session, table and the rows compared.

    Attributes:
        conn: The session, inside the snapshot or transaction to compare in.
        table: The table.
        where: The rows compared (a range, the live rows), without a ``WHERE`` (``None``:
            every row).
        params: The parameters of ``where``.
    """

    conn: Connection
    table: TableName
    where: sql.Composable | None = None
    params: tuple[object, ...] = ()


@dataclass(frozen=True)
class Rows:
    """What is compared of each row.

    Attributes:
        key: The key's columns, in key order (the source's catalog).
        columns: The columns whose hash is compared (the whole row); ``()``: the key only.
        cursor: Sent back with the source's differing keys (text), if given.
    """

    key: tuple[Column, ...]
    columns: tuple[Column, ...] = ()
    cursor: Column | None = None


_MASK1 = sql.Literal((1 << FIRST_BITS) - 1)
_CODE = sql.SQL("((b & {m1}) << {bits}) | ((b >> {shift}) & {m2})").format(
    m1=_MASK1, bits=sql.Literal(SECOND_BITS), shift=sql.Literal(FIRST_BITS),
    m2=sql.Literal((1 << SECOND_BITS) - 1),
)  # fmt: skip

Level = tuple[int, int]
"""A range of the key's hash: ``(1, low 12 bits)`` or ``(2, code of 20 bits)``."""


@dataclass(frozen=True)
class _Reader:
    """One side's queries: the bucket (key) and content hashes of its rows."""

    side: Side
    bucket: sql.Composable
    content: sql.Composable
    key_text: sql.Composable
    cursor: sql.Composable

    def _rows(self) -> sql.Composed:
        return sql.SQL(
            "(SELECT {b} AS b, {h} AS h, ARRAY[{k}] AS k, {c}::text AS c FROM {t} WHERE {w}) AS s"
        ).format(
            b=self.bucket, h=self.content, k=self.key_text, c=self.cursor,
            t=self.side.table.ident, w=self.side.where or sql.SQL("true"),
        )  # fmt: skip

    def _run(self, query: sql.Composed, *params: object) -> list[tuple[object, ...]]:
        return self.side.conn.execute(query, [*self.side.params, *params]).fetchall()

    def first(self) -> dict[int, tuple[int, str]]:
        """``{range: (count, hash sum)}`` of the first level."""
        query = sql.SQL("SELECT b & {m}, count(*), sum(h)::text FROM {s} GROUP BY 1").format(
            m=_MASK1, s=self._rows()
        )
        return {int(str(r[0])): (int(str(r[1])), str(r[2])) for r in self._run(query)}

    def second(self, ranges: Sequence[int]) -> dict[int, tuple[int, str]]:
        """``{sub-range code: (count, hash sum)}`` inside the given first-level ranges."""
        query = sql.SQL(
            "SELECT {code}, count(*), sum(h)::text FROM {s} WHERE b & {m} = ANY(%s) GROUP BY 1"
        ).format(code=_CODE, s=self._rows(), m=_MASK1)
        rows = self._run(query, list(ranges))
        return {int(str(r[0])): (int(str(r[1])), str(r[2])) for r in rows}

    def keys(self, codes: Sequence[int] | None) -> dict[Key, tuple[str, str]]:
        """``{key: (row hash, cursor)}`` of the rows inside the given sub-ranges (``None``:
        every row of the side)."""
        if codes is None:
            query = sql.SQL("SELECT k, h::text, c FROM {s}").format(s=self._rows())
            rows = self._run(query)
        else:
            query = sql.SQL("SELECT k, h::text, c FROM {s} WHERE {code} = ANY(%s)").format(
                s=self._rows(), code=_CODE
            )
            rows = self._run(query, list(codes))
        return {tuple(cast(list[str], r[0])): (str(r[1]), str(r[2])) for r in rows}


def _differing(a: dict[int, tuple[int, str]], b: dict[int, tuple[int, str]]) -> list[int]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _readers(source: Side, target: Side, rows: Rows) -> tuple[_Reader, _Reader]:
    bucket = row_hash(source.conn, rows.key)
    content = row_hash(source.conn, rows.columns) if rows.columns else bucket
    key_text = sql.SQL(", ").join(sql.SQL("{}::text").format(k.ident) for k in rows.key)
    cursor: sql.Composable = sql.SQL("NULL") if rows.cursor is None else rows.cursor.ident
    return (
        _Reader(source, bucket, content, key_text, cursor),
        _Reader(target, bucket, content, key_text, cursor),
    )


def compare(source: Side, target: Side, rows: Rows, *, direct: bool = False) -> Comparison:
    """Compares both sides range by range; the keys that differ.

    Args:
        source: The source side, inside the snapshot to compare with.
        target: The target side (its ``where`` leaves out rows that do not count, such as those
            a ``soft`` delete marked).
        rows: The key and the columns compared.
        direct: Send every key of both sides at once, without the levels (for a range known to
            hold few rows).
    """
    src, tgt = _readers(source, target, rows)
    first: list[int] = []
    codes: list[int] | None = None
    counted: int | None = None
    if not direct:
        measured: dict[int, list[int]] = {}

        def differing(level: list[Level]) -> list[Level]:
            nonlocal counted
            depth = level[0][0]
            if depth == 1:
                a, b = both(src.first, tgt.first)
                counted = sum(n for n, _ in b.values())
            else:
                parents = sorted({code >> SECOND_BITS for _, code in level})
                a, b = both(lambda: src.second(parents), lambda: tgt.second(parents))
            wanted = {c for _, c in level}
            measured[depth] = [c for c in _differing(a, b) if c in wanted]
            return [(depth, c) for c in measured[depth]]

        def split(r: Level) -> list[Level]:
            return [(2, (r[1] << SECOND_BITS) | j) for j in range(1 << SECOND_BITS)]

        every = [(1, c) for c in range(1 << FIRST_BITS)]
        leaves = drill(every, differing, split, lambda r: r[0] == 2)
        first = measured.get(1, [])
        if not leaves:
            return Comparison(ranges_differing=len(first), target_rows=counted)
        codes = [c for _, c in leaves]
    have, held = both(lambda: src.keys(codes), lambda: tgt.keys(codes))
    found = Comparison(
        source_only={k: v[1] for k, v in have.items() if k not in held},
        target_only={k for k in held if k not in have},
        differing={k: v[1] for k, v in have.items() if k in held and held[k][0] != v[0]},
        keys_compared=len(have) + len(held),
        ranges_differing=len(first),
        target_rows=len(held) if codes is None else counted,
    )
    if codes is None:  # sent at once: the whole side is one range
        return replace(found, ranges_differing=int(not found.empty))
    return found
