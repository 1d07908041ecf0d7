"""The generic sources from Dagster: resources, asset factories, materializations, failures."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from pydantic import BaseModel

from dpone_dagster.dagster.assets import mysql_copy_asset, rest_copy_asset
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.resources import (
    MySQLSourceResource,
    PostgresTargetResource,
    RestSourceResource,
)
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.sources import (
    MySQLRead,
    MySQLSettings,
    PageNumberPagination,
    RestRead,
    SourceCopyOptions,
    SourceError,
)
from tests.helpers import mysql, pg
from tests.helpers.http_api import DROP, ApiServer, Reply, Request


def _mysql_resource(settings: MySQLSettings) -> MySQLSourceResource:
    return MySQLSourceResource(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password,
        database=settings.database,
    )


def test_a_mysql_asset_materializes_into_the_target(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    mysql.execute(
        mysql_db,
        "CREATE TABLE orders (id int PRIMARY KEY, total decimal(10,2) NOT NULL)",
        "INSERT INTO orders VALUES (1, 9.99), (2, 20.00)",
    )
    source = dg.AssetKey(["mysql", "orders"])
    asset = mysql_copy_asset(
        key=["shop", "orders"], table="orders", target_table="raw.orders", source_key=source
    )
    assert [d.asset_key for d in next(iter(asset.specs)).deps] == [source]
    result = dg.materialize(
        [asset],
        resources={
            "mysql": _mysql_resource(mysql_db),
            "target": PostgresTargetResource(dsn=target_dsn),
        },
    )
    assert result.success
    assert pg.fetch_all(target_dsn, "SELECT id, total::text FROM raw.orders ORDER BY id") == [
        (1, "9.99"),
        (2, "20.00"),
    ]
    metadata = result.asset_materializations_for_node("shop__orders")[0].metadata
    assert metadata["dagster/row_count"].value == 2
    assert metadata["dpone/snapshot_label"].value == "no_snapshot_claim"
    assert metadata["dpone/terminal_outcome"].value == "success"
    receipt = metadata["dpone/extraction_receipt"].value
    assert receipt["snapshot_authority"] is None and receipt["source_token"] is None
    assert receipt["clock_authority"] == "dpone.orchestrator.utc" and receipt["row_count"] == 2
    # The standard table set from the target's catalog, and the figures as numbers.
    database = pg.fetch_one(target_dsn, "SELECT current_database()")
    assert metadata["dagster/table_name"].value == f"{database}.raw.orders"
    schema = metadata["dagster/column_schema"]
    assert isinstance(schema, dg.TableSchemaMetadataValue)
    assert [(c.name, c.constraints.nullable) for c in schema.schema.columns] == [
        ("id", False),
        ("total", False),
    ]
    lineage = metadata["dagster/column_lineage"]
    assert isinstance(lineage, dg.TableColumnLineageMetadataValue)
    assert lineage.lineage.deps_by_column["total"] == [
        dg.TableColumnDep(asset_key=source, column_name="total")
    ]
    assert isinstance(metadata["dpone/bytes"], dg.IntMetadataValue)
    assert isinstance(metadata["dpone/rows_per_second"], dg.IntMetadataValue)
    assert isinstance(metadata["dpone/lag_seconds"], dg.FloatMetadataValue)


class Item(BaseModel):
    id: int
    name: str


def _primary_key(dsn: str, table: str) -> list[tuple[Any, ...]]:
    return pg.fetch_all(
        dsn,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY (i.indkey) WHERE i.indisprimary AND i.indrelid = %s::regclass",
        (table,),
    )


def test_the_options_object_reaches_the_load_and_the_old_keyword_still_does(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    """``options=SourceCopyOptions(...)`` is how the rows land: the key of the target the copy
    creates, the merge sink; the deprecated ``schema_changes=`` keyword reaches the load too."""
    mysql.execute(
        mysql_db,
        "CREATE TABLE orders (id int NOT NULL, total decimal(10,2) NOT NULL)",
        "INSERT INTO orders VALUES (1, 9.99), (2, 20.00)",
    )
    options = SourceCopyOptions(sink="merge", primary_key=["id"])
    asset = mysql_copy_asset(
        key="orders", table="orders", target_table="raw.orders", options=options
    )
    resources = {
        "mysql": _mysql_resource(mysql_db),
        "target": PostgresTargetResource(dsn=target_dsn),
    }
    assert dg.materialize([asset], resources=resources).success
    assert _primary_key(target_dsn, "raw.orders") == [("id",)]  # no key in MySQL: the options'
    mysql.execute(mysql_db, "UPDATE orders SET total = 5.00 WHERE id = 2")
    merged = dg.materialize([asset], resources=resources)
    metadata = merged.asset_materializations_for_node("orders")[0].metadata
    assert (metadata["dpone/sink"].value, metadata["dpone/sink_method"].value) == ("merge", "merge")
    assert pg.fetch_all(target_dsn, "SELECT id, total::text FROM raw.orders ORDER BY id") == [
        (1, "9.99"),
        (2, "5.00"),
    ]
    mysql.execute(mysql_db, "ALTER TABLE orders ADD note text")
    with pytest.warns(DeprecationWarning, match=r"mysql_copy_asset\(\.\.\., schema_changes="):
        frozen = mysql_copy_asset(
            key="orders", table="orders", target_table="raw.orders", schema_changes="freeze"
        )
    failed = dg.materialize([frozen], resources=resources, raise_on_error=False)
    failure = failed.failure_data_for_node("orders")
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "schema_change_incompatible"
    assert not pg.fetch_one(
        target_dsn,
        "SELECT count(*) > 0 FROM information_schema.columns "
        "WHERE table_schema = 'raw' AND table_name = 'orders' AND column_name = 'note'",
    )


def test_mysql_assets_with_read_objects_load_a_query_and_chosen_columns(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    """What is read is one object: a query, or some columns of a table in another database;
    each materialization loads exactly those rows and columns."""
    mysql.execute(
        mysql_db,
        "CREATE TABLE orders (id int PRIMARY KEY, total decimal(10,2) NOT NULL, note text)",
        "INSERT INTO orders VALUES (1, 9.99, 'a'), (2, 20.00, 'b'), (3, 30.00, 'c')",
    )
    big = mysql_copy_asset(
        key="big_orders", target_table="raw.big_orders",
        read=MySQLRead(query="SELECT id, total FROM orders WHERE total > 10 ORDER BY id;"),
        options=SourceCopyOptions(sink="merge", primary_key=["id"]),
    )  # fmt: skip
    ids = mysql_copy_asset(
        key="order_ids", target_table="raw.order_ids",
        read=MySQLRead(table="orders", database=mysql_db.database, columns=["note", "id"]),
    )  # fmt: skip
    resources = {
        "mysql": _mysql_resource(mysql_db),
        "target": PostgresTargetResource(dsn=target_dsn),
    }
    result = dg.materialize([big, ids], resources=resources)
    assert result.success
    assert pg.fetch_all(target_dsn, "SELECT id, total::text FROM raw.big_orders ORDER BY id") == [
        (2, "20.00"),
        (3, "30.00"),
    ]
    assert _primary_key(target_dsn, "raw.big_orders") == [("id",)]
    assert pg.fetch_all(target_dsn, "SELECT * FROM raw.order_ids ORDER BY id") == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
    ]
    counts = {
        node: result.asset_materializations_for_node(node)[0].metadata["dagster/row_count"].value
        for node in ("big_orders", "order_ids")
    }
    assert counts == {"big_orders": 2, "order_ids": 3}


def test_a_rest_asset_with_the_options_object_appends_its_rows(target_dsn: str) -> None:
    def respond(request: Request) -> Reply:
        page = int(request.query["page"])
        return Reply({"data": [{"id": page, "name": f"p{page}"}] if page <= 2 else []})

    asset = rest_copy_asset(
        key="items", target_table="raw.items", options=SourceCopyOptions(sink="append"),
        read=RestRead(
            path="/items", model=Item, records_path="data", pagination=PageNumberPagination()
        ),
    )  # fmt: skip
    with ApiServer(respond) as server:
        resources = {
            "rest": RestSourceResource(base_url=server.url),
            "target": PostgresTargetResource(dsn=target_dsn),
        }
        assert dg.materialize([asset], resources=resources).success
        second = dg.materialize([asset], resources=resources)
    metadata = second.asset_materializations_for_node("items")[0].metadata
    assert (metadata["dpone/sink"].value, metadata["dagster/row_count"].value) == ("append", 2)
    assert pg.fetch_all(target_dsn, "SELECT id, name FROM raw.items ORDER BY id") == [
        (1, "p1"),
        (1, "p1"),
        (2, "p2"),
        (2, "p2"),
    ]


def test_a_rest_asset_materializes_and_a_failure_carries_its_code(target_dsn: str) -> None:
    broken = {"on": False}

    def respond(request: Request) -> Reply | object:
        page = int(request.query["page"])
        if broken["on"] and page == 2:
            return DROP
        return Reply({"data": [{"id": page, "name": f"p{page}"}] if page <= 2 else []})

    asset = rest_copy_asset(
        key="items",
        target_table="raw.items",
        read=RestRead(
            path="/items", model=Item, records_path="data", pagination=PageNumberPagination()
        ),
        options=SourceCopyOptions(primary_key=["id"]),
    )
    # The model is known when the definitions load: so is the target's column schema.
    [spec] = asset.specs
    declared = spec.metadata["dagster/column_schema"]
    assert isinstance(declared, dg.TableSchema)
    assert [(c.name, c.type, c.constraints.nullable) for c in declared.columns] == [
        ("id", "bigint", False),
        ("name", "text", False),
    ]
    with ApiServer(respond) as server:
        resources = {
            "rest": RestSourceResource(
                base_url=server.url, bearer_token="t0ken", max_retries=1, backoff_seconds=0.01
            ),
            "target": PostgresTargetResource(dsn=target_dsn),
        }
        assert dg.materialize([asset], resources=resources).success
        assert server.requests[0].headers["Authorization"] == "Bearer t0ken"
        broken["on"] = True
        failed = dg.materialize([asset], resources=resources, raise_on_error=False)
    assert not failed.success
    failure = next(e for e in failed.all_events if e.is_step_failure)
    assert failure.step_failure_data.user_failure_data is not None
    code = failure.step_failure_data.user_failure_data.metadata[ERROR_CODE_KEY]
    assert code.value == "rest_request_failed"
    assert pg.fetch_all(target_dsn, "SELECT * FROM raw.items ORDER BY id") == [(1, "p1"), (2, "p2")]
    assert pg.staging_tables(target_dsn) == []


def test_hand_written_assets_copy_through_the_resources_event_iterators(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    """``mysql.copy_table`` and ``rest.copy_table`` are what the factories are thin over: an
    asset of your own calls them with logic around, and gets the same materialization."""
    mysql.execute(
        mysql_db,
        "CREATE TABLE orders (id int PRIMARY KEY, total decimal(10,2) NOT NULL)",
        "INSERT INTO orders VALUES (1, 9.99), (2, 20.00)",
    )
    upstream = dg.AssetKey(["mysql", "orders"])

    # The context is left unannotated: this module's annotations are strings.
    @dg.asset(key=["shop", "orders"], deps=[upstream])
    def orders(
        context, mysql: MySQLSourceResource, target: PostgresTargetResource
    ) -> Iterator[dg.MaterializeResult[Any]]:
        context.log.info("copying the orders")
        yield from mysql.copy_table(
            context, target=target, target_table="raw.orders", read=MySQLRead(table="orders"),
            options=SourceCopyOptions(sink="merge", primary_key=["id"]),
        )  # fmt: skip

    @dg.asset(key="items")
    def items(
        context, rest: RestSourceResource, target: PostgresTargetResource
    ) -> Iterator[dg.MaterializeResult[Any]]:
        yield from rest.copy_table(
            context, target=target, target_table="raw.items",
            read=RestRead(
                path="/items", model=Item, records_path="data", pagination=PageNumberPagination()
            ),
        )  # fmt: skip

    def respond(request: Request) -> Reply:
        page = int(request.query["page"])
        return Reply({"data": [{"id": page, "name": f"p{page}"}] if page <= 2 else []})

    with ApiServer(respond) as server:
        result = dg.materialize(
            [orders, items],
            resources={
                "mysql": _mysql_resource(mysql_db),
                "rest": RestSourceResource(base_url=server.url),
                "target": PostgresTargetResource(dsn=target_dsn),
            },
        )
    assert result.success
    assert pg.fetch_all(target_dsn, "SELECT id, total::text FROM raw.orders ORDER BY id") == [
        (1, "9.99"),
        (2, "20.00"),
    ]
    assert pg.fetch_all(target_dsn, "SELECT * FROM raw.items ORDER BY id") == [(1, "p1"), (2, "p2")]
    by_node = {
        node: result.asset_materializations_for_node(node)[0].metadata
        for node in ("shop__orders", "items")
    }
    assert by_node["shop__orders"]["dpone/sink"].value == "merge"
    assert by_node["items"]["dagster/row_count"].value == 2
    lineage = by_node["shop__orders"]["dagster/column_lineage"]
    assert isinstance(lineage, dg.TableColumnLineageMetadataValue)
    assert lineage.lineage.deps_by_column["id"] == [
        dg.TableColumnDep(asset_key=upstream, column_name="id")
    ]


def test_bad_definitions_fail_when_they_load() -> None:
    class Odd(BaseModel):
        id: int
        value: int | str

    with pytest.raises(SourceError) as unmappable:
        rest_copy_asset(key="odd", target_table="raw.odd", path="/odd", model=Odd)
    assert unmappable.value.code == "rest_type_unmappable"
    with pytest.raises(DponeError) as bad_name:
        mysql_copy_asset(key="x", table="t", target_table='raw."unterminated')
    assert bad_name.value.code == "identifier_invalid"
    with pytest.raises(DponeError) as bad_sink:
        mysql_copy_asset(key="x", table="t", target_table="raw.t", sink="upsert")  # type: ignore[arg-type]
    assert bad_sink.value.code == "copy_options_invalid"
    with pytest.raises(DponeError) as neither:
        mysql_copy_asset(key="x", target_table="raw.t")
    assert neither.value.code == "mysql_source_invalid"
    with pytest.raises(SourceError) as no_model:
        rest_copy_asset(key="x", target_table="raw.t", path="/items")
    assert no_model.value.code == "rest_source_invalid" and "model" in no_model.value.message


@pytest.mark.parametrize("fault", ["down", "refused"])
def test_a_mysql_source_that_is_down_or_refuses_the_login(
    mysql_db: MySQLSettings, target_dsn: str, fault: str
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = probe.getsockname()[1]
        resource = (
            MySQLSourceResource(host="127.0.0.1", port=port, user="root", database="x")
            if fault == "down"
            else MySQLSourceResource(
                host=mysql_db.host, port=mysql_db.port, user="dpone_no_such_user",
                password="wrong", database=mysql_db.database,
            )
        )  # fmt: skip
        asset = mysql_copy_asset(key="orders", table="orders", target_table="raw.orders")
        result = dg.materialize(
            [asset],
            resources={"mysql": resource, "target": PostgresTargetResource(dsn=target_dsn)},
            raise_on_error=False,
        )
    failure = result.failure_data_for_node("orders")
    assert failure is not None and failure.user_failure_data is not None
    code = failure.user_failure_data.metadata[ERROR_CODE_KEY].value
    assert code == ("source_unreachable" if fault == "down" else "source_login_failed")
    assert not pg.open_transactions(target_dsn)
    assert not pg.table_exists(target_dsn, "raw", "orders")


def test_a_mysql_column_added_between_two_runs_is_listed_in_the_materialization(
    mysql_db: MySQLSettings, target_dsn: str
) -> None:
    mysql.execute(
        mysql_db,
        "CREATE TABLE orders (id int PRIMARY KEY, total decimal(10,2) NOT NULL)",
        "INSERT INTO orders VALUES (1, 9.99), (2, 20.00)",
    )
    asset = mysql_copy_asset(
        key="orders", table="orders", target_table="raw.orders",
        options=SourceCopyOptions(sink="merge", primary_key=["id"]),
    )  # fmt: skip
    resources = {
        "mysql": _mysql_resource(mysql_db),
        "target": PostgresTargetResource(dsn=target_dsn),
    }
    assert dg.materialize([asset], resources=resources).success
    mysql.execute(mysql_db, "ALTER TABLE orders ADD currency char(3) NOT NULL DEFAULT 'EUR'")
    result = dg.materialize([asset], resources=resources)
    metadata = result.asset_materializations_for_node("orders")[0].metadata
    [change] = metadata["dpone/schema_changes"].value  # type: ignore[misc]
    assert (change["column"], change["kind"], change["after"]) == (
        "currency",
        "added",
        "varchar(3)",
    )
    assert change["detail"].startswith("nullable: NOT NULL in the source")
    assert pg.fetch_all(target_dsn, "SELECT id, currency FROM raw.orders ORDER BY id") == [
        (1, "EUR"),
        (2, "EUR"),
    ]
