"""PostgresCopyComponent: the example defs.yaml loads, and its assets materialize."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from dpone_dagster import PostgresCopyComponent
from dpone_dagster.translator import key_part
from tests.helpers import pg

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "postgres_copy" / "defs.yaml"


def seed(dsn: str) -> None:
    pg.create_mixed_table(dsn, "shop", "customers", rows=50)
    pg.create_mixed_table(dsn, "shop", "orders", rows=200)
    pg.create_mixed_table(dsn, "shop", "Order Items", rows=300)
    pg.create_mixed_table(dsn, "events", "page_views", rows=1200)


def test_the_example_defs_yaml_declares_copies_and_backfills_that_run(
    source_dsn: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(source_dsn)
    monkeypatch.setenv("DPONE_SOURCE_DSN", source_dsn)
    monkeypatch.setenv("DPONE_TARGET_DSN", target_dsn)
    contents = yaml.safe_load(EXAMPLE.read_text())
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=PostgresCopyComponent,
                                          defs_yaml_contents=contents)  # fmt: skip
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, PostgresCopyComponent)
            keys = {spec.key for spec in defs.resolve_all_asset_specs()}
            assert dg.AssetKey(["shop", key_part("Order Items")]) in keys
            assert dg.AssetKey(["events", "page_views"]) in keys
            copy_job = dg.define_asset_job("copy", selection=dg.AssetSelection.groups("shop"))
            events_job = dg.define_asset_job("events", selection=dg.AssetSelection.groups("events"))
            runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[copy_job, events_job]))
            assert runnable.resolve_job_def("copy").execute_in_process().success
            # A column added to a source between two runs: the next run evolves the target.
            pg.execute(source_dsn, "ALTER TABLE shop.customers ADD note text DEFAULT 'new'")
            again = runnable.resolve_job_def("copy").execute_in_process()
            [customers] = [
                m.materialization
                for m in again.get_asset_materialization_events()
                if m.materialization.asset_key == dg.AssetKey(["shop", "customers"])
            ]
            [change] = customers.metadata["dpone/schema_changes"].value  # type: ignore[misc]
            assert (change["column"], change["kind"]) == ("note", "added")
            assert (
                runnable.resolve_job_def("events")
                .execute_in_process(partition_key="0..50000")
                .success
            )
    for name in ("customers", "orders", "Order Items"):
        assert pg.table_fingerprint(source_dsn, "shop", name) == pg.table_fingerprint(
            target_dsn, "shop", name
        )
    assert pg.table_fingerprint(source_dsn, "events", "page_views") == pg.table_fingerprint(
        target_dsn, "events", "page_views"
    )


def chain(exc: BaseException | None) -> str:
    text = ""
    while exc is not None:
        text += f"{exc}\n"
        exc = exc.__cause__ or exc.__context__
    return text


def load_defs(attributes: dict[str, Any]) -> dg.Definitions:
    """The definitions a ``PostgresCopyComponent`` with ``attributes`` builds."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=PostgresCopyComponent,
            defs_yaml_contents={"type": "dpone_dagster.PostgresCopyComponent",
                                "attributes": attributes},
        )  # fmt: skip
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            return defs


def test_a_backfill_needs_exactly_one_kind_of_partitions() -> None:
    attributes = {"backfills": [{"table": "events.page_views", "cursor": "id"}]}
    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dagster wraps the cause
        load_defs(attributes)
    assert "exactly one of range_partitions or daily_partitions" in chain(raised.value)


def test_a_backfill_declares_on_changed_in_yaml_and_an_unknown_value_fails_at_load() -> None:
    def backfill(on_changed: str) -> dict[str, Any]:
        return {
            "source_dsn_env": "DPONE_SOURCE_DSN",  # read at run time: no server needed here
            "target_dsn_env": "DPONE_TARGET_DSN",
            "backfills": [
                {
                    "table": "events.page_views",
                    "cursor": "id",
                    "range_partitions": {"start": 0, "stop": 100, "step": 50},
                    "on_changed": on_changed,
                }
            ],
        }

    [spec] = load_defs(backfill("repair")).resolve_all_asset_specs()
    assert spec.metadata["dpone/on_changed"] == "repair"
    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dagster wraps the cause
        load_defs(backfill("overwrite"))
    assert "on_changed" in chain(raised.value)
