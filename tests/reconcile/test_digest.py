"""The one reconciliation digest: order-independent, settings-independent, exact on every value."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import table_columns
from dpone_dagster.reconcile import DIGEST_ALGORITHM, Digest
from dpone_dagster.reconcile.digest import digest_query, pin_settings, row_hash, run_digest
from tests.helpers import pg

COLUMNS = ("id", "ts", "span", "ratio", "blob", "note", "stamp")


def _digest(
    conn: psycopg.Connection[tuple[object, ...]],
    table: TableName,
    names: tuple[str, ...] = COLUMNS,
    where: sql.Composable | None = None,
) -> Digest:
    by_name = {c.name: c for c in table_columns(conn, table)}
    row = row_hash(conn, [by_name[n] for n in names])
    return run_digest(conn, *digest_query(table, row, where))


def _in_own_transaction(dsn: str, table: TableName, names: tuple[str, ...] = COLUMNS) -> Digest:
    with psycopg.connect(dsn) as conn:
        pin_settings(conn, local=True)
        return _digest(conn, table, names)


def _settings_table(dsn: str, name: str, order: str) -> TableName:
    """Rows whose text depends on TimeZone, DateStyle, IntervalStyle, extra_float_digits and
    bytea_output (``stamp`` is a domain: hashed through its text), inserted in ``order``."""
    if not pg.fetch_one(dsn, "SELECT count(*) FROM pg_type WHERE typname = 'stamp'"):
        pg.execute(dsn, "CREATE DOMAIN stamp AS timestamptz")
    pg.execute(
        dsn,
        sql.SQL(
            "CREATE TABLE {} (id int, ts timestamptz, span interval, ratio float8, blob bytea, "
            "note text, stamp stamp)"
        ).format(sql.Identifier(name)),
    )
    pg.execute(
        dsn,
        sql.SQL(
            "INSERT INTO {} SELECT g, timestamptz '2024-03-01 12:00+00' + g * interval '1 h', "
            "g * interval '90 min', g / 3.0, decode(md5(g::text), 'hex'), "
            "CASE WHEN g %% 5 = 0 THEN NULL ELSE 'n' || g END, "
            "timestamptz '2024-03-01 12:00+00' + g * interval '1 min' "
            "FROM generate_series(1, 500) g ORDER BY g " + order
        ).format(sql.Identifier(name)),
    )
    return TableName("public", name)


def test_the_digest_ignores_row_order_and_the_sessions_settings(source_dsn: str) -> None:
    ascending = _settings_table(source_dsn, "ascending", "ASC")
    pg.execute(source_dsn, "CREATE TABLE descending AS SELECT * FROM ascending ORDER BY id DESC")
    descending = TableName("public", "descending")
    reference = _in_own_transaction(source_dsn, ascending)
    assert reference.count == 500 and str(reference.hash).startswith(DIGEST_ALGORITHM + ":")
    assert _in_own_transaction(source_dsn, descending) == reference

    settings = (
        "SET TimeZone = 'Asia/Tokyo'; SET DateStyle = 'German'; SET IntervalStyle = "
        "'sql_standard'; SET extra_float_digits = 0; SET bytea_output = 'escape'"
    )
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        probe = "SELECT ROW(ts, span, ratio, blob, stamp)::text FROM ascending WHERE id = 1"
        before = conn.execute(probe).fetchone()
        conn.execute(settings)
        assert conn.execute(probe).fetchone() != before, "the settings change the rows' text"
        with conn.transaction():
            pin_settings(conn, local=True)
            assert _digest(conn, descending) == reference
        # Pinned for the transaction only: the session's own settings are back.
        assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
        assert conn.execute("SHOW DateStyle").fetchone() == ("German, DMY",)


@pytest.mark.parametrize(
    ("type_sql", "one", "other"),
    [
        ("text", "NULL", "''"),
        ("text", "'NULL'", "NULL"),
        ("numeric", "'NaN'", "NULL"),
        ("numeric", "1.50", "1.5"),
        ("float8", "'NaN'", "'Infinity'"),
        ("float8", "'-0'", "'0'"),
        ("timestamptz", "'infinity'", "'-infinity'"),
        ("date", "'-infinity'", "NULL"),
        ("interval", "'1 day'", "'24 hours'"),
        ("text[]", "'{a,NULL}'", "'{a,\"NULL\"}'"),
        ("int[]", "'{{1,2},{3,4}}'", "'{1,2,3,4}'"),
        ("int[]", "'[0:1]={1,2}'", "'{1,2}'"),
        ("json", "'{\"a\": 1}'", "'{\"a\":1}'"),
        ("jsonb", "'{\"a\": 1}'", '\'{"a": "1"}\''),
        ("bytea", "'\\x00'", "''"),
    ],
)
def test_the_digest_tells_apart_values_that_look_alike(
    source_dsn: str, type_sql: str, one: str, other: str
) -> None:
    for name, value in (("one", one), ("other", other)):
        pg.execute(source_dsn, f"CREATE TABLE {name} (id int, v {type_sql})")
        pg.execute(source_dsn, f"INSERT INTO {name} VALUES (1, {value}::{type_sql}), (2, NULL)")
    first = _in_own_transaction(source_dsn, TableName("public", "one"), ("id", "v"))
    second = _in_own_transaction(source_dsn, TableName("public", "other"), ("id", "v"))
    assert first.count == second.count == 2
    assert first.hash != second.hash


def test_a_changed_a_missing_and_an_extra_row_change_the_digest(source_dsn: str) -> None:
    table = _settings_table(source_dsn, "t", "ASC")
    reference = _in_own_transaction(source_dsn, table)
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
        assert _in_own_transaction(source_dsn, table) != reference, change
        pg.execute(source_dsn, undo)
        assert _in_own_transaction(source_dsn, table) == reference, undo


def test_an_empty_filter_and_parts_that_add_up_to_the_whole(source_dsn: str) -> None:
    table = _settings_table(source_dsn, "t", "ASC")
    with psycopg.connect(source_dsn) as conn:
        pin_settings(conn, local=True)
        none = _digest(conn, table, where=sql.SQL("false"))
        low = _digest(conn, table, where=sql.SQL("id <= 250"))
        high = _digest(conn, table, where=sql.SQL("id > 250"))
        whole = _digest(conn, table)
    assert none == Digest(0, f"{DIGEST_ALGORITHM}:0")
    assert low.count == high.count == 250 and low.hash != high.hash
    # The hash is a plain sum (numeric, no wrap): the parts add up to the whole.
    parts = [int(str(d.hash).split(":")[1]) for d in (low, high)]
    assert whole.hash == f"{DIGEST_ALGORITHM}:{parts[0] + parts[1]}"
