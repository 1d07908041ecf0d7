"""Finding deleted keys by counting key ranges, for a stream whose key starts with an integer.

Counts come from index-only scans of the primary key on both sides, so a run that finds no
delete costs one ``count(*)`` per side, and one that finds a few drills only into the ranges
that differ:

1. the key range ``[min, max]`` of both sides is split into about 1,024 ranges of the first key
   column, counted on each side in one query (one pass over the key's index); the split points
   come from the source's histogram of the key (``pg_stats``, kept by ANALYZE), so that the
   ranges hold similar numbers of rows however sparse the keys are (an equal split of the
   values when there is no histogram). The split points only decide how much a differing range
   costs to drill into: every range is counted exactly on both sides, so stale statistics cannot
   change what is found;
2. each range whose counts differ is split into 64, and those are counted, and so on;
3. a differing range with at most :data:`LEAF_ROWS` target rows sends its keys, from both sides;
   the keys the target holds and the source does not are the deleted ones.

A source row whose cursor is above the run's mark (changed or inserted since) may not be in the
target yet; such rows are read through the cursor's index and subtracted from the source's
counts, so the two counts are equal exactly when the range holds no deleted key and no row
changed since the mark (which then only costs a look at its keys). The source side reads in the
caller's snapshot, the target in the caller's transaction.

Why this is not the one drill-down compare (:func:`dpone_dagster.reconcile.compare.compare`): a
delete changes a range's key count, so counts answer the question, and a count over a range of
the key is an index-only scan that reads no row, where a digest hashes every row of the range
(the key hash's ranges are spread over the whole table: every level reads every row). Both drill
with the same skeleton (:func:`dpone_dagster.reconcile.compare.drill`), over ranges of key values
here, ranges of the key's hash there.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.reconcile.compare import Key, both, drill

from .shape import StreamShape

INTEGER_KEYS = frozenset({"int2", "int4", "int8"})
"""First key column types whose ranges split arithmetically."""
FIRST_SPLIT = 1024
"""Ranges the whole key range is split into when its counts differ."""
SPLIT = 64
"""Ranges a deeper differing range is split into."""
LEAF_ROWS = 64
"""A differing range with at most this many target rows sends its keys."""
MAX_FRESH = 200_000
"""More rows changed since the mark than this: count ranges without the correction (the caller
falls back to the digest comparison)."""

Range = tuple[int, int]


@dataclass(frozen=True)
class RangeScan:
    """What the range counts found: the deleted keys, how many keys crossed the wire, and the
    target's live rows (its first level's counts cover both sides' whole key range)."""

    deleted: list[Key]
    keys_compared: int
    ranges_counted: int
    target_rows: int


class _Side:
    def __init__(
        self, conn: Connection, shape: StreamShape, table: sql.Composable, live: sql.Composable
    ):
        self.conn, self.shape, self.table, self.live = conn, shape, table, live
        self.k1 = shape.key[0].ident
        # Bounds of the key's own type (int8 for every integer: an int4 key compares with an
        # int8 bound through its index); numeric bounds would turn each count into a scan.
        self.array = sql.SQL("int8[]")

    def bounds(self) -> tuple[int | None, int | None]:
        row = self.conn.execute(
            sql.SQL("SELECT min({k}), max({k}) FROM {t} WHERE {w}").format(
                k=self.k1, t=self.table, w=self.live
            )
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    def counts(self, ranges: Sequence[Range]) -> list[int]:
        query = sql.SQL(
            "SELECT (SELECT count(*) FROM {t} WHERE {k} >= r.lo AND {k} < r.hi AND {w})"
            " FROM unnest(CAST(%s AS {a}), CAST(%s AS {a})) WITH ORDINALITY AS r(lo, hi, n)"
            " ORDER BY r.n"
        ).format(t=self.table, k=self.k1, w=self.live, a=self.array)
        rows = self.conn.execute(query, ([r[0] for r in ranges], [r[1] for r in ranges]))
        return [int(r[0]) for r in rows]

    def keys(self, ranges: Sequence[Range]) -> set[Key]:
        names = sql.SQL(", ").join(sql.SQL("t.{}::text").format(k.ident) for k in self.shape.key)
        query = sql.SQL(
            "SELECT ARRAY[{n}] FROM unnest(CAST(%s AS {a}), CAST(%s AS {a})) AS r(lo, hi)"
            " JOIN {t} AS t ON t.{k} >= r.lo AND t.{k} < r.hi WHERE {w}"
        ).format(n=names, t=self.table, k=self.k1, w=self.live, a=self.array)
        rows = self.conn.execute(query, ([r[0] for r in ranges], [r[1] for r in ranges]))
        return {tuple(r[0]) for r in rows}


def _fresh(src: Connection, shape: StreamShape, mark: str) -> list[int] | None:
    """First key values of the source rows whose cursor is above ``mark``, sorted."""
    query = sql.SQL("SELECT {k} FROM {t} WHERE {c} > CAST(%s::text AS {ct}) LIMIT %s").format(
        k=shape.key[0].ident,
        t=shape.source.ident,
        c=shape.cursor.ident,
        ct=sql.SQL(shape.cursor.type_sql),
    )
    rows = src.execute(query, (mark, MAX_FRESH + 1)).fetchall()
    if len(rows) > MAX_FRESH:
        return None
    return sorted(int(r[0]) for r in rows)


def _split(r: Range, parts: int) -> list[Range]:
    lo, hi = r
    step = max(1, -(-(hi - lo) // parts))
    return [(a, min(hi, a + step)) for a in range(lo, hi, step)]


_HISTOGRAM = sql.SQL(
    "SELECT histogram_bounds::text::int8[] FROM pg_stats"
    " WHERE schemaname = %s AND tablename = %s AND attname = %s"
    " ORDER BY inherited DESC LIMIT 1"
)


def _first_ranges(src: Connection, shape: StreamShape, whole: Range) -> list[Range]:
    """About :data:`FIRST_SPLIT` ranges covering ``whole``: each bucket of the source's
    histogram of the key split equally (``whole`` split equally without a histogram)."""
    table, key = shape.source, shape.key[0].name
    row = src.execute(_HISTOGRAM, (table.schema, table.name, key)).fetchone()
    bounds = [] if row is None or row[0] is None else list(row[0])
    lo, hi = whole
    points = sorted({lo, hi, *(int(b) for b in bounds if lo < int(b) < hi)})
    parts = max(1, FIRST_SPLIT // (len(points) - 1))
    return [r for a, b in itertools.pairwise(points) for r in _split((a, b), parts)]


def range_scan(src: Connection, tgt: Connection, shape: StreamShape, mark: str) -> RangeScan | None:
    """The keys the target holds and the source lost, by counting ranges (``None``: the stream
    does not qualify, or too many rows changed since the mark; use the digest comparison)."""
    if shape.key[0].type_name not in INTEGER_KEYS or shape.key[0].type_schema != "pg_catalog":
        return None
    fresh = _fresh(src, shape, mark)
    if fresh is None:
        return None
    live: sql.Composable = sql.SQL("true")
    if shape.soft_column is not None:
        live = sql.SQL("{} IS NULL").format(sql.Identifier(shape.soft_column))
    source = _Side(src, shape, shape.source.ident, sql.SQL("true"))
    target = _Side(tgt, shape, shape.target.ident, live)
    ends = [v for pair in both(source.bounds, target.bounds) for v in pair if v is not None]
    if not ends:
        return RangeScan([], 0, 0, 0)
    first = _first_ranges(src, shape, (min(ends), max(ends) + 1))
    return _drill(source, target, first, fresh)


def _count_both(source: _Side, target: _Side, ranges: list[Range]) -> tuple[list[int], list[int]]:
    return both(lambda: source.counts(ranges), lambda: target.counts(ranges))


def _drill(source: _Side, target: _Side, ranges: list[Range], fresh: list[int]) -> RangeScan:
    counted = 0
    target_rows: int | None = None
    held_rows: dict[Range, int] = {}

    def differing(level: list[Range]) -> list[Range]:
        nonlocal counted, target_rows
        have, held = _count_both(source, target, level)
        counted += len(level)
        if target_rows is None:  # the first level: the whole key range
            target_rows = sum(held)
        found = []
        for r, s, t in zip(level, have, held, strict=True):
            moved = bisect.bisect_left(fresh, r[1]) - bisect.bisect_left(fresh, r[0])
            if t != s - moved:
                held_rows[r] = t
                found.append(r)
        return found

    def leaf(r: Range) -> bool:
        return held_rows[r] <= LEAF_ROWS or r[1] - r[0] <= LEAF_ROWS

    leaves = drill(ranges, differing, lambda r: _split(r, SPLIT), leaf)
    assert target_rows is not None  # the first level was counted
    if not leaves:
        return RangeScan([], 0, counted, target_rows)
    have_keys, held_keys = both(lambda: source.keys(leaves), lambda: target.keys(leaves))
    deleted = sorted(held_keys - have_keys)
    return RangeScan(deleted, len(have_keys) + len(held_keys), counted, target_rows)
