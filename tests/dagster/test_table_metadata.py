"""Dagster's standard table metadata and plottable figures on every dpone materialization.

Each materialization carries ``dagster/table_name``, ``dagster/column_schema`` (from the
target's catalog) and ``dagster/column_lineage`` (to the source table's external asset), and
its figures as numbers; the source tables are external assets upstream of their copies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dpone_dagster import incremental_asset, source_asset_specs
from dpone_dagster.dagster.assets import backfill_asset, snapshot_copy_assets
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.translator import DponeTranslator
from tests.helpers import pg
from tests.incremental.conftest import ORDERS as ORDERS_TABLE
from tests.incremental.conftest import insert_orders

ROOT = Path(__file__).resolve().parents[2]
ORDERS = dg.AssetKey(["shop", "orders"])
SOURCE_ORDERS = dg.AssetKey(["source", "shop", "orders"])
# Figures the UI plots run over run: each must be a number, never text.
COPY_INTS = ["dagster/row_count", "dpone/rows_loaded", "dpone/bytes", "dpone/rows_per_second"]
COPY_FLOATS = [
    "dpone/extraction_seconds",
    "dpone/lag_seconds",
    "dpone/seconds_plan",
    "dpone/seconds_extract",
    "dpone/seconds_load",
]


def resources(source_dsn: str, target_dsn: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }


@pytest.fixture
def orders(source_dsn: str) -> str:
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=600)
    return source_dsn


def assert_standard_table_set(metadata: dict[str, Any], target_dsn: str, source_key: Any) -> None:
    """Table name, column schema from the target's catalog, and lineage to ``source_key``."""
    database = pg.fetch_one(target_dsn, "SELECT current_database()")
    assert metadata["dagster/table_name"] == dg.MetadataValue.text(f"{database}.shop.orders")
    schema = metadata["dagster/column_schema"]
    assert isinstance(schema, dg.TableSchemaMetadataValue)
    columns = {c.name: c for c in schema.schema.columns}
    catalog = pg.fetch_all(
        target_dsn,
        "SELECT attname, format_type(atttypid, atttypmod), NOT attnotnull FROM pg_attribute "
        "WHERE attrelid = 'shop.orders'::regclass AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
    )
    assert [(c.name, c.type, c.constraints.nullable) for c in schema.schema.columns] == [
        tuple(row) for row in catalog
    ]
    key = columns["id"].constraints
    assert key.unique and "PRIMARY KEY (id)" in key.other
    assert not columns["label"].constraints.unique
    assert "DEFAULT 0" in columns["qty"].constraints.other
    lineage = metadata["dagster/column_lineage"]
    assert isinstance(lineage, dg.TableColumnLineageMetadataValue)
    deps = lineage.lineage.deps_by_column
    assert set(deps) == set(columns)
    assert deps["amount"] == [dg.TableColumnDep(asset_key=source_key, column_name="amount")]


def test_a_snapshot_copy_reports_schema_lineage_and_numbers(orders: str, target_dsn: str) -> None:
    # The schema is the target's: constraints only the target has show in it.
    pg.create_mixed_table(target_dsn, "shop", "orders", rows=0)
    pg.execute(
        target_dsn,
        "ALTER TABLE shop.orders ADD CONSTRAINT qty_positive CHECK (qty >= 0), "
        "ADD CONSTRAINT code_per_id UNIQUE (code, id)",
    )
    shop = snapshot_copy_assets(["shop.orders"], sink="append")
    result = dg.materialize([shop], resources=resources(orders, target_dsn))
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = dict(event.materialization.metadata)
    assert_standard_table_set(metadata, target_dsn, SOURCE_ORDERS)
    schema = metadata["dagster/column_schema"].schema
    columns = {c.name: c for c in schema.columns}
    assert "CHECK ((qty >= 0))" in columns["qty"].constraints.other
    assert schema.constraints.other == ["UNIQUE (code, id)"]
    for key in COPY_INTS:
        assert isinstance(metadata[key], dg.IntMetadataValue), key
    for key in COPY_FLOATS:
        assert isinstance(metadata[key], dg.FloatMetadataValue), key
    assert metadata["dpone/bytes"].value > 600 * 100
    assert metadata["dpone/rows_per_second"].value > 0
    assert isinstance(metadata["dpone/extraction_receipt"], dg.JsonMetadataValue)


def test_a_backfill_partition_reports_schema_lineage_and_numbers(
    orders: str, target_dsn: str
) -> None:
    parts = cursor_range_partitions(0, 600, 300)
    asset = backfill_asset("shop.orders", cursor="id", partitions_def=parts, batch_size=100)
    result = dg.materialize(
        [asset], resources=resources(orders, target_dsn), partition_key="0..300"
    )
    assert result.success
    [event] = result.get_asset_materialization_events()
    assert event.partition == "0..300"
    metadata = dict(event.materialization.metadata)
    assert_standard_table_set(metadata, target_dsn, SOURCE_ORDERS)
    for key in (
        "dagster/row_count", "dpone/bytes", "dpone/remaining_estimate", "dpone/batches",
        "dpone/rows_per_second",
    ):  # fmt: skip
        assert isinstance(metadata[key], dg.IntMetadataValue), key
    for key in ("dpone/extraction_seconds", "dpone/lag_seconds"):
        assert isinstance(metadata[key], dg.FloatMetadataValue), key
    assert metadata["dagster/row_count"].value == 300
    assert metadata["dpone/batches"].value == 3
    assert metadata["dpone/remaining_estimate"].value == 0
    assert isinstance(metadata["dpone/receipts_summary"], dg.JsonMetadataValue)
    observations = [
        e.asset_observation_data.asset_observation
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    ]
    assert observations, "every committed batch is observed"
    for observation in observations:
        remaining = observation.metadata["dpone/progress_remaining"]
        assert isinstance(remaining, dg.IntMetadataValue)


def test_an_incremental_run_reports_schema_and_lineage_without_its_soft_delete_marker(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ORDERS_TABLE)
    insert_orders(source_dsn, 1, 300)
    orders = incremental_asset("shop.orders", cursor="updated_at", deletes="soft")
    result = dg.materialize([orders], resources=resources(source_dsn, target_dsn))
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = dict(event.materialization.metadata)
    database = pg.fetch_one(target_dsn, "SELECT current_database()")
    assert metadata["dagster/table_name"] == dg.MetadataValue.text(f"{database}.shop.orders")
    schema = metadata["dagster/column_schema"].schema
    names = [c.name for c in schema.columns]
    assert names == ["id", "updated_at", "note", "amount", "_dpone_deleted_at"]
    lineage = metadata["dagster/column_lineage"].lineage.deps_by_column
    # The soft-delete marker is the target's own: no source column feeds it.
    assert set(lineage) == {"id", "updated_at", "note", "amount"}
    assert lineage["note"] == [dg.TableColumnDep(asset_key=SOURCE_ORDERS, column_name="note")]
    assert isinstance(metadata["dpone/lag_seconds"], dg.FloatMetadataValue)
    assert isinstance(metadata["dagster/row_count"], dg.IntMetadataValue)


DEFINITIONS = """
import os

import dagster as dg

from dpone_dagster import PostgresSourceResource, PostgresTargetResource, snapshot_copy_assets
from dpone_dagster import incremental_asset, source_asset_specs

shop = snapshot_copy_assets(["shop.orders"])
defs = dg.Definitions(
    assets=[shop, *source_asset_specs([shop])],
    resources={
        "source": PostgresSourceResource(dsn=dg.EnvVar("DPONE_SOURCE_DSN")),
        "target": PostgresTargetResource(dsn=dg.EnvVar("DPONE_TARGET_DSN")),
    },
)
"""


def test_the_cli_materialization_stores_the_typed_metadata(
    orders: str, target_dsn: str, tmp_path: Path
) -> None:
    (tmp_path / "defs.py").write_text(DEFINITIONS)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DPONE_SOURCE_DSN": orders,
        "DPONE_TARGET_DSN": target_dsn,
        "PYTHONPATH": str(ROOT),
    }
    dagster = Path(sys.executable).parent / "dagster"
    done = subprocess.run(
        [str(dagster), "asset", "materialize", "-f", str(tmp_path / "defs.py"),
         "--select", "shop/orders"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(ORDERS, limit=1).records
        assert len(records) == 1
        materialization = records[0].asset_materialization
        assert materialization is not None
        metadata = dict(materialization.metadata)
    assert_standard_table_set(metadata, target_dsn, SOURCE_ORDERS)
    for key in COPY_INTS:
        assert isinstance(metadata[key], dg.IntMetadataValue), key
    for key in COPY_FLOATS:
        assert isinstance(metadata[key], dg.FloatMetadataValue), key


def test_source_tables_are_external_assets_upstream_of_their_copies() -> None:
    shop = snapshot_copy_assets(["shop.orders", 'shop."Order Items"'])
    views = backfill_asset(
        "events.page_views", cursor="id", partitions_def=cursor_range_partitions(0, 10, 5)
    )
    unused = "postgresql://nobody@127.0.0.1:5432/never_connected"
    defs = dg.Definitions(
        assets=[shop, views, *source_asset_specs([shop, views])],
        resources=resources(unused, unused),
    )
    graph = defs.resolve_asset_graph()
    sources = {
        SOURCE_ORDERS,
        dg.AssetKey(["source", "shop", "Order_Items_dbc868c6"]),
        dg.AssetKey(["source", "events", "page_views"]),
    }
    for key in sources:
        node = graph.get(key)
        assert not node.is_materializable, key
        assert node.kinds == {"postgres"}
    assert graph.get(ORDERS).parent_keys == {SOURCE_ORDERS}
    assert graph.get(dg.AssetKey(["events", "page_views"])).parent_keys == {
        dg.AssetKey(["source", "events", "page_views"])
    }
    repository = defs.get_repository_def()
    assert sources <= set(repository.asset_graph.get_all_asset_keys())


def test_source_assets_follow_the_translator_and_can_be_switched_off() -> None:
    class Existing(DponeTranslator):
        def get_source_asset_key(self, spec: Any) -> dg.AssetKey:
            return dg.AssetKey(["warehouse", spec.source_table.name])

    mine = Existing()
    shop = snapshot_copy_assets(["shop.orders"], translator=mine)
    [spec] = source_asset_specs([shop], translator=mine)
    assert spec.key == dg.AssetKey(["warehouse", "orders"])
    assert [d.asset_key for d in next(iter(shop.specs)).deps] == [spec.key]
    off = DponeTranslator(source_assets=False)
    roots = snapshot_copy_assets(["shop.orders"], translator=off)
    assert [d.asset_key for d in next(iter(roots.specs)).deps] == []
    assert source_asset_specs([roots], translator=off) == []
