"""build_extraction_job: whatever step fails, a terminal outcome is recorded, nothing stays open."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest

from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.jobs import build_extraction_job
from dpone_dagster.dagster.resources import PostgresSourceResource, PostgresTargetResource
from tests.helpers import locks, pg
from tests.helpers.proxy import TcpProxy

APP = "dpone-test-job"


def run_job(
    job: dg.JobDefinition, source: PostgresSourceResource, target: PostgresTargetResource,
    tmp_path: Any,
) -> tuple[dg.ExecuteInProcessResult, list[dict[str, Any]]]:  # fmt: skip
    defs = dg.Definitions(jobs=[job], resources={"source": source, "target": target})
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = defs.resolve_job_def(job.name).execute_in_process(
            instance=instance, raise_on_error=False
        )
        outcomes = [
            json.loads(entry.user_message.split("dpone terminal outcome: ", 1)[1])
            for entry in instance.all_logs(result.run_id)
            if "dpone terminal outcome: " in entry.user_message
        ]
    return result, outcomes


def failed_step(result: dg.ExecuteInProcessResult) -> tuple[str, str]:
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data
            code = data.user_failure_data.metadata[ERROR_CODE_KEY].value  # type: ignore[union-attr]
            return str(event.step_key), str(code)
    raise AssertionError("no step failed")


@pytest.fixture
def orders(source_dsn: str) -> str:
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=20_000)
    return source_dsn


@pytest.mark.parametrize("strategy", ["whole_copy", "stream_rows"])
def test_the_four_steps_copy_the_table_and_settle_success(
    orders: str, target_dsn: str, tmp_path: Any, strategy: str
) -> None:
    job = build_extraction_job("shop.orders", strategy=strategy)  # type: ignore[arg-type]
    result, outcomes = run_job(
        job, PostgresSourceResource(dsn=orders, application_name=APP),
        PostgresTargetResource(dsn=target_dsn), tmp_path,
    )  # fmt: skip
    assert result.success
    assert [e.step_key for e in result.all_events if e.is_step_success] == [
        "acquire", "extract", "load", "settle",
    ]  # fmt: skip
    assert outcomes == [
        {"dpone_terminal_outcome": "success",
         "tables": [{"table": "shop.orders", "outcome": "success", "sources_closed": True}]}
    ]  # fmt: skip
    assert pg.table_fingerprint(orders, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders"
    )
    mats = result.asset_materializations_for_node("settle")
    assert mats[0].asset_key == dg.AssetKey(["shop", "orders"])
    assert mats[0].metadata["dagster/row_count"].value == 20_000
    # The job's materialization carries the standard table set too.
    assert isinstance(mats[0].metadata["dagster/column_schema"], dg.TableSchemaMetadataValue)
    lineage = mats[0].metadata["dagster/column_lineage"].lineage  # type: ignore[attr-defined]
    source = dg.AssetKey(["source", "shop", "orders"])
    assert lineage.deps_by_column["id"] == [dg.TableColumnDep(asset_key=source, column_name="id")]
    assert not pg.open_transactions(orders, APP)


def test_a_failing_acquire_records_abort(source_dsn: str, target_dsn: str, tmp_path: Any) -> None:
    job = build_extraction_job("shop.missing")
    result, outcomes = run_job(
        job, PostgresSourceResource(dsn=source_dsn, application_name=APP),
        PostgresTargetResource(dsn=target_dsn), tmp_path,
    )  # fmt: skip
    assert not result.success
    assert failed_step(result) == ("acquire", "table_not_found")
    assert outcomes and outcomes[0]["dpone_terminal_outcome"] in (None, "abort")
    assert not pg.open_transactions(source_dsn, APP)


def test_a_failing_extract_records_abort_and_closes_the_source(
    orders: str, target_dsn: str, tmp_path: Any
) -> None:
    # A real fault while reading: the source session is terminated in the middle of its COPY,
    # once the server shows that COPY waiting at a gate the test holds shut.
    with locks.terminated_at_gate(orders, APP, "COPY") as gate:
        gate.create_view("shop.gated_orders", over="shop.orders")
        job = build_extraction_job("shop.gated_orders", strategy="whole_copy")
        result, outcomes = run_job(
            job, PostgresSourceResource(dsn=orders, application_name=APP),
            PostgresTargetResource(dsn=target_dsn), tmp_path,
        )  # fmt: skip
    assert not result.success
    assert failed_step(result) == ("extract", "source_read_failed")
    assert outcomes[-1]["dpone_terminal_outcome"] == "abort"
    assert not pg.open_transactions(orders, APP)
    assert not pg.table_exists(target_dsn, "shop", "gated_orders")


def test_a_failing_load_records_abort_and_leaves_the_target_unchanged(
    orders: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.create_mixed_table(target_dsn, "shop", "orders", rows=10)
    before = pg.table_fingerprint(target_dsn, "shop", "orders")
    pg.execute(target_dsn, "ALTER TABLE shop.orders ADD CONSTRAINT small CHECK (id < 15000)")
    job = build_extraction_job("shop.orders", sink="merge")
    result, outcomes = run_job(
        job, PostgresSourceResource(dsn=orders, application_name=APP),
        PostgresTargetResource(dsn=target_dsn, application_name=APP), tmp_path,
    )  # fmt: skip
    assert not result.success
    assert failed_step(result) == ("load", "target_load_failed")
    assert outcomes[-1]["dpone_terminal_outcome"] == "abort"
    assert pg.table_fingerprint(target_dsn, "shop", "orders") == before
    assert not pg.open_transactions(orders, APP)
    assert not pg.open_transactions(target_dsn, APP)


def test_a_lost_commit_acknowledgement_records_retain_commit_unknown(
    orders: str, target_dsn: str, tmp_path: Any
) -> None:
    proxy = TcpProxy.to(target_dsn)
    proxy.cut_after_client_message()
    try:
        job = build_extraction_job("shop.orders")
        result, outcomes = run_job(
            job, PostgresSourceResource(dsn=orders, application_name=APP),
            PostgresTargetResource(dsn=proxy.dsn(target_dsn)), tmp_path,
        )  # fmt: skip
    finally:
        proxy.close()
    assert proxy.cut_events == 1
    assert not result.success
    assert failed_step(result) == ("load", "target_commit_unknown")
    assert outcomes[-1]["dpone_terminal_outcome"] == "retain_commit_unknown"
    assert not pg.open_transactions(orders, APP), "the source transaction is closed anyway"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders") == 20_000, (
        "the COMMIT really happened: only its acknowledgement was lost"
    )
