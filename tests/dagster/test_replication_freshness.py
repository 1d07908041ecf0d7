"""A replication group's freshness through a real Dagster instance: every table carries the
FreshnessPolicy its schedule implies and a ``dpone_fresh`` check judged by the lag the run
reports for it; a group drained to the source's LSN is fresh however quiet the source, a group
stopped by its budget is as old as its newest applied commit."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest

from dpone_dagster import replication_assets
from dpone_dagster.dagster.metadata.freshness import FRESH_CHECK_NAME, freshness_check
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.metadata.replication import SLOT_CHECK_NAME
from dpone_dagster.lifecycle import DponeError
from tests.dagster.test_replication_assets import SHOP, resources, table_metadata
from tests.helpers import pg
from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
    logical_server,
    logical_source_dsn,
    make_logical_database,
)

ORDERS = dg.AssetKey(["shop", "orders"])
CUSTOMERS = dg.AssetKey(["shop", "customers"])


def fresh_by_key(result: dg.ExecuteInProcessResult) -> dict[dg.AssetKey, dg.AssetCheckEvaluation]:
    """Each table's ``dpone_fresh`` evaluation (exactly one per table)."""
    found = [e for e in result.get_asset_check_evaluations() if e.check_name == FRESH_CHECK_NAME]
    by_key = {e.asset_key: e for e in found}
    assert len(by_key) == len(found), found
    return by_key


def values(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def test_each_table_carries_the_schedules_policy_and_dpone_fresh_judges_its_own_lag(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """From ``cron_schedule="*/5 * * * *"`` every table carries a time-window policy (fail 10
    min, warn 7.5) and its own ``dpone_fresh`` beside ``dpone_slot_healthy``. The first run (an
    initial copy, no transaction yet) and a run that applies a change committed seconds before
    it both pass with a lag from the run's read of the source, not from the change's commit;
    the recorded lag judged 8 minutes on warns, 11 minutes on fails."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_fresh_tgt")
    pg.execute(src, SHOP)
    slot = f"dpone_fresh_{uuid.uuid4().hex[:8]}"
    shop = replication_assets(
        ["shop.orders", "shop.customers"], slot=slot, cron_schedule="*/5 * * * *"
    )
    for spec in shop.specs:
        policy = spec.freshness_policy
        assert isinstance(policy, dg.FreshnessPolicy)
        assert policy.fail_window.to_timedelta() == timedelta(minutes=10)  # type: ignore[attr-defined]
        assert policy.warn_window.to_timedelta() == timedelta(minutes=7.5)  # type: ignore[attr-defined]
    assert {(k.asset_key, k.name) for k in shop.check_keys} == {
        (key, name)
        for key in (ORDERS, CUSTOMERS)
        for name in (SLOT_CHECK_NAME, FRESH_CHECK_NAME, CHECK_NAME)
    }
    instance = dg.DagsterInstance.ephemeral()

    first = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    assert first.success
    fresh = fresh_by_key(first)
    assert set(fresh) == {ORDERS, CUSTOMERS}
    for key, evaluation in fresh.items():
        md = values(evaluation.metadata)
        assert evaluation.passed, evaluation.description
        assert md["dpone/lag_seconds"] == table_metadata(first, key)["dpone/lag_seconds"]
        assert 0 <= md["dpone/lag_seconds"] < 60
        assert (md["dpone/fail_after_seconds"], md["dpone/warn_after_seconds"]) == (600.0, 450.0)

    pg.execute(src, "UPDATE shop.orders SET note = 'changed' WHERE id = 1")
    committed = time.monotonic()
    time.sleep(5)  # the change is 5 s old when the run reads the source
    second = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    age = time.monotonic() - committed
    assert second.success
    assert table_metadata(second, ORDERS)["dpone/rows_updated"] == 1
    fresh = fresh_by_key(second)
    lag = values(fresh[ORDERS].metadata)["dpone/lag_seconds"]
    assert all(e.passed for e in fresh.values()), [e.description for e in fresh.values()]
    assert lag < age - 4, (lag, age)  # from the run's read (after the sleep), not the commit

    # The recorded lag judged later (Dagster's clock does not move in a test; the check's does).
    recorded = instance.get_latest_materialization_event(ORDERS)
    assert recorded is not None and recorded.asset_materialization is not None
    at = datetime.fromtimestamp(recorded.timestamp, UTC)
    policy = shop.specs_by_key[ORDERS].freshness_policy
    assert policy is not None
    metadata = recorded.asset_materialization.metadata
    later = freshness_check(ORDERS, metadata, policy, reported_at=at, now=at + timedelta(minutes=8))
    assert not later.passed and later.severity == dg.AssetCheckSeverity.WARN
    much_later = freshness_check(
        ORDERS, metadata, policy, reported_at=at, now=at + timedelta(minutes=11)
    )
    assert not much_later.passed and much_later.severity == dg.AssetCheckSeverity.ERROR
    assert "exceeds 600 s" in (much_later.description or "")


def test_a_group_stopped_by_its_budget_is_as_old_as_its_newest_applied_commit(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """With a policy of the user's (fail after 1 minute, Dagster's least) and
    ``max_changes_per_run=1``: two transactions committed 6 s before the run; the run applies
    the first and stops, and every table's lag is that commit's age (at least 6 s), so its
    recorded materialization judged 55 s after the report fails (``ERROR``); once a run drains
    the slot (the next applies the second, the one after finds nothing), its lag is from its
    own read, and judged 55 s on it still passes."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_fresh_tgt")
    pg.execute(src, SHOP)
    slot = f"dpone_budget_{uuid.uuid4().hex[:8]}"
    policy = dg.FreshnessPolicy.time_window(fail_window=timedelta(minutes=1))
    shop = replication_assets(
        ["shop.orders", "shop.customers"],
        slot=slot,
        max_changes_per_run=1,
        freshness_policy=policy,
    )
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize([shop], resources=resources(src, tgt), instance=instance).success

    def judged_later(key: dg.AssetKey) -> dg.AssetCheckResult:
        """The latest recorded materialization of ``key`` judged 55 s after it was reported."""
        event = instance.get_latest_materialization_event(key)
        assert event is not None and event.asset_materialization is not None
        at = datetime.fromtimestamp(event.timestamp, UTC)
        return freshness_check(
            key, event.asset_materialization.metadata, policy,
            reported_at=at, now=at + timedelta(seconds=55),
        )  # fmt: skip

    pg.execute(src, "INSERT INTO shop.orders VALUES (6, 2, 'first')")
    pg.execute(src, "INSERT INTO shop.orders VALUES (7, 2, 'second')")
    time.sleep(6)
    behind = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    assert behind.success
    md = table_metadata(behind, ORDERS)
    assert md["dpone/budget_reached"] is True and md["dpone/rows_inserted"] == 1
    fresh = fresh_by_key(behind)
    assert set(fresh) == {ORDERS, CUSTOMERS}
    for key, evaluation in fresh.items():
        assert values(evaluation.metadata)["dpone/lag_seconds"] >= 6
        later = judged_later(key)
        assert not later.passed and later.severity == dg.AssetCheckSeverity.ERROR
        assert "exceeds 60 s" in (later.description or "")

    rest = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    assert rest.success and table_metadata(rest, ORDERS)["dpone/rows_inserted"] == 1
    drained = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    assert drained.success
    md = table_metadata(drained, ORDERS)
    assert md["dpone/budget_reached"] is False and md["dpone/transactions"] == 0
    assert all(e.passed for e in fresh_by_key(drained).values())
    for key in (ORDERS, CUSTOMERS):
        assert judged_later(key).passed, judged_later(key).description


def test_a_group_without_a_schedule_or_policy_has_neither_and_a_bad_schedule_fails_at_load() -> (
    None
):
    """No option: no policy and no ``dpone_fresh`` (``dpone_slot_healthy`` and
    ``dpone_reconciled`` only); a schedule Dagster cannot read is refused when the definitions
    load with ``replication_options_invalid``."""
    plain = replication_assets(["shop.orders", "shop.customers"])
    assert all(s.freshness_policy is None for s in plain.specs)
    assert {k.name for k in plain.check_keys} == {SLOT_CHECK_NAME, CHECK_NAME}
    with pytest.raises(DponeError) as caught:
        replication_assets(["shop.orders"], cron_schedule="every minute")
    assert caught.value.code == "replication_options_invalid"
    assert "every minute" in caught.value.message
