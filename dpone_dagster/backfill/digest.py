"""The reconciliation's range digest: a count and an order-independent content hash, server-side.

Reading both sides through the client to hash them costs about as much as the copy itself. Here
each server digests its own rows and only ``(count, hash)`` per batch range crosses the wire:

    SELECT count(*), sum(hash_record_extended(ROW(<exact encodings>), 0)) FROM t WHERE <range>

* **Order-independent.** Each row is hashed on its own (64 bits) and the hashes are summed as
  ``numeric`` (no overflow, no wrap), so the physical order of the rows does not matter and two
  servers agree on equal sets of rows.
* **Exact, not merely equal.** A row is hashed from an exact encoding of each column, so values
  that the type's ``=`` calls equal but that are stored differently (``1.50`` and ``1.5``,
  ``-0`` and ``0``, ``'1 day'`` and ``'24 hours'``, ``'[0:1]={1,2}'`` and ``'{1,2}'``, ``'A'``
  and ``'a'`` under a case-insensitive collation) are told apart. A type whose own hash is
  already exact (integers, ``bool``, ``date``, the timestamps, ``uuid``, ``bytea``, and
  ``text``/``varchar`` compared byte-wise under ``COLLATE "C"``) is hashed as is; every other
  built-in type is hashed through its binary send function (what binary COPY carries); a
  user-defined type (its OID, and so its binary form, differs between databases) through its
  text output, spelled identically on both sides because every session pins the settings that
  decide it (:func:`shape.prepare_session`). Building the text of whole rows (``ROW(...)::text``)
  would be just as exact and about 2.5 times slower.
* **Comparable.** The same expression runs on both sides; the copier already refuses a target
  whose columns or types differ from the source's, so it means the same thing on both.

The hash is ``hash_record_extended`` (PostgreSQL 14+): strong against accidental differences
(a missing, extra or changed row leaves the sum unchanged with probability about 2^-64), not a
cryptographic commitment. The batch receipts' ``sha256`` of the COPY stream is that: it binds
what was sent. The two prove different things and are not expected to be equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.identifiers import TableName

from .errors import backfill_error
from .shape import TableShape

Conn = psycopg.Connection[tuple[object, ...]]

DIGEST_ALGORITHM = "rowhash64-sum"
"""The prefix of every reconciliation hash: the sum of 64-bit row hashes."""

EXACT_HASH_TYPES = frozenset({16, 17, 18, 20, 21, 23, 26, 1082, 1083, 1114, 1184, 2950})
"""Built-in types whose own hash distinguishes every stored value: bool, bytea, "char", int8,
int2, int4, oid, date, time, timestamp, timestamptz, uuid."""

BYTEWISE_TEXT_TYPES = frozenset({25, 1043})
"""``text`` and ``varchar``: exact when hashed under ``COLLATE "C"``."""

_SEND_FUNCTIONS = """
SELECT t.oid::int, p.proname
FROM pg_type t JOIN pg_proc p ON p.oid = t.typsend
WHERE t.oid = ANY(%s) AND p.pronamespace = 'pg_catalog'::regnamespace
"""


@dataclass(frozen=True)
class RangeDigest:
    """What one side holds in one batch range: its row count and content hash."""

    count: int
    hash: str


def _encoding(column: Column, send: dict[int, str]) -> sql.Composable:
    ident = column.ident
    if column.user_type:
        return sql.SQL("({})::text").format(ident)
    if column.type_oid in EXACT_HASH_TYPES:
        return ident
    if column.type_oid in BYTEWISE_TEXT_TYPES:
        return sql.SQL("{} COLLATE {}").format(ident, sql.Identifier("C"))
    if column.type_oid in send:
        return sql.SQL("{}({})").format(sql.Identifier("pg_catalog", send[column.type_oid]), ident)
    return sql.SQL("({})::text").format(ident)


MIN_SERVER_VERSION = 140000
"""``hash_record_extended`` appeared in PostgreSQL 14."""


def require_row_hash(*conns: Conn) -> None:
    """Refuses a server that cannot compute the row hash, before anything is read.

    Raises:
        BackfillError: ``plan_invalid`` for a server older than PostgreSQL 14.
    """
    for conn in conns:
        if conn.info.server_version < MIN_SERVER_VERSION:
            raise backfill_error(
                "plan_invalid",
                f"The reconciliation needs PostgreSQL 14 or later; database "
                f"{conn.info.dbname!r} runs {conn.info.server_version}.",
            )


def row_hash(conn: Conn, columns: Sequence[Column]) -> sql.Composed:
    """The 64-bit hash of one row's exact encoding, for ``columns`` (read from ``conn``'s catalog).

    Built-in types have the same OIDs and send functions in every database, so the expression
    built from one side's catalog is valid on the other.
    """
    builtin = [c.type_oid for c in columns if not c.user_type]
    send = {int(r[0]): str(r[1]) for r in conn.execute(_SEND_FUNCTIONS, (builtin,)).fetchall()}  # type: ignore[call-overload]
    return sql.SQL("hash_record_extended(ROW({}), 0)").format(
        sql.SQL(", ").join(_encoding(c, send) for c in columns)
    )


def digest_query(
    shape: TableShape, table: TableName, row: sql.Composable, after: str | None, upper: str | None
) -> tuple[sql.Composed, list[str]]:
    """``SELECT count(*), sum(<row hash>) FROM table WHERE <range>`` and its parameters."""
    where, params = shape.where(after, upper)
    query = sql.SQL("SELECT count(*), coalesce(sum({}), 0)::text FROM {} WHERE {}").format(
        row, table.ident, where
    )
    return query, params


def range_digest(conn: Conn, query: sql.Composed, params: list[str]) -> RangeDigest:
    """Runs one :func:`digest_query` in ``conn``'s current transaction."""
    found = conn.execute(query, params).fetchone()
    assert found is not None
    return RangeDigest(int(found[0]), f"{DIGEST_ALGORITHM}:{found[1]}")  # type: ignore[call-overload]
