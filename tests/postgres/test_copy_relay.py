"""The COPY block relay and the catalog reader, against real databases."""

from __future__ import annotations

import psycopg
import pytest

from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import CatalogError, primary_key, table_columns
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
            src.cursor(),
            copy_out_statement(select_columns(table, columns)),
            dst.cursor(),
            copy_in_statement(table, columns),
        )
        dst.commit()
    assert (result.rows_out, result.rows_in) == (5000, 5000)
    assert result.bytes > 5000 * 100
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
        assert primary_key(conn, table) == ["Id", "s"]
        with pytest.raises(CatalogError) as err:
            table_columns(conn, TableName("Sales Ops", "order items"))
        assert err.value.code == "table_not_found"
