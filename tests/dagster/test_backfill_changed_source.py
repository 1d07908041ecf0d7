"""``backfill_asset`` on a table that changes under it, through ``dagster.materialize``.

The change is real and lands at a moment the server's state shows: a target session holds an
uncommitted row with a key of the partition's fourth batch, so that batch's COPY waits on it
(``wait_event = 'transactionid'``); while it waits, a writer session updates two rows and deletes
one that batch 1 already copied, commits, and only then is the gate rolled back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import psycopg
import pytest

from dpone_dagster.dagster.assets import backfill_asset
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, NEXT_ACTIONS_KEY
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.lifecycle import DponeError
from tests.dagster.test_backfill_asset import materializations, resources
from tests.helpers import pg
from tests.helpers.locks import lock_waiters

PARTS = cursor_range_partitions(0, 3000, 1000)


@contextmanager
def source_changes_mid_backfill(source_dsn: str, target_dsn: str) -> Iterator[None]:
    """Updates rows 10 and 20 and deletes row 30 of the source while the backfill of partition
    ``0..1000`` (batches of 200) waits at its fourth batch."""
    gate = psycopg.connect(target_dsn, application_name="dpone-test-gate")
    gate.execute("INSERT INTO mixed (id, qty) VALUES (700, 0)")  # uncommitted: batch 4 waits
    errors: list[BaseException] = []

    def change() -> None:
        try:
            pg.wait_until(
                lambda: lock_waiters(target_dsn, "dpone-dagster", wait_event="transactionid"),
                timeout=60,
                what="the backfill's COPY waits for the gate's row 700",
            )
            with psycopg.connect(source_dsn, application_name="dpone-test-writer") as writer:
                writer.execute("UPDATE mixed SET qty = qty + 5000 WHERE id IN (10, 20)")
                writer.execute("DELETE FROM mixed WHERE id = 30")
        except BaseException as exc:
            errors.append(exc)
        finally:
            gate.rollback()  # the backfill goes on
            gate.close()

    thread = threading.Thread(target=change, name="dpone-test-change", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(60)
    assert not thread.is_alive() and not errors, errors


def run_partition(
    asset: dg.AssetsDefinition, source_dsn: str, target_dsn: str, instance: dg.DagsterInstance
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [asset], resources=resources(source_dsn, target_dsn), instance=instance,
        partition_key="0..1000", raise_on_error=False,
    )  # fmt: skip


def test_on_changed_repair_ends_the_partition_equal_to_the_source_and_says_so(
    source_dsn: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.create_mixed_table(source_dsn, rows=3000)
    pg.create_mixed_table(target_dsn, rows=0)
    asset = backfill_asset(
        "public.mixed", cursor="id", partitions_def=PARTS, batch_size=200, on_changed="repair"
    )
    assert asset.specs_by_key[dg.AssetKey(["public", "mixed"])].metadata["dpone/on_changed"] == (
        "repair"
    )
    with (
        dg.instance_for_test(temp_dir=str(tmp_path)) as instance,
        source_changes_mid_backfill(source_dsn, target_dsn),
    ):
        result = run_partition(asset, source_dsn, target_dsn, instance)
    assert result.success
    md = materializations(result)["0..1000"]
    assert md["dpone/snapshot_label"] == "repaired_to_one_snapshot"
    assert (
        md["dpone/rows_repaired_updated"],
        md["dpone/rows_repaired_deleted"],
        md["dpone/rows_repaired_inserted"],
    ) == (2, 1, 0)
    assert md["dagster/row_count"] == 999
    assert md["dpone/reconciliation"]["ok"] and md["dpone/reconciliation"]["differing"] == []
    assert md["dpone/reconciliation_snapshot_digest"].startswith("sha256:")
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == CHECK_NAME and check.passed
    query = "SELECT id, qty FROM mixed WHERE id <= 1000 ORDER BY id"
    assert pg.fetch_all(target_dsn, query) == pg.fetch_all(source_dsn, query)
    assert pg.fetch_one(target_dsn, "SELECT qty FROM mixed WHERE id = 10") == 5010


def test_by_default_the_partition_fails_with_the_way_out_which_then_works(
    source_dsn: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.create_mixed_table(source_dsn, rows=3000)
    pg.create_mixed_table(target_dsn, rows=0)
    strict = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, batch_size=200)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        with source_changes_mid_backfill(source_dsn, target_dsn):
            failed = run_partition(strict, source_dsn, target_dsn, instance)
        assert not failed.success
        failure = failed.failure_data_for_node(failed.job_def.nodes[0].name)
        assert failure is not None and failure.user_failure_data is not None
        metadata = failure.user_failure_data.metadata
        assert metadata[ERROR_CODE_KEY].value == "backfill_record_changed"
        actions = str(metadata[NEXT_ACTIONS_KEY].value)
        assert 'on_changed="repair"' in actions and "incremental_asset" in actions
        assert pg.fetch_one(target_dsn, "SELECT qty FROM mixed WHERE id = 10") == 10  # kept

        again = run_partition(strict, source_dsn, target_dsn, instance)
        assert not again.success  # the strict default never accepts the changed history

        repair = backfill_asset(
            "public.mixed", cursor="id", partitions_def=PARTS, batch_size=200,
            on_changed="repair",
        )  # fmt: skip
        fixed = run_partition(repair, source_dsn, target_dsn, instance)
    assert fixed.success
    md = materializations(fixed)["0..1000"]
    assert md["dpone/snapshot_label"] == "repaired_to_one_snapshot"
    assert (md["dpone/rows_repaired_updated"], md["dpone/rows_repaired_deleted"]) == (2, 1)
    query = "SELECT id, qty FROM mixed WHERE id <= 1000 ORDER BY id"
    assert pg.fetch_all(target_dsn, query) == pg.fetch_all(source_dsn, query)


def test_an_unknown_on_changed_fails_when_the_definitions_load() -> None:
    with pytest.raises(DponeError) as err:
        backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, on_changed="merge")  # type: ignore[arg-type]
    assert err.value.code == "plan_invalid" and "repair" in err.value.message
