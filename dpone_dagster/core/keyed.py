"""A source table and its target compared by key: what the stream checks need of their tables,
their two sides for the one drill-down compare, and the lookup of given keys on one side.

Shared by the incremental stream's check and the replication group's (:mod:`.sweep`); each
engine's own tables satisfy :class:`SweptTables` (the incremental
:class:`~dpone_dagster.incremental.StreamShape`, or :class:`KeyedTables`). Every key reaches SQL
as text, cast to its column's type; every name through :class:`psycopg.sql.Identifier`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from psycopg import sql

from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.text_keys import TextKeys
from dpone_dagster.reconcile.compare import Key, Rows, Side


class SweptTables(Protocol):
    """What the sweep needs of a stream's tables (the incremental
    :class:`~dpone_dagster.incremental.StreamShape`, or :class:`KeyedTables`)."""

    @property
    def source(self) -> TableName:
        """The source table."""

    @property
    def target(self) -> TableName:
        """The target table."""

    @property
    def columns(self) -> tuple[Column, ...]:
        """The compared columns (the source's catalog)."""

    @property
    def key(self) -> tuple[Column, ...]:
        """The primary key's columns, in key order."""

    def live(self) -> sql.Composable:
        """The target's live rows (those a ``soft`` delete has not marked)."""

    def sides(
        self, src: Connection, tgt: Connection, *, rows: bool,
        where: sql.Composable | None = None, params: Sequence[object] = (),
    ) -> tuple[Side, Side, Rows]:  # fmt: skip
        """Both sides of the one drill-down compare."""


def live_rows(soft_column: str | None) -> sql.Composable:
    """The target's live rows: those a ``soft`` delete (``soft_column``) has not marked."""
    if soft_column is None:
        return sql.SQL("true")
    return sql.SQL("{} IS NULL").format(sql.Identifier(soft_column))


def keyed_sides(
    tables: SweptTables, src: Connection, tgt: Connection, *, rows: bool,
    where: sql.Composable | None = None, params: Sequence[object] = (),
    cursor: Column | None = None,
) -> tuple[Side, Side, Rows]:  # fmt: skip
    """Both sides of the one drill-down compare (:func:`dpone_dagster.reconcile.compare.
    compare`): the source's rows and the target's live ones (both restricted by ``where``),
    whole rows (``rows``) or the key only, the source's ``cursor`` sent with a difference."""
    mine: sql.Composable = sql.SQL("true") if where is None else where
    live = sql.SQL("({}) AND {}").format(mine, tables.live())
    compared = Rows(tables.key, tables.columns if rows else (), cursor)
    return (
        Side(src, tables.source, mine, tuple(params)),
        Side(tgt, tables.target, live, tuple(params)),
        compared,
    )


@dataclass(frozen=True)
class KeyedTables:
    """A source table and its target compared by key (a replicated table).

    Attributes:
        source: The source table.
        target: The target table.
        columns: The compared columns (the source's catalog).
        key: The primary key's columns, in key order.
        soft_column: The target's deleted-at column under ``soft`` deletes (else ``None``).
    """

    source: TableName
    target: TableName
    columns: tuple[Column, ...]
    key: tuple[Column, ...]
    soft_column: str | None = None

    def live(self) -> sql.Composable:
        """The target's live rows."""
        return live_rows(self.soft_column)

    def sides(
        self, src: Connection, tgt: Connection, *, rows: bool,
        where: sql.Composable | None = None, params: Sequence[object] = (),
    ) -> tuple[Side, Side, Rows]:  # fmt: skip
        """Both sides of the one drill-down compare (:func:`keyed_sides`)."""
        return keyed_sides(self, src, tgt, rows=rows, where=where, params=params)


def key_cols(key: Sequence[Column], alias: str = "") -> sql.Composed:
    """The key's columns, comma-separated (``alias.`` before each, when given)."""
    prefix = sql.SQL(alias + ".") if alias else sql.SQL("")
    return sql.SQL(", ").join(sql.SQL("{}{}").format(prefix, k.ident) for k in key)


def key_text(key: Sequence[Column], alias: str = "") -> sql.Composed:
    """``ARRAY[k1::text, ...]``: a key as text (:data:`~dpone_dagster.reconcile.compare.Key`)."""
    prefix = sql.SQL(alias + ".") if alias else sql.SQL("")
    return sql.SQL("ARRAY[{}]").format(
        sql.SQL(", ").join(sql.SQL("{}{}::text").format(prefix, k.ident) for k in key)
    )


def key_value(key: Sequence[Column]) -> sql.Composed:
    """``ROW(CAST(%s::text AS t1), ...)``: a key given as text, one parameter per column."""
    return sql.SQL("ROW({})").format(
        sql.SQL(", ").join(sql.SQL("CAST(%s::text AS {})").format(sql.SQL(k.type_sql)) for k in key)
    )


def keys_digest(
    conn: Connection, table: TableName, given: TextKeys, live: sql.Composable, h: sql.Composable
) -> tuple[int, int]:
    """The rows of ``table`` (its ``live`` rows) that have one of the ``given`` keys: how many,
    and the sum of their row hashes ``h`` (a key given twice counts twice). Both sides of a
    comparison return the same pair for the same keys when their rows are equal; one index
    probe per key, computed by ``conn``'s server, which returns two numbers."""
    query = sql.SQL(
        "SELECT count(r.h), coalesce(sum(r.h), 0) FROM {given} LEFT JOIN LATERAL"
        " (SELECT {h} AS h FROM {t} AS t WHERE {on} AND {live} LIMIT 1) AS r ON true"
    ).format(given=given.rows(), h=h, t=table.ident, on=given.equal("t"), live=live)
    row = conn.execute(query, given.params).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def differing_keys(
    conn: Connection, table: TableName, key: Sequence[Column], live: sql.Composable,
    h: sql.Composable, columns: Sequence[Sequence[str | None]], hashes: Sequence[int | None],
) -> list[Key]:  # fmt: skip
    """Of the given keys (one text array per key column) and the other side's row hashes
    (``None``: it holds no such row), those whose row in ``table`` (its ``live`` rows) is
    missing or hashes otherwise; computed by ``conn``'s server, which returns only them."""
    given = TextKeys.from_arrays(key, columns)
    # One index probe per key (LIMIT 1 keeps the planner from turning the lookup into a hash
    # join over the whole table): the cost follows the keys, not the table.
    query = sql.SQL(
        "SELECT {uk} FROM {given} LEFT JOIN LATERAL"
        " (SELECT {h} AS h FROM {t} AS t WHERE {on} AND {live} LIMIT 1) AS r ON true"
        " WHERE r.h IS DISTINCT FROM u.h"
    ).format(
        uk=given.as_text(), given=given.rows(("h", "int8[]")), h=h, t=table.ident,
        on=given.equal("t"), live=live,
    )  # fmt: skip
    return sorted(tuple(r[0]) for r in conn.execute(query, [*given.params, list(hashes)]))
