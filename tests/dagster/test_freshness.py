"""Freshness through a real Dagster instance: a stream's FreshnessPolicy and its dpone_fresh
check judged by the lag it reports, and a backfill's partitions judged from the ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest

from dpone_dagster import incremental_asset, kafka_copy_asset
from dpone_dagster.dagster.assets import backfill_asset, backfill_freshness_check
from dpone_dagster.dagster.metadata.backfill import PARTITIONS_CHECK_NAME
from dpone_dagster.dagster.metadata.freshness import FRESH_CHECK_NAME, freshness_check
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.dagster.resources import (
    KafkaSourceResource,
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.embedded_kafka import KafkaBroker
from dpone_dagster.lifecycle import DponeError
from tests.helpers import kafka, pg
from tests.incremental.conftest import ORDERS, insert_orders

ORDERS_KEY = dg.AssetKey(["shop", "orders"])
MIXED_KEY = dg.AssetKey(["public", "mixed"])


def _resources(source_dsn: str, target_dsn: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }


def _fresh(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    [fresh] = [e for e in result.get_asset_check_evaluations() if e.check_name == FRESH_CHECK_NAME]
    return fresh


def _values(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def test_a_stream_carries_the_policy_its_schedule_implies_and_dpone_fresh_judges_its_lag(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 500)
    orders = incremental_asset("shop.orders", cursor="updated_at", cron_schedule="*/5 * * * *")
    [spec] = orders.specs
    policy = spec.freshness_policy
    assert isinstance(policy, dg.FreshnessPolicy)
    assert policy.fail_window.to_timedelta() == timedelta(minutes=10)  # type: ignore[attr-defined]
    assert policy.warn_window.to_timedelta() == timedelta(minutes=7.5)  # type: ignore[attr-defined]
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [orders], resources=_resources(source_dsn, target_dsn), instance=instance
    )
    assert result.success
    fresh = _fresh(result)
    md = _values(fresh.metadata)
    assert fresh.passed, fresh.description
    assert 0 <= md["dpone/lag_seconds"] < 60  # the run just took its mark
    assert (md["dpone/fail_after_seconds"], md["dpone/warn_after_seconds"]) == (600.0, 450.0)
    assert "time window" in md["dpone/freshness_policy"]
    [materialization] = result.asset_materializations_for_node(result.job_def.nodes[0].name)
    recorded = _values(materialization.metadata)
    assert isinstance(recorded["dpone/cursor_lag_seconds"], float)  # the cursor's own figure
    # The same recorded metadata, judged later: Dagster's time never moves in a test, the
    # check's clock is its argument. 8 minutes on warns, 11 fails.
    later = freshness_check(
        ORDERS_KEY, materialization.metadata, policy,
        reported_at=datetime.now(UTC), now=datetime.now(UTC) + timedelta(minutes=8),
    )  # fmt: skip
    assert not later.passed and later.severity == dg.AssetCheckSeverity.WARN
    much_later = freshness_check(
        ORDERS_KEY, materialization.metadata, policy,
        reported_at=datetime.now(UTC), now=datetime.now(UTC) + timedelta(minutes=11),
    )  # fmt: skip
    assert not much_later.passed and much_later.severity == dg.AssetCheckSeverity.ERROR
    assert much_later.description is not None and "exceeds 600 s" in much_later.description


def test_dpone_fresh_run_alone_judges_the_latest_recorded_lag_and_copies_nothing(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 300)
    orders = incremental_asset(
        "shop.orders",
        cursor="updated_at",
        freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=1)),
    )
    resources = _resources(source_dsn, target_dsn)
    instance = dg.DagsterInstance.ephemeral()
    alone = dg.AssetSelection.checks(dg.AssetCheckKey(ORDERS_KEY, FRESH_CHECK_NAME))
    before = dg.materialize([orders], resources=resources, instance=instance, selection=alone)
    assert before.success and not _fresh(before).passed  # no materialization yet: unknown
    assert "unknown" in (_fresh(before).description or "")
    first = dg.materialize([orders], resources=resources, instance=instance)
    assert first.success
    lag = _values(_fresh(first).metadata)["dpone/lag_seconds"]
    insert_orders(source_dsn, 301, 400)
    checked = dg.materialize([orders], resources=resources, instance=instance, selection=alone)
    assert checked.success
    fresh = _fresh(checked)
    assert fresh.passed
    assert _values(fresh.metadata)["dpone/lag_seconds"] >= lag  # grown since it was recorded
    assert [e.check_name for e in checked.get_asset_check_evaluations()] == [FRESH_CHECK_NAME]
    assert not checked.asset_materializations_for_node(checked.job_def.nodes[0].name)
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders") == 300  # nothing copied


def test_a_stream_without_a_schedule_or_policy_has_neither_and_a_bad_schedule_fails_at_load(
    source_dsn: str,
) -> None:
    orders = incremental_asset("shop.orders", cursor="updated_at")
    [spec] = orders.specs
    assert spec.freshness_policy is None
    assert [k.name for k in orders.check_keys] == [CHECK_NAME]
    with pytest.raises(DponeError) as caught:
        incremental_asset("shop.orders", cursor="updated_at", cron_schedule="every 5 minutes")
    assert caught.value.code == "incremental_options_invalid"
    with pytest.raises(DponeError) as caught:
        kafka_copy_asset(key="k", topic="t", target_table="a.b", cron_schedule="*/61 * * *")
    assert caught.value.code == "kafka_options_invalid"


def test_a_kafka_stream_reports_dpone_fresh_from_its_run(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, kafka.json_messages(0, 5), partition=0)
    asset = kafka_copy_asset(
        key=["events", "clicks"], topic=topic, target_table="events.clicks",
        cron_schedule="0 * * * *",
    )  # fmt: skip
    [spec] = asset.specs
    assert spec.freshness_policy is not None
    resources = {
        "kafka": KafkaSourceResource(bootstrap_servers=bootstrap, timeout=10.0),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }
    result = dg.materialize([asset], resources=resources, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    fresh = _fresh(result)
    assert fresh.passed, fresh.description
    assert _values(fresh.metadata)["dpone/fail_after_seconds"] == 7200.0


def _partition_rows(metadata: dict[str, Any]) -> dict[str, list[str]]:
    table = str(metadata["dpone/partition_states"])
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in rows[1:]}


def test_the_partitions_check_lists_each_partition_from_the_ledger_and_names_the_stale(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=1900)  # ids 1..1900: the last partition is empty
    pg.create_mixed_table(target_dsn, rows=0)
    parts = cursor_range_partitions(0, 3000, 1000)
    asset = backfill_asset("public.mixed", cursor="id", partitions_def=parts, batch_size=400)
    check = backfill_freshness_check(asset, max_age=timedelta(hours=1))
    resources = _resources(source_dsn, target_dsn)
    instance = dg.DagsterInstance.ephemeral()
    for partition in ("0..1000", "1000..2000"):
        done = dg.materialize(
            [asset], resources=resources, instance=instance, partition_key=partition
        )
        assert done.success
    alone = dg.AssetSelection.checks(check)

    def evaluate() -> dg.AssetCheckEvaluation:
        result = dg.materialize([asset, check], resources=resources, instance=instance,
                                selection=alone)  # fmt: skip
        assert result.success
        [evaluation] = result.get_asset_check_evaluations()
        assert evaluation.check_name == PARTITIONS_CHECK_NAME
        return evaluation

    fresh = evaluate()
    md = _values(fresh.metadata)
    assert fresh.passed, fresh.description
    assert (md["dpone/partitions_stale"], md["dpone/partitions_not_started"]) == (0, 1)
    rows = _partition_rows(md)
    assert rows["0..1000"][1] == "succeeded" and rows["0..1000"][3]  # proved at: reconciled
    assert rows["2000..3000"][1] == "not started"
    # A row arrives in the second partition's range above its mark (1900): the source changed
    # since; one index probe sees it, nothing is scanned.
    pg.create_mixed_table(source_dsn, rows=1, start=1950)
    changed = evaluate()
    md = _values(changed.metadata)
    assert not changed.passed and changed.severity == dg.AssetCheckSeverity.WARN
    assert (md["dpone/partitions_stale"], md["dpone/partitions_past_mark"]) == (1, 1)
    assert "1000..2000 (rows past its mark)" in (changed.description or "")
    assert _partition_rows(md)["1000..2000"][5] == "yes"
    # An age of zero: every partition the ledger has is older than that.
    strict = backfill_freshness_check(asset, max_age=timedelta(0), name="dpone_strict")
    result = dg.materialize([asset, strict], resources=resources, instance=instance,
                            selection=dg.AssetSelection.checks(strict))  # fmt: skip
    [evaluation] = result.get_asset_check_evaluations()
    assert _values(evaluation.metadata)["dpone/partitions_stale"] == 2
    assert "0..1000 (older than the age)" in (evaluation.description or "")


def test_the_partitions_check_refuses_an_asset_that_is_not_a_backfill() -> None:
    orders = incremental_asset("shop.orders", cursor="updated_at")
    with pytest.raises(DponeError) as caught:
        backfill_freshness_check(orders, max_age=timedelta(days=1))
    assert caught.value.code == "plan_invalid"


def test_a_cron_policy_is_judged_by_the_age_of_the_data_against_its_last_window() -> None:
    """A ``FreshnessPolicy.cron`` of the user's: the data must be newer than the start of the
    last completed window (tick minus ``lower_bound_delta``), whatever the run's time."""
    policy = dg.FreshnessPolicy.cron(
        deadline_cron="0 * * * *", lower_bound_delta=timedelta(minutes=30)
    )
    now = datetime(2026, 12, 2, 10, 10, tzinfo=UTC)  # last tick 10:00, its window from 09:30
    fresh = freshness_check(ORDERS_KEY, {"dpone/lag_seconds": 30 * 60.0}, policy, now=now)
    assert fresh.passed
    assert _values(fresh.metadata)["dpone/fail_after_seconds"] == 40 * 60.0
    stale = freshness_check(ORDERS_KEY, {"dpone/lag_seconds": 50 * 60.0}, policy, now=now)
    assert not stale.passed and stale.severity == dg.AssetCheckSeverity.ERROR
    assert "2026-12-02T09:30:00+00:00" in _values(stale.metadata)["dpone/freshness_policy"]


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Australia/Sydney"])
@pytest.mark.parametrize(
    "cron", ["*/5 * * * *", "0 * * * *", "0 9,17 * * 1-5", "30 2 * * *", "15 3 1 * *"]
)
def test_the_cron_arithmetic_agrees_with_dagsters_own(cron: str, zone: str) -> None:
    """The check's cron arithmetic (croniter) gives the smallest interval and the last completed
    tick that Dagster's own evaluators give (its private ``dagster._utils.schedules``, read here
    only to cross-check), at 300 times spread over two years, daylight-saving changes included.
    The zones are whole hours from UTC: in a half-hour zone Dagster 1.12 (the lowest supported)
    puts the ticks of ``0 * * * *`` on the UTC hour, where 1.13 and croniter put them on the
    local hour (the last test below)."""
    from dagster._utils.schedules import (
        get_latest_completed_cron_tick,
        get_smallest_cron_interval,
    )

    from dpone_dagster.dagster.metadata.freshness import _limits, _smallest_cron_interval

    assert _smallest_cron_interval(cron) == get_smallest_cron_interval(cron)
    policy = dg.FreshnessPolicy.cron(
        deadline_cron=cron, lower_bound_delta=timedelta(minutes=1), timezone=zone
    )
    start = datetime(2025, 1, 1, 0, 7, 13, tzinfo=UTC)
    for step in range(300):
        now = start + timedelta(hours=58.37 * step)
        fail, _, _ = _limits(policy, now)
        tick = get_latest_completed_cron_tick(cron, now, zone)
        assert tick is not None
        assert fail == (now - (tick - timedelta(minutes=1))).total_seconds(), (cron, zone, now)


def test_a_cron_policy_in_a_half_hour_zone_counts_from_the_local_hour() -> None:
    """``0 * * * *`` in Asia/Kolkata (UTC+05:30) ticks at each local hour: at 05:37:13 local the
    data must be newer than 05:00 local less the policy's lower bound."""
    from dpone_dagster.dagster.metadata.freshness import _limits

    policy = dg.FreshnessPolicy.cron(
        deadline_cron="0 * * * *", lower_bound_delta=timedelta(minutes=1), timezone="Asia/Kolkata"
    )
    fail, warn, _ = _limits(policy, datetime(2025, 1, 1, 0, 7, 13, tzinfo=UTC))
    assert (fail, warn) == (37 * 60 + 13 + 60, None)
