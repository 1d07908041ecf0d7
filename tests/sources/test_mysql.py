"""The MySQL/MariaDB adapter against the real MariaDB server and a real PostgreSQL target."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from dpone_dagster.lifecycle import ORCHESTRATOR_UTC, ReceiptState, TerminalOutcome
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import MySQLRead, MySQLSettings, MySQLSource, SourceError, stage_rows
from tests.helpers import mysql
from tests.helpers.pg import staging_tables
from tests.helpers.proxy import TcpProxy
from tests.helpers.staged import stage_and_read

ALL_TYPES = """
CREATE TABLE all_types (
    id int NOT NULL PRIMARY KEY,
    ti tinyint, tiu tinyint unsigned, si smallint unsigned, mi mediumint unsigned,
    i int unsigned, bi bigint, biu bigint unsigned,
    dec_signed decimal(14,2), dec_wide decimal(30,10) unsigned,
    f float, d double,
    b1 bit(1), b5 bit(5), yr year,
    dt date, dtm datetime(6), ts timestamp(3) NULL, tm time(2),
    c char(3), vc varchar(40), tx text, lt longtext,
    bn binary(3), vb varbinary(10), bl blob,
    js json, en enum('small','large'), st set('a','b','c'), u uuid
)
"""

ROW = (
    1, -128, 255, 65535, 16777215, 4294967295, -9223372036854775808, 18446744073709551615,
    "-123456789012.34", "12345678901234567890.0123456789",
    1.5, 2.718281828459045,
    1, 21, 2155,
    "1000-01-01", "9999-12-31 23:59:59.999999", "2038-01-19 03:14:07.123", "-838:59:59.99",
    "ab", "héllo wörld ✓", "multi\nline\ttext \\ with 'quotes'", "x" * 70000,
    b"\x00\x01\x02", b"\xff\x00\\N", b"\x00" * 10 + b"blob",
    '{"k": [1, 2.5, "three"], "nested": {"n": null}}', "large", "a,c",
    "123e4567-e89b-12d3-a456-426614174000",
)  # fmt: skip


def _fill(settings: MySQLSettings) -> None:
    placeholders = ", ".join(["%s"] * len(ROW))
    mysql.execute(
        settings,
        ALL_TYPES,
        f"INSERT INTO all_types VALUES ({placeholders})",
        args=ROW,
    )
    mysql.execute(settings, "INSERT INTO all_types (id) VALUES (2)")


def test_types_map_faithfully_and_values_round_trip(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    _fill(mysql_db)
    result, staged, rows, types = stage_and_read(
        MySQLSource(mysql_db, MySQLRead(table="all_types")),
        target_dsn,
        TableName("public", "all_types"),
    )
    assert types == {
        "id": "integer", "ti": "smallint", "tiu": "smallint", "si": "integer", "mi": "integer",
        "i": "bigint", "bi": "bigint", "biu": "numeric(20,0)",
        "dec_signed": "numeric(14,2)", "dec_wide": "numeric(30,10)",
        "f": "real", "d": "double precision",
        "b1": "boolean", "b5": "bit(5)", "yr": "smallint",
        "dt": "date", "dtm": "timestamp(6) without time zone",
        "ts": "timestamp(3) with time zone", "tm": "interval",
        "c": "character varying(3)", "vc": "character varying(40)", "tx": "text", "lt": "text",
        "bn": "bytea", "vb": "bytea", "bl": "bytea",
        "js": "jsonb", "en": "text", "st": "text", "u": "uuid",
    }  # fmt: skip
    full, empty = rows
    assert full[:8] == (1, -128, 255, 65535, 16777215, 4294967295, -(2**63), 2**64 - 1)
    assert full[8] == Decimal("-123456789012.34")
    assert full[9] == Decimal("12345678901234567890.0123456789")
    assert full[10:12] == (1.5, 2.718281828459045)
    assert full[12:15] == (True, "10101", 2155)
    assert full[15] == date(1000, 1, 1)
    assert full[16] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert full[17] == datetime(2038, 1, 19, 3, 14, 7, 123000, tzinfo=UTC)
    assert full[18] == -timedelta(hours=838, minutes=59, seconds=59, microseconds=990000)
    assert full[19:23] == ROW[19:23]
    assert [bytes(v) for v in full[23:26]] == [b"\x00\x01\x02", b"\xff\x00\\N", ROW[25]]
    assert full[26] == {"k": [1, 2.5, "three"], "nested": {"n": None}}
    assert full[27:29] == ("large", "a,c")
    assert str(full[29]) == ROW[29]
    assert empty[0] == 2 and all(v is None for v in empty[1:])
    receipt = result.extraction_receipt
    assert receipt.state is ReceiptState.COMPLETED and receipt.row_count == 2 == staged.copied


def test_a_query_maps_its_result_metadata(mysql_db: MySQLSettings, target_dsn: str) -> None:
    _fill(mysql_db)
    source = MySQLSource(
        mysql_db,
        MySQLRead(
            query="SELECT id, biu, dec_wide, dec_signed * 2 AS doubled, dtm, vb, "
            "CONCAT(vc, '!') AS shout FROM all_types WHERE id = 1;"
        ),
    )
    assert [(c.name, c.pg_type) for c in source.describe()] == [
        ("id", "integer"),
        ("biu", "numeric(20,0)"),
        ("dec_wide", "numeric(30,10)"),
        ("doubled", "numeric(15,2)"),  # the server widens decimal(14,2) * 2
        ("dtm", "timestamp(6)"),
        ("vb", "bytea"),
        ("shout", "text"),
    ]
    _, _, rows, _ = stage_and_read(source, target_dsn, TableName("public", "q"))
    assert rows == [
        (1, 2**64 - 1, Decimal("12345678901234567890.0123456789"), Decimal("-246913578024.68"),
         datetime(9999, 12, 31, 23, 59, 59, 999999), b"\xff\x00\\N", "héllo wörld ✓!"),
    ]  # fmt: skip


def test_an_unmappable_type_fails_before_any_row_moves(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    mysql.execute(
        mysql_db,
        "CREATE TABLE places (id int, spot point)",
        "INSERT INTO places VALUES (1, POINT(1, 2))",
    )
    with pytest.raises(SourceError) as caught:
        MySQLSource(mysql_db, MySQLRead(table="places")).extract()
    assert caught.value.code == "mysql_type_unmappable"
    assert "'spot'" in caught.value.message and "point" in caught.value.message
    # The error comes from extract(): no artifact, no read, no staging table.
    assert staging_tables(target_dsn) == []
    assert mysql.sessions(mysql_db) == []
    # Leaving the column out copies the rest.
    _, _, rows, _ = stage_and_read(
        MySQLSource(mysql_db, MySQLRead(table="places", columns=["id"])),
        target_dsn,
        TableName("public", "places"),
    )
    assert rows == [(1,)]


def test_completion_only_after_exhaustion_and_never_a_snapshot_claim(
    mysql_db: MySQLSettings,
) -> None:
    mysql.execute(mysql_db, "CREATE TABLE t (id int)", "INSERT INTO t SELECT seq FROM seq_1_to_3")
    result = MySQLSource(mysql_db, MySQLRead(table="t")).extract()
    artifact = result.artifact
    assert result.extraction_receipt.state is ReceiptState.PENDING
    assert mysql.sessions(mysql_db) == []  # nothing was opened by extract()
    rows = artifact.rows()
    seen = [next(rows), next(rows), next(rows)]
    mid = result.extraction_receipt
    assert mid.state is ReceiptState.ACQUIRED and mid.extraction_completed_at is None
    assert mid.row_count is None
    assert [r[0] for r in seen] == [1, 2, 3]
    assert list(rows) == []  # exhaustion
    done = result.extraction_receipt
    assert done.state is ReceiptState.COMPLETED and done.row_count == 3
    assert done.extraction_started_at == mid.extraction_started_at
    for receipt in (mid, done):
        assert receipt.clock_authority == ORCHESTRATOR_UTC
        assert receipt.snapshot_authority is None and receipt.snapshot_acquired_at is None
        assert receipt.source_token is None
    assert len(mysql.sessions(mysql_db)) == 1  # the read-only transaction waits for the outcome
    terminal = artifact.success()
    assert terminal.source_action == "commit" and terminal.sources_closed
    assert mysql.sessions(mysql_db) == []


def test_abort_mid_stream_rolls_back_and_closes_without_draining(mysql_db: MySQLSettings) -> None:
    mysql.execute(
        mysql_db,
        "CREATE TABLE big (id int, pad char(200))",
        "INSERT INTO big SELECT seq, REPEAT('x', 200) FROM seq_1_to_200000",
    )
    result = MySQLSource(mysql_db, MySQLRead(table="big")).extract()
    rows = result.artifact.rows()
    assert next(rows)[0] == 1
    terminal = result.artifact.abort()
    assert terminal.outcome is TerminalOutcome.ABORT
    assert terminal.source_action == "rollback" and terminal.sources_closed
    assert terminal.cleanup_succeeded
    assert result.extraction_receipt.state is ReceiptState.ACQUIRED  # never completed
    assert mysql.sessions(mysql_db) == []
    assert result.artifact.abort() is terminal  # the first decision wins
    assert result.artifact.success() is terminal


def test_a_killed_connection_mid_stream_aborts_and_drops_staging(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    mysql.execute(
        mysql_db,
        "CREATE TABLE big (id int, pad char(200))",
        "INSERT INTO big SELECT seq, REPEAT('x', 200) FROM seq_1_to_100000",
    )
    proxy = TcpProxy(mysql_db.host, mysql_db.port)
    routed = dataclasses.replace(mysql_db, host="127.0.0.1", port=proxy.port)
    result = MySQLSource(routed, MySQLRead(table="big")).extract()
    try:
        with psycopg.connect(target_dsn) as conn, pytest.raises(SourceError) as caught:
            stage_rows(
                conn,
                TableName("public", "big"),
                result.artifact,
                dsn=target_dsn,
                on_progress=lambda _: proxy.cut_all(),
            )
    finally:
        terminal = result.artifact.abort()
        proxy.close()
    assert caught.value.code == "mysql_read_failed"
    assert result.extraction_receipt.state is ReceiptState.ACQUIRED
    assert result.extraction_receipt.extraction_completed_at is None
    assert terminal.outcome is TerminalOutcome.ABORT and terminal.sources_closed
    assert staging_tables(target_dsn) == []


def test_hostile_names_are_quoted_on_both_sides(mysql_db: MySQLSettings, target_dsn: str) -> None:
    db = "we`ird db; --"
    table = 'Tab`le "x"; DROP TABLE t; --'
    column = "co`l 'y' \"z\""
    mysql.execute(mysql_db, f"CREATE DATABASE {mysql.quote_mysql_identifier(db)}")
    try:
        q = mysql.quote_mysql_identifier
        mysql.execute(
            mysql_db,
            f"CREATE TABLE {q(db)}.{q(table)} (id int, {q(column)} varchar(10))",
            f"INSERT INTO {q(db)}.{q(table)} VALUES (1, 'ok')",
        )
        source = MySQLSource(mysql_db, MySQLRead(table=table, database=db))
        _, _, rows, types = stage_and_read(source, target_dsn, TableName("public", table))
    finally:
        mysql.execute(mysql_db, f"DROP DATABASE {mysql.quote_mysql_identifier(db)}")
    assert rows == [(1, "ok")]
    assert set(types) == {"id", column}


def test_a_zero_date_stops_the_load_with_a_clear_code(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    mysql.execute(
        mysql_db,
        "SET SESSION sql_mode = ''",
        "CREATE TABLE z (id int, d date)",
        "INSERT INTO z VALUES (1, '2020-01-01'), (2, '0000-00-00')",
    )
    result = MySQLSource(mysql_db, MySQLRead(table="z")).extract()
    with psycopg.connect(target_dsn) as conn, pytest.raises(SourceError) as caught:
        stage_rows(conn, TableName("public", "z"), result.artifact, dsn=target_dsn)
    result.artifact.abort()
    assert caught.value.code == "mysql_value_unmappable" and "'d'" in caught.value.message
    assert staging_tables(target_dsn) == []
