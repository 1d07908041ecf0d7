"""Users' own assets around dpone's event iterators (examples/own_asset, in docs/own-assets.md)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.helpers import pg

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_asset" / "definitions.py"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "own-assets.md"


@pytest.fixture
def defs(source_dsn: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=1500)
    pg.create_mixed_table(source_dsn, "events", "page_views", rows=3000)
    monkeypatch.setenv("DPONE_SOURCE_DSN", source_dsn)
    monkeypatch.setenv("DPONE_TARGET_DSN", target_dsn)
    loaded: Any = runpy.run_path(str(EXAMPLE))["defs"]
    return loaded  # type: ignore[no-any-return]


def test_the_docs_show_the_example() -> None:
    assert EXAMPLE.read_text().split('"""', 2)[2].strip() in PAGE.read_text()


def test_a_hand_written_multi_asset_copies_with_its_own_logic(
    defs: dg.Definitions, source_dsn: str, target_dsn: str
) -> None:
    job = dg.define_asset_job("orders", selection=dg.AssetSelection.groups("default"))
    merged = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    result = merged.resolve_job_def("orders").execute_in_process(op_selection=["shop_orders"])
    assert result.success
    [materialization] = result.asset_materializations_for_node("shop_orders")
    metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    assert metadata["team"] == "sales" and metadata["dagster/row_count"] == 1500
    assert metadata["dpone/snapshot_label"] == "single_snapshot"
    [check] = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["dpone/proof"].value == "row_versions"
    assert pg.table_fingerprint(source_dsn, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders"
    )


def test_a_hand_written_partitioned_asset_backfills_through_the_ledger(
    defs: dg.Definitions, source_dsn: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.create_mixed_table(target_dsn, "events", "page_views", rows=0)
    assets = defs.resolve_assets_def(dg.AssetKey(["events", "page_views"]))
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        for key in ("0..1000", "1000..2000", "2000..3000"):
            result = dg.materialize([assets], partition_key=key, instance=instance)
            assert result.success
    assert pg.table_fingerprint(source_dsn, "events", "page_views") == pg.table_fingerprint(
        target_dsn, "events", "page_views"
    )
    batches = pg.fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.backfill_batch_receipts")
    assert batches == 6, "two batches of 500 rows per 1,000-row partition"
