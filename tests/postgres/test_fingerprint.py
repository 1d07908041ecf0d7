"""Server-side table fingerprints: order-independent, settings-independent, exact on every value."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.postgres import Fingerprint, FingerprintError, TableName, table_fingerprint
from dpone_dagster.postgres.fingerprint import digest_of
from tests.helpers import pg

COLUMNS = ("id", "ts", "span", "ratio", "blob", "note")


def _fingerprint(dsn: str, table: TableName, columns: tuple[str, ...] = COLUMNS) -> Fingerprint:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return table_fingerprint(conn, table, columns)


def _settings_table(dsn: str, name: str, order: str) -> TableName:
    """Rows whose text depends on TimeZone, DateStyle, IntervalStyle, extra_float_digits and
    bytea_output, inserted in ``order`` (the physical order differs between two tables)."""
    pg.execute(
        dsn,
        sql.SQL(
            "CREATE TABLE {} (id int, ts timestamptz, span interval, ratio float8, blob bytea, "
            "note text)"
        ).format(sql.Identifier(name)),
    )
    pg.execute(
        dsn,
        sql.SQL(
            "INSERT INTO {} SELECT g, timestamptz '2024-03-01 12:00+00' + g * interval '1 h', "
            "g * interval '90 min', g / 3.0, decode(md5(g::text), 'hex'), "
            "CASE WHEN g %% 5 = 0 THEN NULL ELSE 'n' || g END "
            "FROM generate_series(1, 500) g ORDER BY g " + order
        ).format(sql.Identifier(name)),
    )
    return TableName("public", name)


def test_the_fingerprint_ignores_row_order_and_the_sessions_settings(source_dsn: str) -> None:
    ascending = _settings_table(source_dsn, "ascending", "ASC")
    descending = _settings_table(source_dsn, "descending", "DESC")
    reference = _fingerprint(source_dsn, ascending)
    assert reference.rows == 500 and reference.digest.startswith("md5-row-sum-64:")
    assert _fingerprint(source_dsn, descending) == reference

    settings = (
        "SET TimeZone = 'Asia/Tokyo'; SET DateStyle = 'German'; SET IntervalStyle = "
        "'sql_standard'; SET extra_float_digits = 0; SET bytea_output = 'escape'"
    )
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        plain = conn.execute("SELECT ROW(ts, span, ratio, blob)::text FROM ascending WHERE id = 1")
        before = plain.fetchone()
        conn.execute(settings)
        after = conn.execute("SELECT ROW(ts, span, ratio, blob)::text FROM ascending WHERE id = 1")
        assert after.fetchone() != before, "the settings change the rows' text"
        assert table_fingerprint(conn, ascending, COLUMNS) == reference  # its own transaction
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        assert table_fingerprint(conn, descending, COLUMNS) == reference  # the caller's
        # The caller's transaction and settings are left as they were.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
        assert conn.execute("SHOW DateStyle").fetchone() == ("German, DMY",)
        conn.execute("COMMIT")


@pytest.mark.parametrize(
    ("type_sql", "one", "other"),
    [
        ("text", "NULL", "''"),
        ("text", "'NULL'", "NULL"),
        ("numeric", "'NaN'", "NULL"),
        ("float8", "'NaN'", "'Infinity'"),
        ("float8", "'-0'", "'0'"),
        ("timestamptz", "'infinity'", "'-infinity'"),
        ("date", "'-infinity'", "NULL"),
        ("text[]", "'{a,NULL}'", "'{a,\"NULL\"}'"),
        ("int[]", "'{{1,2},{3,4}}'", "'{1,2,3,4}'"),
        ("json", "'{\"a\": 1}'", "'{\"a\":1}'"),
        ("jsonb", "'{\"a\": 1}'", '\'{"a": "1"}\''),
        ("bytea", "'\\x00'", "''"),
    ],
)
def test_the_fingerprint_tells_apart_values_that_look_alike(
    source_dsn: str, type_sql: str, one: str, other: str
) -> None:
    for name, value in (("one", one), ("other", other)):
        pg.execute(source_dsn, f"CREATE TABLE {name} (id int, v {type_sql})")
        pg.execute(source_dsn, f"INSERT INTO {name} VALUES (1, {value}::{type_sql}), (2, NULL)")
    first = _fingerprint(source_dsn, TableName("public", "one"), ("id", "v"))
    second = _fingerprint(source_dsn, TableName("public", "other"), ("id", "v"))
    assert first.rows == second.rows == 2
    assert first.digest != second.digest


def test_a_changed_a_missing_and_an_extra_row_change_the_fingerprint(source_dsn: str) -> None:
    table = _settings_table(source_dsn, "t", "ASC")
    reference = _fingerprint(source_dsn, table)
    pg.execute(source_dsn, "CREATE TABLE saved AS SELECT * FROM t WHERE id = 9")
    changes = [  # (change, undo)
        ("UPDATE t SET note = 'changed' WHERE id = 7", "UPDATE t SET note = 'n7' WHERE id = 7"),
        (
            "UPDATE t SET ratio = ratio + 1e-12 WHERE id = 8",
            "UPDATE t SET ratio = 8 / 3.0 WHERE id = 8",
        ),
        ("DELETE FROM t WHERE id = 9", "INSERT INTO t SELECT * FROM saved"),
        (
            "INSERT INTO t SELECT * FROM t WHERE id = 10",
            "DELETE FROM t WHERE ctid = (SELECT max(ctid) FROM t WHERE id = 10)",
        ),
    ]
    for change, undo in changes:
        pg.execute(source_dsn, change)
        assert _fingerprint(source_dsn, table) != reference, change
        pg.execute(source_dsn, undo)
        assert _fingerprint(source_dsn, table) == reference, undo


def test_an_empty_table_and_a_filter(source_dsn: str) -> None:
    table = _settings_table(source_dsn, "t", "ASC")
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        none = table_fingerprint(conn, table, COLUMNS, where=sql.SQL("false"))
        assert none == Fingerprint(rows=0, digest=digest_of(0))
        low = table_fingerprint(conn, table, COLUMNS, where=sql.SQL("id <= {}").format(250))
        high = table_fingerprint(conn, table, COLUMNS, where=sql.SQL("id > {}").format(250))
    assert low.rows == high.rows == 250 and low.digest != high.digest
    # The digest is a sum: the two parts' digests add up to the whole's (mod 2^64).
    whole = _fingerprint(source_dsn, table)
    sums = [int(f.digest.split(":")[1], 16) for f in (low, high)]
    assert whole.digest == digest_of(sums[0] + sums[1])


def test_sessions_that_cannot_fingerprint_are_refused_and_errors_leave_the_caller_usable(
    source_dsn: str,
) -> None:
    table = _settings_table(source_dsn, "t", "ASC")
    with psycopg.connect(source_dsn) as conn:  # not autocommit, idle: psycopg would BEGIN
        with pytest.raises(FingerprintError) as err:
            table_fingerprint(conn, table, COLUMNS)
        assert err.value.code == "fingerprint_session_invalid"
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with pytest.raises(FingerprintError) as err:
            table_fingerprint(conn, table, ("id", "no such column"))
        assert err.value.code == "fingerprint_failed"
        assert "no such column" in err.value.message and err.value.next_actions
        # Rolled back to its savepoint: the caller's transaction goes on.
        assert table_fingerprint(conn, table, COLUMNS).rows == 500
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(FingerprintError) as err:
            table_fingerprint(conn, table, COLUMNS)
        assert err.value.code == "fingerprint_session_invalid"
        conn.execute("ROLLBACK")
    assert pg.open_transactions(source_dsn) == []
