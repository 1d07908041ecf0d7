"""backfill_asset materialized through Dagster, asserting on the target, the ledger and events."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import dagster as dg
import pytest

from dpone_dagster.backfill import BackfillOptions
from dpone_dagster.dagster.assets import backfill_asset
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.lifecycle import DponeError
from tests.backfill.conftest import wait_for_older_transactions
from tests.helpers import pg

KEY = dg.AssetKey(["public", "mixed"])
PARTS = cursor_range_partitions(0, 3000, 1000)


def resources(source_dsn: str, target_dsn: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }


def partition_range(start: str, end: str) -> dict[str, str]:
    return {
        "dagster/asset_partition_range_start": start,
        "dagster/asset_partition_range_end": end,
    }


@pytest.fixture
def tables(source_dsn: str, target_dsn: str) -> tuple[str, str]:
    pg.create_mixed_table(source_dsn, rows=3000)
    pg.create_mixed_table(target_dsn, rows=0)
    return source_dsn, target_dsn


# A partition's ledger run (found by its scope's bounds), with the end of its checkpoint chain:
# the checkpoint of its last batch receipt.
LEDGER_RUN = """
SELECT r.run_id, r.run_json->'progress'->>'checkpoint', last.checkpoint, last.sequence
FROM dpone_ledger.backfill_runs r
LEFT JOIN LATERAL (
    SELECT b.checkpoint, b.sequence FROM dpone_ledger.backfill_batch_receipts b
    WHERE b.run_id = r.run_id ORDER BY b.sequence DESC LIMIT 1
) last ON true
WHERE r.run_json->'scope'->>'lower' = %s AND r.run_json->'scope'->>'upper' = %s
"""


def materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    return {
        str(m.partition): {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        for m in result.asset_materializations_for_node(result.job_def.nodes[0].name)
    }


def test_a_partition_range_runs_in_order_in_one_run_with_progress_and_receipts(
    tables: tuple[str, str], tmp_path: Any
) -> None:
    source_dsn, target_dsn = tables
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, batch_size=300)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            tags=partition_range("0..1000", "2000..3000"),
        )  # fmt: skip
        assert result.success
        run_tags = instance.get_run_by_id(result.run_id).tags  # type: ignore[union-attr]
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
    observations = [
        e.event_specific_data.asset_observation  # type: ignore[union-attr]
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    partitions = [o.partition for o in observations]
    assert partitions == sorted(partitions, key=lambda p: int(p.split("..")[0]))
    assert len(observations) == 12, "4 batches of at most 300 rows per 1,000-row partition"
    assert {
        "dpone/progress_checkpoint",
        "dpone/progress_copied",
        "dpone/progress_remaining",
    } <= set(observations[0].metadata)
    assert observations[-1].metadata["dpone/progress_remaining"].value == 0
    mats = materializations(result)
    assert set(mats) == {"0..1000", "1000..2000", "2000..3000"}
    for partition, md in mats.items():
        assert md["dagster/row_count"] == 1000, partition
        [(run_id, run_checkpoint, last_receipt_checkpoint, last_sequence)] = pg.fetch_all(
            target_dsn, LEDGER_RUN, tuple(partition.split(".."))
        )
        assert (md["dpone/run_id"], last_sequence) == (run_id, 4), partition
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", md["dpone/checkpoint"]), partition
        assert md["dpone/checkpoint"] == last_receipt_checkpoint == run_checkpoint, partition
        assert md["dpone/snapshot_label"] == "several_snapshots_reconciled"
        assert md["dpone/receipts_summary"]["batches"] == 4
        reconciliation = dict(md["dpone/reconciliation"])
        proved_at = datetime.fromisoformat(reconciliation.pop("proved_at"))
        assert reconciliation == {
            "ok": True, "ranges": 4, "proven_by_row_versions": 4, "content_hashed": 0,
            "differing": [],
        }  # fmt: skip
        assert md["dpone/extraction_started_at"] <= md["dpone/extraction_completed_at"]
        # Equality is proved as of the reconciliation's source snapshot, after the last batch.
        assert proved_at >= datetime.fromisoformat(md["dpone/extraction_completed_at"])
    assert run_tags["dpone/partition"] == "2000..3000"
    assert run_tags["dpone/partitions_done"] == "3 of 3"
    # The tag's checkpoint is short: the materialization holds it whole.
    assert mats["2000..3000"]["dpone/checkpoint"].startswith(run_tags["dpone/checkpoint"])
    assert len(run_tags["dpone/checkpoint"]) == len("sha256:") + 12
    assert run_tags["dpone/copied"] == "3000"  # the run's rows, every partition together
    checks = result.get_asset_check_evaluations()
    assert [c.check_name for c in checks] == [CHECK_NAME] and checks[0].passed


def test_a_rerun_resumes_from_the_ledger_and_copies_nothing_twice(
    tables: tuple[str, str], tmp_path: Any
) -> None:
    source_dsn, target_dsn = tables
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, batch_size=500)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        first = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="1000..2000",
        )  # fmt: skip
        again = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="1000..2000",
        )  # fmt: skip
    one, two = materializations(first)["1000..2000"], materializations(again)["1000..2000"]
    assert one["dpone/batches_committed_now"] == 2
    assert two["dpone/batches_committed_now"] == 0
    assert one["dpone/checkpoint"] == two["dpone/checkpoint"]
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed") == 1000
    assert pg.fetch_one(target_dsn, "SELECT min(id) || '..' || max(id) FROM mixed") == "1001..2000"


def test_a_ledger_that_disagrees_with_dagster_stops_the_run(
    tables: tuple[str, str], tmp_path: Any
) -> None:
    source_dsn, target_dsn = tables
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, batch_size=500)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="0..1000",
        )  # fmt: skip
        pg.execute(target_dsn, "DROP SCHEMA dpone_ledger CASCADE")  # the ledger is lost
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="0..1000", raise_on_error=False,
        )  # fmt: skip
    assert not result.success
    failure = result.failure_data_for_node(result.job_def.nodes[0].name)
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "backfill_ledger_mismatch"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed") == 1000, "nothing overwritten"


def test_each_partition_can_be_its_own_run(tables: tuple[str, str], tmp_path: Any) -> None:
    source_dsn, target_dsn = tables
    asset = backfill_asset(
        "public.mixed", cursor="id", partitions_def=PARTS, batch_size=1000,
        backfill_policy=dg.BackfillPolicy.multi_run(1),
    )  # fmt: skip
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        for key in PARTS.get_partition_keys():
            assert dg.materialize(
                [asset], resources=resources(source_dsn, target_dsn), instance=instance,
                partition_key=key,
            ).success  # fmt: skip
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.backfill_runs") == 3


def test_daily_partitions_backfill_a_timestamp_cursor(
    source_dsn: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.execute(source_dsn, "CREATE TABLE ev (at timestamptz PRIMARY KEY, n int)")
    pg.execute(
        source_dsn,
        "INSERT INTO ev SELECT timestamptz '2026-01-01 00:00+00' + g * interval '1 hour', g"
        " FROM generate_series(0, 71) g",
    )
    daily = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-04")
    asset = backfill_asset("ev", cursor="at", partitions_def=daily, batch_size=10)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="2026-01-02",
        )  # fmt: skip
    assert materializations(result)["2026-01-02"]["dagster/row_count"] == 24
    hours = pg.fetch_all(target_dsn, "SELECT min(n), max(n) FROM ev")
    assert hours == [(24, 47)], "exactly the rows of 2026-01-02, midnight included"


def test_a_missing_target_is_created_from_the_source_even_with_quoted_names(
    source_dsn: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.create_mixed_table(source_dsn, "Sales Ops", "Order Items", rows=500)
    pg.execute(source_dsn, 'CREATE INDEX ON "Sales Ops"."Order Items" (qty)')
    asset = backfill_asset(
        '"Sales Ops"."Order Items"', cursor="qty", target_table='copy."Items"',
        partitions_def=cursor_range_partitions(-1, 999, 500), batch_size=200,
    )  # fmt: skip
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            tags=partition_range("-1..499", "499..999"),
        )  # fmt: skip
    assert result.success
    assert pg.table_fingerprint(source_dsn, "Sales Ops", "Order Items") == pg.table_fingerprint(
        target_dsn, "copy", "Items"
    )
    index = pg.fetch_one(
        target_dsn, "SELECT indexdef FROM pg_indexes WHERE tablename = 'Items' AND indexdef ~ 'qty'"
    )
    assert index is not None, "the cursor got an index in the created target"


def test_a_target_the_step_creates_gets_its_key_once_every_partitions_rows_are_in(
    source_dsn: str, target_dsn: str, tmp_path: Any
) -> None:
    pg.create_mixed_table(source_dsn, rows=3000)
    wait_for_older_transactions(source_dsn)  # so that row versions prove every range
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, batch_size=500)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            tags=partition_range("0..1000", "2000..3000"),
        )  # fmt: skip
        logs = [
            e.message
            for e in instance.all_logs(result.run_id)
            if e.message and e.message.startswith("dpone:")
        ]
    assert result.success
    created = logs.index("dpone: created target table public.mixed (key: once its rows are in)")
    built = logs.index("dpone: built the primary key of public.mixed")
    # Every partition's batches before the key; each partition's reconciliation after it.
    assert created < built and sum(1 for m in logs[:built] if "partition 2000..3000" in m) == 1
    key = pg.fetch_all(
        target_dsn,
        "SELECT i.indisprimary, obj_description('public.mixed'::regclass, 'pg_class')"
        " FROM pg_index i WHERE i.indrelid = 'public.mixed'::regclass",
    )
    assert key == [(True, None)]
    [check] = result.get_asset_check_evaluations()
    partitions = check.metadata["dpone/partitions"].value
    assert check.passed and [p["proven_by_row_versions"] for p in partitions] == [2, 2, 2]
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"table": "public.order items"}, "identifier_invalid"),
        ({"cursor": "x" * 64}, "identifier_invalid"),
        ({"partitions_def": dg.StaticPartitionsDefinition(["a", "b"])}, "plan_invalid"),
        ({"batch_size": 0}, "plan_invalid"),
    ],
)
def test_bad_definitions_fail_when_they_load(kwargs: dict[str, Any], code: str) -> None:
    args: dict[str, Any] = {"table": "public.mixed", "cursor": "id", "partitions_def": PARTS}
    args.update(kwargs)
    table = args.pop("table")
    with pytest.raises((DponeError, ValueError), match=code):
        backfill_asset(table, **args)


@pytest.mark.parametrize("how", ["reconcile=False", "check deselected"])
def test_a_backfill_without_its_check_materializes_and_checks_nothing(
    tables: tuple[str, str], tmp_path: Any, how: str
) -> None:
    source_dsn, target_dsn = tables
    reconcile = how != "reconcile=False"
    options = BackfillOptions(batch_size=300, reconcile=reconcile)
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, options=options)
    selection = dg.AssetSelection.assets(asset).without_checks()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="0..1000", selection=selection,
        )  # fmt: skip
    assert result.success
    assert result.get_asset_check_evaluations() == []
    [md] = materializations(result).values()
    assert md["dagster/row_count"] == 1000
    # Deselecting the check does not skip the reconciliation; reconcile=False does.
    assert ("dpone/reconciliation" in md) is reconcile
    label = "several_snapshots_reconciled" if reconcile else "several_snapshots"
    assert md["dpone/snapshot_label"] == label


def test_the_check_alone_reconciles_what_the_ledger_holds_and_copies_nothing(
    tables: tuple[str, str], tmp_path: Any
) -> None:
    source_dsn, target_dsn = tables
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, batch_size=1000)
    check_only = dg.define_asset_job(  # Dagster runs a check alone without a partition
        "check_only", selection=dg.AssetSelection.checks(dg.AssetCheckKey(KEY, CHECK_NAME))
    )
    defs = dg.Definitions(
        assets=[asset], jobs=[check_only], resources=resources(source_dsn, target_dsn)
    )
    job = defs.resolve_job_def("check_only")

    def check() -> tuple[bool, list[dict[str, Any]]]:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        [evaluation] = result.get_asset_check_evaluations()
        assert result.get_asset_materialization_events() == []
        return evaluation.passed, evaluation.metadata["dpone/partitions"].value  # type: ignore[return-value]

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        passed, partitions = check()
        assert passed and [p["detail"] for p in partitions] == ["not started"] * 3
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed") == 0, "nothing copied"
        assert dg.materialize(
            [asset], partition_key="0..1000", resources=resources(source_dsn, target_dsn),
            instance=instance,
        ).success  # fmt: skip
        passed, partitions = check()
        assert passed and partitions[0]["proven_by_row_versions"] == 1
        pg.execute(target_dsn, "UPDATE mixed SET qty = qty + 1 WHERE id = 10")
        passed, partitions = check()
        assert not passed and partitions[0]["differing"] == [1]
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed") == 1000, "nothing repaired"


@pytest.mark.cross_server
def test_a_partition_into_an_empty_database_lists_the_types_and_extensions_it_created(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, "CREATE EXTENSION hstore")
    pg.execute(source_dsn, "CREATE TYPE public.mood AS ENUM ('sad', 'ok')")
    pg.execute(source_dsn, "CREATE TABLE public.moods (id int PRIMARY KEY, m mood, h hstore)")
    pg.execute(
        source_dsn, "INSERT INTO public.moods SELECT g, 'ok', 'a=>1' FROM generate_series(1, 10) g"
    )
    asset = backfill_asset(
        "public.moods", cursor="id", partitions_def=cursor_range_partitions(0, 10, 10)
    )
    allowed = {
        **resources(source_dsn, target_dsn),
        "target": PostgresTargetResource(dsn=target_dsn, create_extensions=["hstore"]),
    }
    result = dg.materialize([asset], resources=allowed, partition_key="0..10")
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert [t["type"] for t in metadata["dpone/types_created"].value] == ["public.mood"]  # type: ignore[union-attr]
    assert [e["extension"] for e in metadata["dpone/extensions_created"].value] == ["hstore"]  # type: ignore[union-attr]
    assert pg.table_fingerprint(target_dsn, "public", "moods") == pg.table_fingerprint(
        source_dsn, "public", "moods"
    )


@pytest.mark.parametrize("on_changed", ["fail", "repair"])
def test_a_completed_partition_materialized_again_is_verified_against_the_source_now(
    tables: tuple[str, str], tmp_path: Any, on_changed: str
) -> None:
    source_dsn, target_dsn = tables
    asset = backfill_asset(
        "public.mixed", cursor="id", partitions_def=PARTS, batch_size=250, on_changed=on_changed
    )

    def materialize() -> tuple[dg.ExecuteInProcessResult, dict[str, Any]]:
        result = dg.materialize(
            [asset], resources=resources(source_dsn, target_dsn), instance=instance,
            partition_key="1000..2000", raise_on_error=False,
        )  # fmt: skip
        [evaluation] = result.get_asset_check_evaluations()
        [check] = evaluation.metadata["dpone/partitions"].value  # type: ignore[attr-defined]
        assert evaluation.passed is check["ok"]
        return result, check

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        first, check = materialize()
        assert first.success and check["ok"] and check["proved_at"]
        # The partition's writer goes on after its backfill completed: batch 2 changes a row,
        # batch 3 loses one.
        pg.execute(source_dsn, "UPDATE mixed SET qty = qty + 1 WHERE id = 1300")
        pg.execute(source_dsn, "DELETE FROM mixed WHERE id = 1600")
        again, check = materialize()
        before = materializations(first)["1000..2000"]["dpone/reconciliation"]["proved_at"]
        assert check["proved_at"] > before
        if on_changed == "fail":  # strict: the check fails naming the changed ranges
            assert not again.success and not check["ok"]
            assert check["code"] == "backfill_record_changed" and check["differing"] == [2, 3]
            assert check["differing_ranges"] == [["1250", "1500"], ["1500", "1750"]]
            assert again.get_asset_materialization_events() == []
            assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed") == 1000  # untouched
        else:  # repair: the re-run rewrites those ranges from the source, and says so
            assert again.success and check["ok"]
            md = materializations(again)["1000..2000"]
            assert md["dpone/rows_repaired_updated"] == 1 and md["dpone/rows_repaired_deleted"] == 1
            assert md["dpone/snapshot_label"] == "repaired_to_one_snapshot"
            rows = "SELECT id, qty FROM mixed WHERE id > 1000 AND id <= 2000 ORDER BY id"
            assert pg.fetch_all(target_dsn, rows) == pg.fetch_all(source_dsn, rows)
            assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed") == 999
