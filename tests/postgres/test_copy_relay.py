"""The COPY block relay and the catalog reader, against real databases."""

from __future__ import annotations

import psycopg
import pytest

from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import CatalogError, table_catalog, table_columns
from dpone_dagster.postgres.copy import (
    copy_format_for,
    copy_in_statement,
    copy_out_statement,
    relay,
    select_columns,
)
from tests.helpers import pg


def test_a_binary_relay_moves_every_row_unchanged_and_reports_both_command_tags(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=5000)
    pg.create_mixed_table(target_dsn, rows=0)
    table = TableName("public", "mixed")
    with psycopg.connect(source_dsn) as src, psycopg.connect(target_dsn) as dst:
        columns = table_columns(src, table)
        assert copy_format_for(columns) == "binary"
        result = relay(
            src,
            copy_out_statement(select_columns(table, columns)),
            dst,
            copy_in_statement(table, columns),
            hashed=True,
        )
        dst.commit()
    assert (result.rows_out, result.rows_in) == (5000, 5000)
    assert result.bytes > 5000 * 100
    assert result.content_hash is not None and result.content_hash.startswith("sha256:")
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


def test_the_catalog_reads_exact_names_types_keys_and_user_types(source_dsn: str) -> None:
    pg.execute(source_dsn, 'CREATE SCHEMA "Sales Ops"')
    pg.execute(source_dsn, "CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg.execute(
        source_dsn,
        'CREATE TABLE "Sales Ops"."Order Items" ("Id" bigint, "n""q" text DEFAULT \'x\','
        ' m mood[], g int GENERATED ALWAYS AS (1) STORED, s serial, PRIMARY KEY ("Id", s))',
    )
    with psycopg.connect(source_dsn) as conn:
        table = TableName.parse('"Sales Ops"."Order Items"')
        columns = {c.name: c for c in table_columns(conn, table)}
        assert list(columns) == ["Id", 'n"q', "m", "g", "s"]
        assert columns['n"q'].default_sql == "'x'::text"
        assert columns["s"].default_sql is None, "sequence defaults are not constants"
        assert columns["g"].generated
        assert columns["m"].user_type and columns["m"].type_name == "mood"
        assert copy_format_for(list(columns.values())) == "text"
        assert table_catalog(conn, table).key == ("Id", "s")
        with pytest.raises(CatalogError) as err:
            table_columns(conn, TableName("Sales Ops", "order items"))
        assert err.value.code == "table_not_found"


def test_a_server_with_a_non_iso_datestyle_still_copies_and_dates_receipts(
    source_dsn: str, target_dsn: str
) -> None:
    """Databases whose default DateStyle is SQL/DMY: every dpone session still speaks ISO."""
    from dpone_dagster.snapshot_copy import copy_tables

    for dsn in (source_dsn, target_dsn):
        name = pg.fetch_one(dsn, "SELECT current_database()")
        pg.execute(dsn, f"ALTER DATABASE \"{name}\" SET DateStyle = 'SQL, DMY'")
    pg.execute(source_dsn, "CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg.execute(target_dsn, "CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg.execute(source_dsn, "CREATE TABLE d (id int PRIMARY KEY, day date, at timestamptz, m mood)")
    pg.execute(
        source_dsn,
        "INSERT INTO d VALUES (1, '2026-11-29', '2026-11-29 10:00+00', 'ok'),"
        " (2, '2026-01-02', '2026-01-02 03:04:05+00', 'sad')",
    )
    for strategy in ("whole_copy", "stream_rows", "batched_copy"):
        report = copy_tables(source_dsn, target_dsn, ["public.d"], strategy=strategy)  # type: ignore[arg-type]
        receipt = report.tables[0].extraction_receipt
        assert receipt is not None and receipt.extraction_completed_at is not None
        assert pg.fetch_all(target_dsn, "SELECT id, day::text, m::text FROM d ORDER BY id") == [
            (1, "29/11/2026", "ok"),
            (2, "02/01/2026", "sad"),
        ], "the dates arrived as the same dates (printed here in the database's own style)"


def test_options_in_the_dsn_are_kept_beside_dpones_own(source_dsn: str) -> None:
    from psycopg import conninfo

    from dpone_dagster.postgres import ConnectionOptions
    from dpone_dagster.postgres.connection import connect

    dsn = conninfo.make_conninfo(source_dsn, options="-c search_path=elsewhere")
    with connect(dsn, ConnectionOptions(statement_timeout_ms=1234), side="source") as conn:
        settings = conn.execute(
            "SELECT current_setting('search_path'), current_setting('statement_timeout'),"
            " current_setting('DateStyle')"
        ).fetchone()
    assert settings == ("elsewhere", "1234ms", "ISO, MDY")
