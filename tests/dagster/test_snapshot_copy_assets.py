"""snapshot_copy_assets materialized through Dagster, asserting on the target and the metadata."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import dagster as dg
import pytest

from dpone_dagster.dagster.assets.snapshot_copy import snapshot_copy_assets
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.resources import PostgresSourceResource, PostgresTargetResource
from dpone_dagster.dagster.translator import CopyTableSpec, key_part
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.snapshot_copy import SnapshotCopyOptions
from tests.helpers import pg
from tests.postgres.test_target_extensions import NOTES
from tests.postgres.test_target_types import ORDERS, TYPES

APP = "dpone-test-assets"


def resources(source_dsn: str, target_dsn: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn, application_name=APP),
        "target": PostgresTargetResource(dsn=target_dsn, application_name=APP),
    }


def metadata_by_key(result: dg.ExecuteInProcessResult) -> dict[dg.AssetKey, dict[str, Any]]:
    return {
        m.asset_key: {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        for m in result.get_asset_materialization_events()
        for m in [m.materialization]
    }


@pytest.fixture
def shop(source_dsn: str) -> str:
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=2000)
    pg.create_mixed_table(source_dsn, "shop", "Order Items", rows=700)
    return source_dsn


@pytest.mark.parametrize(
    "strategy", ["whole_copy", "stream_rows", "batched_copy", "partitioned_copy", "internal_query"]
)
def test_every_strategy_copies_all_tables_under_one_snapshot(
    shop: str, target_dsn: str, strategy: str
) -> None:
    internal = strategy == "internal_query"
    target = shop if internal else target_dsn
    tables = [
        CopyTableSpec(source="shop.orders", target="copy.orders" if internal else None),
        CopyTableSpec(
            source='shop."Order Items"', target='copy."Order Items"' if internal else None
        ),
    ]
    options = SnapshotCopyOptions(strategy=strategy, workers=2)  # type: ignore[arg-type]
    assets = snapshot_copy_assets(tables, options=options)
    result = dg.materialize([assets], resources=resources(shop, target))
    assert result.success
    md = metadata_by_key(result)
    schema = "copy" if internal else "shop"
    assert set(md) == {
        dg.AssetKey([schema, "orders"]),
        dg.AssetKey([schema, key_part("Order Items")]),
    }
    for name, rows in (("orders", 2000), ("Order Items", 700)):
        assert pg.table_fingerprint(shop, "shop", name) == pg.table_fingerprint(
            target, schema, name
        )
        table_md = md[dg.AssetKey([schema, key_part(name)])]
        assert table_md["dagster/row_count"] == rows
        assert table_md["dpone/terminal_outcome"] == "success"
        assert table_md["dpone/extraction_started_at"] <= table_md["dpone/extraction_completed_at"]
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 2 and all(c.passed for c in checks)
    assert {c.metadata["dpone/guarantee"].value for c in checks} == {"equal"}
    for check in checks:  # the point in time proved: the held snapshot's, before any read
        proved = check.metadata["dpone/proved_at"]
        assert isinstance(proved, dg.TimestampMetadataValue)
        started = md[check.asset_key]["dpone/extraction_started_at"]
        assert proved.value <= datetime.fromisoformat(str(started)).timestamp()
    labels = {m["dpone/snapshot_label"] for m in md.values()}
    tokens = {m["dpone/snapshot_token_digest"] for m in md.values()}
    assert labels == {"single_snapshot"}
    assert len(tokens) == 1 and next(iter(tokens)).startswith("sha256:")
    assert not pg.open_transactions(shop, APP)


def test_the_check_fails_when_the_target_does_not_hold_the_snapshot(
    shop: str, target_dsn: str
) -> None:
    # A trigger on the target rewrites rows as they are inserted: the load commits, but the
    # target no longer equals the source, and the check says so.
    pg.create_mixed_table(target_dsn, "shop", "orders", rows=0)
    pg.execute(
        target_dsn,
        "CREATE FUNCTION shop.shout() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN NEW.label := upper(NEW.label); RETURN NEW; END $$",
    )
    pg.execute(
        target_dsn,
        "CREATE TRIGGER shout BEFORE INSERT ON shop.orders "
        "FOR EACH ROW EXECUTE FUNCTION shop.shout()",
    )
    result = dg.materialize(
        [snapshot_copy_assets(["shop.orders"])], resources=resources(shop, target_dsn)
    )
    assert result.success, "the copy itself committed"
    [check] = result.get_asset_check_evaluations()
    assert not check.passed
    assert check.metadata["dpone/source_rows"].value == check.metadata["dpone/target_rows"].value
    assert (
        check.metadata["dpone/source_digest"].value != check.metadata["dpone/target_digest"].value
    )


def test_a_subset_copies_only_the_selected_tables(shop: str, target_dsn: str) -> None:
    assets = snapshot_copy_assets(["shop.orders", 'shop."Order Items"'])
    result = dg.materialize(
        [assets], resources=resources(shop, target_dsn), selection=[dg.AssetKey(["shop", "orders"])]
    )
    assert result.success
    assert pg.table_exists(target_dsn, "shop", "orders")
    assert not pg.table_exists(target_dsn, "shop", "Order Items")


def test_a_run_time_error_is_a_failure_with_its_code_and_nothing_left_open(
    source_dsn: str, target_dsn: str
) -> None:
    assets = snapshot_copy_assets(["public.nowhere"])
    result = dg.materialize(
        [assets], resources=resources(source_dsn, target_dsn), raise_on_error=False
    )
    assert not result.success
    failure = result.failure_data_for_node("snapshot_copy")
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "table_not_found"
    assert not pg.open_transactions(source_dsn, APP)
    assert not pg.open_transactions(target_dsn, APP)


@pytest.mark.parametrize(
    ("tables", "kwargs", "code"),
    [
        (["shop.order items"], {}, "identifier_invalid"),
        (["shop.orders"], {"strategy": "fastest"}, "copy_options_invalid"),
        (["shop.orders"], {"sink": "upsert"}, "copy_options_invalid"),
        (["shop.orders"], {"options": {"schema_changes": "thaw"}}, "copy_options_invalid"),
        (["a.t", {"source": "b.t", "target": "a.t"}], {}, "plan_invalid"),
        ([], {}, "plan_invalid"),
    ],
)
def test_bad_definitions_fail_when_they_load(
    tables: list[Any], kwargs: dict[str, Any], code: str
) -> None:
    with pytest.raises((DponeError, ValueError), match=code):
        options = kwargs.pop("options", None)
        parsed = None if options is None else SnapshotCopyOptions.parse(options)
        snapshot_copy_assets(tables, options=parsed, **kwargs)


@pytest.mark.parametrize("how", ["reconcile=False", "check deselected"])
def test_a_copy_without_its_check_materializes_and_checks_nothing(
    shop: str, target_dsn: str, how: str
) -> None:
    tables = ["shop.orders", 'shop."Order Items"']
    if how == "reconcile=False":
        assets = snapshot_copy_assets(tables, reconcile=False)
        assert not list(assets.check_specs)
        selection: Any = None
    else:
        assets = snapshot_copy_assets(tables)
        selection = dg.AssetSelection.assets(assets).without_checks()
    result = dg.materialize([assets], resources=resources(shop, target_dsn), selection=selection)
    assert result.success
    assert len(metadata_by_key(result)) == 2
    assert result.get_asset_check_evaluations() == []
    for name in ("orders", "Order Items"):
        assert pg.table_fingerprint(shop, "shop", name) == pg.table_fingerprint(
            target_dsn, "shop", name
        )


def test_the_check_of_one_table_runs_alone(shop: str, target_dsn: str) -> None:
    assets = snapshot_copy_assets(["shop.orders", 'shop."Order Items"'])
    items = dg.AssetKey(["shop", key_part("Order Items")])
    selection = dg.AssetSelection.assets(assets).without_checks() | dg.AssetSelection.checks(
        dg.AssetCheckKey(items, "dpone_reconciled")
    )
    result = dg.materialize([assets], resources=resources(shop, target_dsn), selection=selection)
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.asset_key == items and check.passed
    assert check.metadata["dpone/proof"].value == "row_versions"
    assert check.metadata["dpone/source_rows"].value == 700


def test_a_column_added_between_two_runs_is_listed_logged_and_the_check_stays_green(
    shop: str, target_dsn: str
) -> None:
    instance = dg.DagsterInstance.ephemeral()
    assets = snapshot_copy_assets(["shop.orders"])
    first = dg.materialize([assets], resources=resources(shop, target_dsn), instance=instance)
    assert "dpone/schema_changes" not in metadata_by_key(first)[dg.AssetKey(["shop", "orders"])]
    pg.execute(shop, "ALTER TABLE shop.orders ADD note varchar(20) NOT NULL DEFAULT 'new'")
    again = dg.materialize([assets], resources=resources(shop, target_dsn), instance=instance)
    metadata = metadata_by_key(again)[dg.AssetKey(["shop", "orders"])]
    assert metadata["dpone/schema_changes"] == [
        {
            "column": "note",
            "kind": "added",
            "before": None,
            "after": "character varying(20) DEFAULT 'new'::character varying",
            "detail": "NOT NULL, as in the source",
        }
    ]
    logs = [e.user_message for e in instance.all_logs(again.run_id)]
    line = "Schema of shop.orders against the source: added 'note'"
    assert any(m.startswith(line) for m in logs), logs
    [check] = again.get_asset_check_evaluations()
    assert check.passed, check.description
    assert pg.table_fingerprint(shop, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders"
    )


def test_the_old_keyword_arguments_still_reach_the_run_with_a_deprecation_warning(
    shop: str, target_dsn: str
) -> None:
    with pytest.warns(DeprecationWarning, match=r"schema_changes=\.\.\.\) is deprecated"):
        assets = snapshot_copy_assets(["shop.orders"], schema_changes="freeze")
    assert dg.materialize([assets], resources=resources(shop, target_dsn)).success
    pg.execute(shop, "ALTER TABLE shop.orders ADD COLUMN later integer")
    result = dg.materialize([assets], resources=resources(shop, target_dsn), raise_on_error=False)
    failure = result.failure_data_for_node("snapshot_copy")
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "schema_change_incompatible"


def test_freeze_fails_the_run_with_the_changed_columns_and_writes_nothing(
    shop: str, target_dsn: str
) -> None:
    assets = snapshot_copy_assets(
        ["shop.orders"], options=SnapshotCopyOptions(schema_changes="freeze")
    )
    assert dg.materialize([assets], resources=resources(shop, target_dsn)).success
    pg.execute(shop, "ALTER TABLE shop.orders ALTER small TYPE integer")
    before = pg.table_fingerprint(target_dsn, "shop", "orders")
    result = dg.materialize([assets], resources=resources(shop, target_dsn), raise_on_error=False)
    assert not result.success
    failure = result.failure_data_for_node("snapshot_copy")
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "schema_change_incompatible"
    assert "widened 'small': smallint -> integer" in str(failure.user_failure_data.description)
    assert pg.table_fingerprint(target_dsn, "shop", "orders") == before
    assert pg.fetch_one(
        target_dsn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'shop.orders'::regclass AND attname = 'small'"
    ) == "smallint"  # fmt: skip


@pytest.mark.cross_server
def test_one_multi_asset_into_an_empty_database_creates_the_types_it_was_allowed_to(
    source_dsn: str, target_dsn: str
) -> None:
    """Sixteen tables in one snapshot are no more blocked by one table's enum: the types come
    with the tables, the extensions the target resource names too, and the materializations
    list them; without the extension named, the run fails with its code and writes nothing."""
    for statement in (TYPES, ORDERS, NOTES):
        pg.execute(source_dsn, statement)
    assets = snapshot_copy_assets(['"Sales Ops".orders', "public.notes"])
    refused = dg.materialize(
        [assets], resources=resources(source_dsn, target_dsn), raise_on_error=False
    )
    failure = refused.failure_data_for_node("snapshot_copy")
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "target_extension_missing"
    assert not pg.table_exists(target_dsn, "Sales Ops", "orders"), "all tables or none"

    allowed = {
        **resources(source_dsn, target_dsn),
        "target": PostgresTargetResource(
            dsn=target_dsn, application_name=APP, create_extensions=["hstore", "citext"]
        ),
    }
    result = dg.materialize([assets], resources=allowed)
    assert result.success
    md = {m["dpone/source_table"]: m for m in metadata_by_key(result).values()}
    orders, notes = md['"Sales Ops".orders'], md["public.notes"]
    assert [t["type"] for t in orders["dpone/types_created"]] == [
        "Type Ops.Mood", "Type Ops.steady", "public.positive", "public.line_item",
        "public.price_range",
    ]  # fmt: skip
    assert [e["extension"] for e in notes["dpone/extensions_created"]] == ["citext", "hstore"]
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 2 and all(c.passed for c in checks)
