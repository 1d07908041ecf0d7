"""Deleting (``hard``) or marking (``soft``) the target rows of given keys: the one statement
every engine that applies deletes by key runs (the incremental stream's delete detection, sweep
and repair; the replication's held deletes).

The keys travel as text (:class:`~.text_keys.TextKeys`: one ``text[]`` parameter per key
column), are cast once to the key's types in a ``FROM`` item, and are joined to the target over
its key index (:func:`~.sinks.key_lookups`: a nested loop, whatever the planner guesses of an
array's rows), so any number of keys costs one statement. A ``soft`` delete is an ``UPDATE`` of
the soft-delete column (:mod:`.soft_deletes`) on the rows still live: a row marked before keeps
the time it was marked at.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg import sql

from .catalog import columns_equal
from .connection import Connection
from .identifiers import TableName
from .sinks import key_lookups
from .text_keys import TextKeys


def delete_keys(
    conn: Connection,
    target: TableName,
    keys: TextKeys,
    *,
    soft: str | None = None,
    at: datetime | Sequence[str] | None = None,
) -> int:
    """Deletes the rows of ``target`` whose key is one of ``keys`` (``soft``: marks them).

    Args:
        conn: The target session, in the caller's transaction.
        target: The target table; its key columns are named as ``keys``' columns.
        keys: The keys (each at most once).
        soft: The soft-delete column (it must exist): set to ``at`` on the live rows of the
            keys instead of deleting them.
        at: With ``soft``, the time a mark records: one for every key, or each key's own as
            text, in the keys' order (the commit time of the transaction that deleted it).

    Returns:
        The rows deleted, or marked.
    """
    if not keys.arrays or not keys.arrays[0]:
        return 0
    on = columns_equal("t", keys.alias, [c.name for c in keys.columns])
    if soft is None:
        statement = sql.SQL("DELETE FROM {} AS t USING {} WHERE {}").format(
            target.ident, keys.typed_rows(), on
        )
        params = keys.params
    elif isinstance(at, datetime):
        statement = sql.SQL("UPDATE {} AS t SET {} = %s FROM {} WHERE {} AND t.{} IS NULL").format(
            target.ident, sql.Identifier(soft), keys.typed_rows(), on, sql.Identifier(soft)
        )
        params = [at, *keys.params]
    else:
        assert at is not None, "a soft delete records when"
        statement = sql.SQL(
            "UPDATE {} AS t SET {} = {}.at::timestamptz FROM {} WHERE {} AND t.{} IS NULL"
        ).format(
            target.ident, sql.Identifier(soft), sql.Identifier(keys.alias),
            keys.typed_rows(("at", "text[]")), on, sql.Identifier(soft),
        )  # fmt: skip
        params = [*keys.params, list(at)]
    with key_lookups(conn):
        return conn.execute(statement, params).rowcount
