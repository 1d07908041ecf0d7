"""The one reconciliation digest: a row count and an order-independent, exact content hash,
computed by each server over its own rows.

    SELECT count(*), sum(hash_record_extended(ROW(<exact encodings>), 0)) FROM t WHERE <filter>

* **Server-side.** Only ``(count, hash)`` crosses the wire, whatever the number of rows.
* **Order-independent.** Each row is hashed on its own (64 bits) and the hashes are summed as
  ``numeric`` (no overflow, no wrap), so the physical order of the rows does not matter.
* **Exact, not merely equal.** A row is hashed from an exact encoding of each column, so values
  that the type's ``=`` calls equal but that are stored differently (``1.50`` and ``1.5``, ``-0``
  and ``0``, ``'1 day'`` and ``'24 hours'``, ``'[0:1]={1,2}'`` and ``'{1,2}'``, ``'A'`` and
  ``'a'`` under a case-insensitive collation) are told apart. A type whose own hash is already
  exact (integers, ``bool``, ``date``, the timestamps, ``uuid``, ``bytea``, and ``text`` /
  ``varchar`` compared byte-wise under ``COLLATE "C"``) is hashed as it is; every other built-in
  type through its binary send function (what binary COPY carries); a user-defined type (its OID,
  and so its binary form, differs between databases) through its text output, spelled the same
  on both sides because :func:`pin_settings` fixes the settings that decide it.
* **Comparable.** The same expression runs on both sides. A target column whose type differs
  from the source's is cast to the source's type first, so the value the target holds is compared
  with the source's as the source's type sees it.

The hash is ``hash_record_extended`` (PostgreSQL 14+): strong against accidental differences (a
missing, extra or changed row leaves the sum unchanged with probability about 2^-64), not a
cryptographic commitment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import Column, TableName
from dpone_dagster.postgres.connection import Connection

DIGEST_ALGORITHM = "rowhash64-sum"
"""The prefix of every digest's hash: the sum of 64-bit row hashes."""

EXACT_HASH_TYPES = frozenset({16, 17, 18, 20, 21, 23, 26, 1082, 1083, 1114, 1184, 2950})
"""Built-in types whose own hash distinguishes every stored value: bool, bytea, "char", int8,
int2, int4, oid, date, time, timestamp, timestamptz, uuid."""

BYTEWISE_TEXT_TYPES = frozenset({25, 1043})
"""``text`` and ``varchar``: exact when hashed under ``COLLATE "C"``."""

DIGEST_SETTINGS: tuple[tuple[str, str], ...] = (
    ("TimeZone", "UTC"),
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    ("lc_monetary", "C"),
)
"""Settings that fix the text of every value (user-defined types are hashed through it)."""

MIN_SERVER_VERSION = 140000
"""``hash_record_extended`` appeared in PostgreSQL 14."""

_SEND_FUNCTIONS = """
SELECT t.oid::bigint, p.proname
FROM pg_type t JOIN pg_proc p ON p.oid = t.typsend
WHERE t.oid = ANY(%s::bigint[]::oid[]) AND p.pronamespace = 'pg_catalog'::regnamespace
"""


class DigestError(DponeError):
    """A digest cannot be computed on this server."""


@dataclass(frozen=True)
class Digest:
    """What one side holds: a row count and the content hash of those rows.

    Attributes:
        count: ``count(*)``.
        hash: ``rowhash64-sum:`` and the sum of the rows' 64-bit hashes (None when the rows
            were proven by row versions, without being read).
    """

    count: int
    hash: str | None


EMPTY = Digest(0, f"{DIGEST_ALGORITHM}:0")
"""The digest of no rows."""


def pin_settings(conn: Connection, *, local: bool) -> None:
    """Fixes :data:`DIGEST_SETTINGS` on ``conn``, for its session or (``local``) its transaction.

    One round trip. Inside a transaction, ``local`` settings end with it.
    """
    calls = sql.SQL(", ").join(
        sql.SQL("set_config({}, {}, {})").format(
            sql.Literal(name), sql.Literal(value), sql.Literal(local)
        )
        for name, value in DIGEST_SETTINGS
    )
    conn.execute(sql.SQL("SELECT {}").format(calls))


def require_row_hash(*conns: Connection) -> None:
    """Refuses a server that cannot compute the digest, before anything is read.

    Raises:
        DigestError: ``reconcile_server_too_old`` for a server older than PostgreSQL 14.
    """
    for conn in conns:
        if conn.info.server_version < MIN_SERVER_VERSION:
            raise DigestError(
                "reconcile_server_too_old",
                f"The reconciliation needs PostgreSQL 14 or later; database "
                f"{conn.info.dbname!r} runs {conn.info.server_version}.",
                ["Upgrade the server, or run the copy without its reconciliation."],
            )


def _encoding(column: Column, send: Mapping[int, str], cast: str | None) -> sql.Composable:
    value: sql.Composable = column.ident
    if cast is not None:  # the other side's type: compare as the source's type sees it
        value = sql.SQL("CAST({} AS {})").format(column.ident, sql.SQL(cast))
    if column.user_type:
        return sql.SQL("({})::text").format(value)
    if column.type_oid in EXACT_HASH_TYPES:
        return value
    if column.type_oid in BYTEWISE_TEXT_TYPES:
        return sql.SQL("({}) COLLATE {}").format(value, sql.Identifier("C"))
    if column.type_oid in send:
        return sql.SQL("{}({})").format(sql.Identifier("pg_catalog", send[column.type_oid]), value)
    return sql.SQL("({})::text").format(value)


def row_hash(
    conn: Connection, columns: Sequence[Column], *, casts: Mapping[str, str] | None = None
) -> sql.Composed:
    """The 64-bit hash of one row's exact encoding over ``columns`` (the source's catalog).

    Built-in types have the same OIDs and send functions in every database, so the expression
    built from one side's catalog is valid on the other.

    Args:
        conn: A session whose catalog names the send functions (either side).
        columns: The compared columns, as the source's catalog describes them.
        casts: Per column name, the source's type to cast the other side's column to (for a
            target whose column type differs); none for the source side.
    """
    builtin = [c.type_oid for c in columns if not c.user_type]
    rows = conn.execute(_SEND_FUNCTIONS, (builtin,)).fetchall()
    send = {int(r[0]): str(r[1]) for r in rows}
    casts = casts or {}
    return sql.SQL("hash_record_extended(ROW({}), 0)").format(
        sql.SQL(", ").join(_encoding(c, send, casts.get(c.name)) for c in columns)
    )


def digest_query(
    table: TableName,
    row: sql.Composable,
    where: sql.Composable | None = None,
    params: Sequence[object] = (),
) -> tuple[sql.Composed, list[object]]:
    """``SELECT count(*), sum(<row hash>) FROM table [WHERE ...]`` and its parameters."""
    filtered = sql.SQL("") if where is None else sql.SQL(" WHERE {}").format(where)
    query = sql.SQL("SELECT count(*), coalesce(sum({}), 0)::text FROM {}{}").format(
        row, table.ident, filtered
    )
    return query, list(params)


def digest_sums(
    conn: Connection,
    table: TableName,
    row: sql.Composable,
    where: sql.Composable | None = None,
    params: Sequence[object] = (),
) -> tuple[int, int]:
    """Runs one :func:`digest_query` in ``conn``'s current transaction: the row count and the
    sum of the rows' hashes as numbers (for a caller that adds or takes digests away)."""
    query, values = digest_query(table, row, where, params)
    found = conn.execute(query, values).fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def run_digest(conn: Connection, query: sql.Composed, params: Sequence[object] = ()) -> Digest:
    """Runs one :func:`digest_query` in ``conn``'s current transaction."""
    found = conn.execute(query, params).fetchone()
    assert found is not None
    return Digest(int(found[0]), f"{DIGEST_ALGORITHM}:{found[1]}")
