"""Generic sources loaded into PostgreSQL through the staging table, sinks and terminal outcomes."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from dpone_dagster.lifecycle import ReceiptState, TerminalOutcome
from dpone_dagster.postgres import ConnectionOptions, TableName
from dpone_dagster.sources import (
    MySQLRead,
    MySQLSettings,
    MySQLSource,
    PageNumberPagination,
    RestRead,
    RestSettings,
    RestSource,
    SourceCopyOptions,
    SourceError,
    SourceLoadError,
    load_source,
)
from tests.helpers import mysql, pg
from tests.helpers.http_api import DROP, ApiServer, Reply, Request
from tests.helpers.proxy import TcpProxy, is_commit

TARGET = TableName("raw", 'Orders "x"')
FREEZE = SourceCopyOptions(schema_changes="freeze")


def _rows(dsn: str, table: TableName = TARGET) -> list[tuple[Any, ...]]:
    return pg.fetch_all(dsn, pg.sql.SQL("SELECT * FROM {} ORDER BY 1").format(table.ident))


def _orders(settings: MySQLSettings, count: int = 3) -> None:
    mysql.execute(
        settings,
        "CREATE TABLE orders (id bigint unsigned NOT NULL PRIMARY KEY, note varchar(20))",
        f"INSERT INTO orders SELECT seq, CONCAT('n', seq) FROM seq_1_to_{count}",
    )


def test_mysql_replace_append_merge_and_receipts(mysql_db: MySQLSettings, target_dsn: str) -> None:
    _orders(mysql_db)
    source = MySQLSource(mysql_db, MySQLRead(table="orders"))
    report = load_source(source, target_dsn, TARGET, primary_key=["id"])
    assert report.outcome is TerminalOutcome.SUCCESS and report.rows_loaded == 3
    assert _rows(target_dsn) == [(1, "n1"), (2, "n2"), (3, "n3")]
    receipt = report.extraction_receipt
    assert receipt.state is ReceiptState.COMPLETED and receipt.row_count == 3
    assert receipt.snapshot_authority is None and receipt.source_token is None
    assert report.snapshot_label.value == "no_snapshot_claim"
    assert report.terminal_receipt is not None and report.terminal_receipt.source_action == "commit"
    assert mysql.sessions(mysql_db) == []

    mysql.execute(mysql_db, "UPDATE orders SET note = 'changed' WHERE id = 2")
    mysql.execute(mysql_db, "INSERT INTO orders VALUES (4, 'n4')")
    merged = load_source(source, target_dsn, TARGET, sink="merge")
    assert merged.sink_result is not None
    assert (merged.sink_result.rows_inserted, merged.sink_result.rows_updated) == (1, 1)
    assert _rows(target_dsn) == [(1, "n1"), (2, "changed"), (3, "n3"), (4, "n4")]

    mysql.execute(mysql_db, "DELETE FROM orders WHERE id > 1")
    load_source(source, target_dsn, TARGET)  # replace
    assert _rows(target_dsn) == [(1, "n1")]
    plain = TableName("raw", "log")
    for _ in range(2):
        load_source(source, target_dsn, plain, sink="append")
    assert _rows(target_dsn, plain) == [(1, "n1"), (1, "n1")]
    assert pg.staging_tables(target_dsn) == []


def test_mysql_killed_mid_stream_aborts_and_leaves_the_target_unchanged(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    # 20 MB of rows: far more than the socket buffers hold when the proxy cuts at 10,000 rows.
    mysql.execute(
        mysql_db,
        "CREATE TABLE big (id int PRIMARY KEY, pad char(200))",
        "INSERT INTO big SELECT seq, REPEAT('x', 200) FROM seq_1_to_100000",
    )
    load_source(
        MySQLSource(mysql_db, MySQLRead(query="SELECT id, pad FROM big WHERE id < 5")),
        target_dsn,
        TARGET,
    )
    before = pg.table_fingerprint(target_dsn, TARGET.schema, TARGET.name)
    proxy = TcpProxy(mysql_db.host, mysql_db.port)
    routed = dataclasses.replace(mysql_db, host="127.0.0.1", port=proxy.port)
    try:
        with pytest.raises(SourceLoadError) as caught:
            load_source(
                MySQLSource(routed, MySQLRead(table="big")),
                target_dsn,
                TARGET,
                on_progress=lambda _: proxy.cut_all(),
            )
    finally:
        proxy.close()
    report = caught.value.report
    assert caught.value.code == "mysql_read_failed"
    assert report.outcome is TerminalOutcome.ABORT
    assert report.extraction_receipt.extraction_completed_at is None
    assert report.terminal_receipt is not None and report.terminal_receipt.sources_closed
    assert pg.table_fingerprint(target_dsn, TARGET.schema, TARGET.name) == before
    assert pg.staging_tables(target_dsn) == []


def test_an_unmappable_type_touches_nothing(mysql_db: MySQLSettings, target_dsn: str) -> None:
    mysql.execute(mysql_db, "CREATE TABLE shapes (id int, g geometry)")
    with pytest.raises(SourceError) as caught:
        load_source(MySQLSource(mysql_db, MySQLRead(table="shapes")), target_dsn, TARGET)
    assert caught.value.code == "mysql_type_unmappable"
    assert not pg.table_exists(target_dsn, TARGET.schema, TARGET.name)
    assert pg.staging_tables(target_dsn) == []


class Item(BaseModel):
    id: int
    name: str


PAGES = [[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], [{"id": 3, "name": "c"}]]


def _rest(server: ApiServer) -> RestSource:
    settings = RestSettings(server.url, max_retries=1, backoff_seconds=0.01)
    return RestSource(
        settings,
        RestRead(path="/items", model=Item, records_path="data", pagination=PageNumberPagination()),
    )


def test_rest_loads_and_a_server_failing_midway_leaves_the_target_unchanged(
    target_dsn: str,
) -> None:
    fail = {"on": False}

    def respond(request: Request) -> Reply | object:
        page = int(request.query["page"])
        if fail["on"] and page == 2:
            return DROP
        return Reply({"data": PAGES[page - 1] if page <= len(PAGES) else []})

    with ApiServer(respond) as server:
        report = load_source(_rest(server), target_dsn, TARGET, primary_key=["id"])
        assert report.outcome is TerminalOutcome.SUCCESS
        assert report.extraction_receipt.byte_count == sum(len(b) for _, b in server.bodies)
        assert _rows(target_dsn) == [(1, "a"), (2, "b"), (3, "c")]
        fail["on"] = True
        with pytest.raises(SourceLoadError) as caught:
            load_source(_rest(server), target_dsn, TARGET, sink="append")
    assert caught.value.code == "rest_request_failed"
    assert caught.value.report.outcome is TerminalOutcome.ABORT
    assert _rows(target_dsn) == [(1, "a"), (2, "b"), (3, "c")]
    assert pg.staging_tables(target_dsn) == []


def test_rest_invalid_record_aborts_and_names_it(target_dsn: str) -> None:
    pages = [PAGES[0], [{"id": 3, "name": None}], []]

    def respond(request: Request) -> Reply:
        return Reply({"data": pages[int(request.query["page"]) - 1]})

    with ApiServer(respond) as server, pytest.raises(SourceLoadError) as caught:
        load_source(_rest(server), target_dsn, TARGET)
    assert caught.value.code == "rest_record_invalid"
    assert "Page 2, record 0 (id=3)" in caught.value.message
    assert caught.value.report.outcome is TerminalOutcome.ABORT
    assert not pg.table_exists(target_dsn, TARGET.schema, TARGET.name)
    assert pg.staging_tables(target_dsn) == []


def test_a_lost_commit_answer_retains_and_still_rolls_back_the_source(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    _orders(mysql_db)
    proxy = TcpProxy.to(target_dsn)
    try:
        # Forward the COMMIT (not the BEGIN ... READ COMMITTED), then drop its answer.
        proxy.cut_after_client_message(is_commit)
        with pytest.raises(SourceLoadError) as caught:
            load_source(
                MySQLSource(mysql_db, MySQLRead(table="orders")), proxy.dsn(target_dsn), TARGET
            )
    finally:
        proxy.close()
    report = caught.value.report
    assert caught.value.code == "target_commit_unknown"
    assert report.outcome is TerminalOutcome.RETAIN_COMMIT_UNKNOWN
    assert report.extraction_receipt.state is ReceiptState.COMPLETED
    terminal = report.terminal_receipt
    assert terminal is not None and terminal.source_action == "rollback"
    assert terminal.sources_closed
    assert mysql.sessions(mysql_db) == []
    assert _rows(target_dsn) == [(1, "n1"), (2, "n2"), (3, "n3")]  # the commit did happen


def test_a_target_without_the_columns_is_refused_before_any_row_is_read(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    _orders(mysql_db)
    pg.execute(target_dsn, 'CREATE SCHEMA raw; CREATE TABLE raw."Orders ""x""" (id numeric(20))')
    with pytest.raises(SourceLoadError) as caught:
        load_source(
            MySQLSource(mysql_db, MySQLRead(table="orders")), target_dsn, TARGET, options=FREEZE
        )
    assert caught.value.code == "schema_change_incompatible"
    assert "added 'note' varchar(" in caught.value.message and "mysql://" in caught.value.message
    receipt = caught.value.report.extraction_receipt
    assert receipt.state is ReceiptState.PENDING  # the source was never read


def test_load_source_takes_its_old_keywords_for_one_release_with_a_warning(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    """``schema_changes=`` still reaches the load, and the session's options passed as
    ``options=`` (their name before ``connection_options=``) still open the target session."""
    _orders(mysql_db)
    source = MySQLSource(mysql_db, MySQLRead(table="orders"))
    moved = r"load_source\(\.\.\., options=ConnectionOptions\(\.\.\.\)\) is deprecated"
    with pytest.warns(DeprecationWarning, match=moved):
        report = load_source(
            source, target_dsn, TARGET, primary_key=["id"],
            options=ConnectionOptions(application_name="dpone-old-options"),  # type: ignore[arg-type]
        )  # fmt: skip
    assert report.outcome is TerminalOutcome.SUCCESS and report.rows_loaded == 3
    mysql.execute(mysql_db, "ALTER TABLE orders ADD qty int")
    with (
        pytest.warns(DeprecationWarning, match=r"pass options=SourceCopyOptions\(schema_changes="),
        pytest.raises(SourceLoadError) as caught,
    ):
        load_source(source, target_dsn, TARGET, schema_changes="freeze")
    assert caught.value.code == "schema_change_incompatible"
    with pytest.raises(TypeError, match="unexpected keyword argument 'schema_change'"):
        load_source(source, target_dsn, TARGET, schema_change="freeze")
    assert _rows(target_dsn) == [(1, "n1"), (2, "n2"), (3, "n3")]


def test_mysql_an_added_column_and_a_widened_type_evolve_the_target_with_the_data(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    _orders(mysql_db)
    load_source(
        MySQLSource(mysql_db, MySQLRead(table="orders")), target_dsn, TARGET, primary_key=["id"]
    )
    # varchar(20) from MySQL against the target's character varying(20): no change at all.
    same = load_source(
        MySQLSource(mysql_db, MySQLRead(table="orders")), target_dsn, TARGET, options=FREEZE
    )
    assert same.outcome is TerminalOutcome.SUCCESS and same.schema_changes == ()
    mysql.execute(
        mysql_db,
        "ALTER TABLE orders MODIFY note varchar(200), ADD qty int NOT NULL DEFAULT 5",
        "UPDATE orders SET qty = id * 10, note = REPEAT('x', 100) WHERE id = 2",
    )
    report = load_source(
        MySQLSource(mysql_db, MySQLRead(table="orders")), target_dsn, TARGET, sink="merge"
    )
    changes = {c.column: (c.kind, c.before, c.after) for c in report.schema_changes}
    assert changes == {
        "note": ("widened", "character varying(20)", "varchar(200)"),
        "qty": ("added", None, "integer"),
    }
    assert _rows(target_dsn) == [(1, "n1", 5), (2, "x" * 100, 20), (3, "n3", 5)]


class PricedItem(BaseModel):
    id: int
    name: str
    price: Decimal | None = None


def test_rest_a_field_added_to_the_model_adds_a_column_with_the_data(target_dsn: str) -> None:
    priced = [[{"id": 1, "name": "a", "price": "1.50"}, {"id": 4, "name": "d"}], []]

    def respond(request: Request) -> Reply:
        return Reply(
            {
                "data": PAGES[int(request.query["page"]) - 1]
                if int(request.query["page"]) <= len(PAGES)
                else []
            }
        )

    with ApiServer(respond) as server:
        load_source(_rest(server), target_dsn, TARGET, primary_key=["id"])
    with ApiServer(lambda r: Reply({"data": priced[int(r.query["page"]) - 1]})) as server:
        settings = RestSettings(server.url, max_retries=1, backoff_seconds=0.01)
        source = RestSource(
            settings,
            RestRead(
                path="/items",
                model=PricedItem,
                records_path="data",
                pagination=PageNumberPagination(),
            ),
        )
        report = load_source(source, target_dsn, TARGET, sink="merge")
    [change] = report.schema_changes
    assert (change.kind, change.column, change.after) == ("added", "price", "numeric")
    assert _rows(target_dsn) == [
        (1, "a", Decimal("1.50")), (2, "b", None), (3, "c", None), (4, "d", None),
    ]  # fmt: skip
