"""Table fingerprints: a row count and an order-independent content digest, computed server-side.

Each row is printed as PostgreSQL's text of ``ROW(col, ...)`` (NULL, ``NaN``, ``infinity``,
arrays, json: every value by its type's own output function), hashed with ``md5``, and the first
64 bits of every hash are summed. A sum does not depend on row order, so the server needs no sort
(and can scan with parallel workers), and only two numbers cross the wire, whatever the table's
size; a changed value, a missing row or an extra row changes the sum (an accidental collision has
a probability of about 2^-64; the sum is no defence against rows crafted to collide). One half of
the hash, not both: PostgreSQL would compute the row text and its md5 once per half, and the
second half doubled the time for no practical gain.

Two fingerprints are comparable when they cover the same column names in the same order and the
columns have the same types on both sides, as a copy's target created from its source does. The
text of some types depends on session settings (``TimeZone`` for ``timestamptz``, ``DateStyle``,
``IntervalStyle``, ``extra_float_digits``, ``bytea_output``, ``lc_monetary``), so the fingerprint
fixes them for its own statement only (:data:`FINGERPRINT_SETTINGS`), and hashes the text as
UTF-8 so that the databases' encodings do not matter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import DponeError, redact

from .catalog import Column
from .identifiers import TableName

FINGERPRINT_ALGORITHM = "md5-row-sum-64"
"""The digest's algorithm: the sum of the first 64 bits of ``md5(ROW(cols)::text)``, mod 2^64."""

FINGERPRINT_SETTINGS: tuple[tuple[str, str], ...] = (
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
    ("lc_monetary", "C"),
    ("search_path", "pg_catalog, pg_temp"),
)
"""Settings that fix the text of every value while a fingerprint is computed."""

_BEGIN = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
_SAVEPOINT = sql.Identifier("dpone_fingerprint")
_MOD = 1 << 64


class FingerprintError(DponeError):
    """A fingerprint could not be computed."""


@dataclass(frozen=True)
class Fingerprint:
    """A table's (or a filtered part's) row count and order-independent content digest.

    Attributes:
        rows: ``count(*)``.
        digest: ``md5-row-sum-64:`` and 16 hex digits; equal digests with equal counts mean
            equal row multisets (but for an accidental collision, about 2^-64).
    """

    rows: int
    digest: str


def table_fingerprint(
    conn: psycopg.Connection[tuple[object, ...]],
    table: TableName,
    columns: Sequence[Column] | Sequence[str],
    *,
    where: sql.Composable | None = None,
) -> Fingerprint:
    """Computes ``table``'s fingerprint over ``columns`` in one statement on the server.

    Inside an open transaction the fingerprint reads that transaction's snapshot (an imported
    one, for example) and leaves the transaction as it found it: the settings are fixed under a
    savepoint that is rolled back afterwards. On an idle autocommit session it runs in its own
    ``REPEATABLE READ READ ONLY`` transaction.

    Args:
        conn: The session: autocommit (dpone's sessions are), or inside a transaction.
        table: The table.
        columns: The columns, in the order to compare (the copied, non-generated columns).
        where: A filter composed with :mod:`psycopg.sql` (e.g. a key range); names resolve in
            ``table``, and functions must be ``pg_catalog``'s or schema-qualified.

    Returns:
        The row count and the digest.

    Raises:
        FingerprintError: ``fingerprint_session_invalid`` for a session in a failed transaction
            or an idle non-autocommit session (whose transaction psycopg would begin
            implicitly); ``fingerprint_failed`` when the server refuses the query (a missing
            table or column, a lost connection).

    Examples:
        >>> from dpone_dagster.postgres import TableName
        >>> statement = fingerprint_statement(TableName("public", "t"), ["id", "Note"])
        >>> print(statement.as_string(None))  # doctest: +NORMALIZE_WHITESPACE
        SELECT count(*), sum(('x' ||
            left(md5(convert_to(ROW("id", "Note")::text, 'UTF8')), 16))::bit(64)::bigint)
        FROM "public"."t"
    """
    statement = fingerprint_statement(table, columns, where=where)
    status = conn.info.transaction_status
    if status == pq.TransactionStatus.IDLE and conn.autocommit:
        conn.execute(_BEGIN)
        try:
            fix_settings(conn)
            return _run(conn, statement, table)
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()  # read only: nothing to keep
    if status != pq.TransactionStatus.INTRANS:
        raise FingerprintError(
            "fingerprint_session_invalid",
            f"Cannot fingerprint {table} on a session whose transaction status is {status.name}.",
            [
                "Use an autocommit session, or a session inside a healthy transaction "
                "(begun with an explicit isolation level).",
            ],
        )
    conn.execute(sql.SQL("SAVEPOINT {}").format(_SAVEPOINT))
    try:
        fix_settings(conn)
        return _run(conn, statement, table)
    finally:
        # Rolling back to the savepoint restores the caller's settings and clears an error.
        with contextlib.suppress(psycopg.Error):
            conn.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(_SAVEPOINT))
            conn.execute(sql.SQL("RELEASE SAVEPOINT {}").format(_SAVEPOINT))


def fingerprint_statement(
    table: TableName,
    columns: Sequence[Column] | Sequence[str],
    *,
    where: sql.Composable | None = None,
) -> sql.Composed:
    """The fingerprint's query: the count and the sum of every row's md5 prefix.

    Args:
        table: The table.
        columns: The columns, in order.
        where: A filter composed with :mod:`psycopg.sql`.
    """
    names = [c.name if isinstance(c, Column) else c for c in columns]
    row = sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(n) for n in names))
    filtered = sql.SQL("") if where is None else sql.SQL(" WHERE {}").format(where)
    return sql.SQL(
        "SELECT count(*), "
        "sum(('x' || left(md5(convert_to({}::text, 'UTF8')), 16))::bit(64)::bigint) FROM {}{}"
    ).format(row, table.ident, filtered)


def fix_settings(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """``SET LOCAL`` every setting of :data:`FINGERPRINT_SETTINGS` in one round trip.

    For the rest of ``conn``'s current transaction (or savepoint), values print the same text
    on every server, whatever its configuration.
    """
    calls = sql.SQL(", ").join(
        sql.SQL("set_config({}, {}, true)").format(sql.Literal(name), sql.Literal(value))
        for name, value in FINGERPRINT_SETTINGS
    )
    conn.execute(sql.SQL("SELECT {}").format(calls))


def _run(
    conn: psycopg.Connection[tuple[object, ...]], statement: sql.Composed, table: TableName
) -> Fingerprint:
    try:
        row = conn.execute(statement).fetchone()
    except psycopg.Error as exc:
        raise FingerprintError(
            "fingerprint_failed",
            f"Fingerprinting {table} failed: {redact(str(exc)).strip()}",
            ["Check that the table and every compared column exist on this side."],
        ) from None
    assert row is not None
    rows, total = row
    return Fingerprint(rows=_int(rows), digest=digest_of(_int(total)))


def digest_of(total: int) -> str:
    """The digest text of a sum of md5 prefixes (reduced mod 2^64).

    >>> digest_of(0)
    'md5-row-sum-64:0000000000000000'
    >>> digest_of(-1)
    'md5-row-sum-64:ffffffffffffffff'
    """
    return f"{FINGERPRINT_ALGORITHM}:{total % _MOD:016x}"


def _int(value: object) -> int:
    """An aggregate's value as an int (``sum`` of no rows is NULL: zero)."""
    if value is None:
        return 0
    assert isinstance(value, int | Decimal)  # count(*) is bigint, sum(bigint) is numeric
    return int(value)
