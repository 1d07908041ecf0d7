"""Keys handed to the server as text: one ``text[]`` parameter per key column, read back as
rows by ``unnest`` and cast to each key column's type on the server.

A key travels as the text PostgreSQL printed for it, exact for every key type (numeric scale,
timestamps, enums, composite keys whose text holds tabs, quotes or newlines), so any number of
keys costs one statement and each lookup may use the key's index. Every engine that looks rows
up by a list of keys (a replication's held deletes and its check, a stream's deletes and sweep,
the key comparison, a backfill's existing rows) builds its statement from :class:`TextKeys`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from .catalog import Column, column_type

KeyText = Sequence[str | None]
"""One key as text, a value per key column in key order."""


@dataclass(frozen=True)
class TextKeys:
    """Keys as one text array per key column, unnested on the server under ``alias``.

    Attributes:
        columns: The key's columns, in key order (their types are the casts).
        arrays: One list per key column: that column's value of every key, in the keys' order.
        alias: The ``unnest``'s alias; its columns are ``k0``, ``k1``, ...
    """

    columns: tuple[Column, ...]
    arrays: tuple[list[str | None], ...]
    alias: str = "u"

    @classmethod
    def of(cls, columns: Sequence[Column], keys: Sequence[KeyText], alias: str = "u") -> TextKeys:
        """The keys ``keys`` (each a value per column of ``columns``)."""
        return cls.from_arrays(
            columns, [[key[i] for key in keys] for i in range(len(columns))], alias
        )

    @classmethod
    def from_arrays(
        cls, columns: Sequence[Column], arrays: Sequence[Sequence[str | None]], alias: str = "u"
    ) -> TextKeys:
        """The keys given as one array per key column (already in the server's layout)."""
        if len(arrays) != len(columns):
            raise ValueError(f"{len(arrays)} key arrays for {len(columns)} key columns")
        return cls(tuple(columns), tuple(list(a) for a in arrays), alias)

    @property
    def names(self) -> list[sql.Identifier]:
        """The ``unnest``'s column names: ``k0``, ``k1``, ..."""
        return [sql.Identifier(f"k{i}") for i in range(len(self.columns))]

    @property
    def params(self) -> list[object]:
        """The statement's parameters for :meth:`rows`'s key arrays, in their order."""
        return list(self.arrays)

    def rows(self, *extra: tuple[str, str]) -> sql.Composed:
        """``unnest(%s::text[], ...) AS u(k0, ...)``: a ``FROM`` item of one row per key.

        Args:
            extra: More arrays unnested beside the keys, each ``(name, array type)`` such as
                ``("h", "int8[]")``: their parameters follow :attr:`params`, in this order.
        """
        slots: list[sql.Composable] = [sql.SQL("%s::text[]") for _ in self.columns]
        slots += [sql.SQL("%s::{}").format(sql.SQL(kind)) for _, kind in extra]
        names: list[sql.Composable] = [*self.names, *(sql.Identifier(n) for n, _ in extra)]
        return sql.SQL("unnest({}) AS {}({})").format(
            sql.SQL(", ").join(slots), sql.Identifier(self.alias), sql.SQL(", ").join(names)
        )

    def cast(self, index: int) -> sql.Composed:
        """``CAST(u.k<index> AS <type>)``: one key value as its column's type."""
        return sql.SQL("CAST({}.{} AS {})").format(
            sql.Identifier(self.alias), self.names[index], column_type(self.columns[index])
        )

    def equal(self, alias: str) -> sql.Composed:
        """``t.a = CAST(u.k0 AS ...) AND ...``: the row ``alias`` has the key of the row ``u``
        (each equality may use the key's index)."""
        return sql.SQL(" AND ").join(
            sql.SQL("{}.{} = {}").format(sql.Identifier(alias), c.ident, self.cast(i))
            for i, c in enumerate(self.columns)
        )

    def typed(self) -> sql.Composed:
        """``CAST(u.k0 AS ...) AS "a", ...``: the keys under their columns' names and types."""
        return sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(self.cast(i), c.ident) for i, c in enumerate(self.columns)
        )

    def typed_rows(self, *extra: tuple[str, str]) -> sql.Composed:
        """``(SELECT CAST(u.k0 AS ...) AS "a", ... FROM unnest(...) AS u(k0, ...)) AS u``: a
        ``FROM`` item of one row per key, under the key columns' names and types (each cast
        once; a join on them may use the key's index), with :meth:`rows`'s ``extra`` arrays
        beside them under their names. Its parameters: :attr:`params`, then the extras'."""
        more = [sql.SQL(", {}.{}").format(sql.Identifier(self.alias), sql.Identifier(n))
                for n, _ in extra]  # fmt: skip
        return sql.SQL("(SELECT {}{} FROM {}) AS {}").format(
            self.typed(), sql.Composed(more), self.rows(*extra), sql.Identifier(self.alias)
        )

    def as_text(self) -> sql.Composed:
        """``ARRAY[u.k0, ...]``: each key as the text it was given in."""
        return sql.SQL("ARRAY[{}]").format(
            sql.SQL(", ").join(
                sql.SQL("{}.{}").format(sql.Identifier(self.alias), n) for n in self.names
            )
        )
