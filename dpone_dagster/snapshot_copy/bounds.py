"""Split bounds of a partitioned copy: MIN/MAX/count inside the snapshot, and ordered ranges.

The bounds are read in the coordinator's exported snapshot, so the ranges describe exactly the
rows the workers will see, however the table changes meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import SnapshotSession

INTEGER_TYPES = frozenset({20, 21, 23})
"""OIDs of int8, int2 and int4: the key types split by MIN/MAX arithmetic."""


@dataclass(frozen=True)
class KeyBounds:
    """The split bounds of one table, computed inside the exported snapshot.

    Attributes:
        column: The split column (the first primary-key column), or None when the table has
            no integer key and is copied as one range.
        minimum: ``min(column)`` in the snapshot (None for an empty table).
        maximum: ``max(column)`` in the snapshot.
        count: ``count(*)`` in the snapshot.
    """

    column: str | None
    minimum: int | None
    maximum: int | None
    count: int


@dataclass(frozen=True)
class KeyRange:
    """An inclusive range of the split column (both None: the whole table)."""

    lower: int | None
    upper: int | None


def split_column(columns: Sequence[Column], key: Sequence[str]) -> str | None:
    """The first primary-key column when it is an integer, else None."""
    by_name = {c.name: c for c in columns}
    if key and key[0] in by_name and by_name[key[0]].type_oid in INTEGER_TYPES:
        return key[0]
    return None


def compute_bounds(session: SnapshotSession, table: TableName, column: str | None) -> KeyBounds:
    """Reads ``min``, ``max`` and ``count(*)`` of ``column`` in ``session``'s snapshot."""
    if column is None:
        query = sql.SQL("SELECT NULL::bigint, NULL::bigint, count(*) FROM {}").format(table.ident)
    else:
        query = sql.SQL("SELECT min({c}), max({c}), count(*) FROM {t}").format(
            c=sql.Identifier(column), t=table.ident
        )
    row = session.conn.execute(query).fetchone()
    assert row is not None
    low, high, count = row
    return KeyBounds(
        column=column,
        minimum=None if low is None else int(low),
        maximum=None if high is None else int(high),
        count=int(count),
    )


def split_ranges(bounds: KeyBounds, parts: int) -> list[KeyRange]:
    """Splits ``[minimum, maximum]`` into at most ``parts`` ordered, contiguous ranges.

    The ranges are in ascending order, do not overlap and cover the bounds exactly; a table
    without a split column (or without rows) is one whole-table range.
    """
    if bounds.column is None or bounds.minimum is None or bounds.maximum is None:
        return [KeyRange(None, None)]
    span = bounds.maximum - bounds.minimum + 1
    parts = max(1, min(parts, span))
    step = -(-span // parts)
    ranges = []
    low = bounds.minimum
    while low <= bounds.maximum:
        high = min(low + step - 1, bounds.maximum)
        ranges.append(KeyRange(low, high))
        low = high + 1
    return ranges
