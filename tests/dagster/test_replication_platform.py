"""Replication as a platform runs it, through Dagster against real servers: the cron written
once drives the schedule and the freshness, a run's one log line, the transactions holding the
slot back named by the run and its ``dpone_slot_healthy`` check, and a refused first run that
writes nothing to the target."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import psycopg
import pytest

from dpone_dagster import replication_assets
from dpone_dagster.dagster.assets import replication_schedule
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.metadata.freshness import FRESH_CHECK_NAME
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.metadata.replication import SLOT_CHECK_NAME
from dpone_dagster.lifecycle import DponeError
from tests.dagster.test_replication_assets import SHOP, resources, table_metadata, unique_slot
from tests.helpers import pg
from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
    drop_logical_database,
    logical_server,
    logical_source_dsn,
    make_logical_database,
)
from tests.helpers.private_server import BUSY, MB, checkpoint, private_server, write_wal

ORDERS = dg.AssetKey(["shop", "orders"])
CUSTOMERS = dg.AssetKey(["shop", "customers"])


def values(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def checks_of(result: dg.ExecuteInProcessResult, name: str) -> dict[dg.AssetKey, Any]:
    """Each table's evaluation of the check ``name`` (exactly one per table)."""
    found = [e for e in result.get_asset_check_evaluations() if e.check_name == name]
    by_key = {e.asset_key: e for e in found}
    assert len(by_key) == len(found), found
    return by_key


def run_lines(instance: dg.DagsterInstance, run_id: str, prefix: str) -> list[str]:
    """The run's log messages (from its event log) that start with ``prefix``."""
    return [
        e.user_message
        for e in instance.all_logs(run_id)
        if e.user_message.startswith(prefix) and not e.is_dagster_event
    ]


def test_one_cron_string_drives_the_schedule_and_the_freshness(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """``cron_schedule="*/5 * * * *"`` given once: ``replication_schedule`` is a schedule on that
    cron, and every table's freshness policy is the one it implies (fail 10 min, warn 7.5). The
    schedule's tick requests a run of its job, which materializes every table of the group with
    its checks (``dpone_fresh`` passing); a group built without a cron has no schedule to give
    (``replication_options_invalid`` when the definitions load)."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_cron_tgt")
    pg.execute(src, SHOP)
    cron = "*/5 * * * *"
    shop = replication_assets(["shop.orders", "shop.customers"], slot=unique_slot("dpone_cron"),
                              cron_schedule=cron)  # fmt: skip
    schedule = replication_schedule(shop)
    assert schedule.cron_schedule == cron
    assert schedule.name == f"{shop.node_def.name}_schedule"
    for spec in shop.specs:
        policy = spec.freshness_policy
        assert isinstance(policy, dg.FreshnessPolicy)
        assert policy.fail_window.to_timedelta() == timedelta(minutes=10)  # type: ignore[attr-defined]
        assert policy.warn_window.to_timedelta() == timedelta(minutes=7.5)  # type: ignore[attr-defined]
    defs = dg.Definitions(assets=[shop], schedules=[schedule], resources=resources(src, tgt))
    instance = dg.DagsterInstance.ephemeral()
    tick = datetime(2026, 12, 5, 10, 5, tzinfo=UTC)
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=tick) as context:
        [request] = schedule.evaluate_tick(context).run_requests or []
    job = defs.resolve_job_def(schedule.job_name)
    result = job.execute_in_process(instance=instance, run_config=request.run_config,
                                    tags=request.tags)  # fmt: skip
    assert result.success
    assert {e.asset_key for e in result.get_asset_materialization_events()} == {ORDERS, CUSTOMERS}
    fresh = checks_of(result, FRESH_CHECK_NAME)
    assert set(fresh) == {ORDERS, CUSTOMERS} and all(e.passed for e in fresh.values())
    assert set(checks_of(result, SLOT_CHECK_NAME)) == {ORDERS, CUSTOMERS}
    assert pg.fetch_one(tgt, "SELECT count(*) FROM shop.orders") == 5

    unscheduled = replication_assets(["shop.orders"], slot=unique_slot("dpone_nocron"))
    with pytest.raises(DponeError) as caught:
        replication_schedule(unscheduled)
    assert caught.value.code == "replication_options_invalid"
    assert "cron_schedule" in caught.value.message


def test_a_run_writes_one_log_line_with_its_changes_lag_retained_wal_and_verdicts(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """A run that applies inserts, an update, a delete and a ``TRUNCATE`` writes one line to
    its log (read back from the run's event log): each table's changes, the lag, the WAL the
    slot retains and each check's verdict, the figures the same as its metadata's. A table's
    truncates are counted as ``dpone/truncates`` (and, for one release, under the old
    ``dpone/rows_truncated``: statements, not rows)."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_log_tgt")
    pg.execute(src, SHOP)
    slot = unique_slot("dpone_log")
    shop = replication_assets(["shop.orders", "shop.customers"], slot=slot)
    instance = dg.DagsterInstance.ephemeral()
    first = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    assert first.success
    [copied] = run_lines(instance, first.run_id, "dpone: replication slot")
    assert "applied 0 source transaction(s)" in copied
    pg.execute(src, "INSERT INTO shop.orders VALUES (6, 1, 'new'), (7, 2, 'new')")
    pg.execute(src, "UPDATE shop.orders SET note = 'changed' WHERE id = 1")
    pg.execute(src, "DELETE FROM shop.orders WHERE id = 2")
    pg.execute(src, "TRUNCATE shop.customers")
    second = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
    assert second.success
    [line] = run_lines(instance, second.run_id, "dpone: replication slot")
    orders, customers = table_metadata(second, ORDERS), table_metadata(second, CUSTOMERS)
    assert (customers["dpone/truncates"], customers["dpone/rows_truncated"]) == (1, 1)
    assert orders["dpone/truncates"] == 0 and customers["dpone/slot_held_seconds"] == 0
    assert line.startswith(f"dpone: replication slot {slot}: applied 4 source transaction(s)")
    assert "shop.orders: inserted 2, updated 1, deleted 1, truncates 0" in line
    assert "shop.customers: inserted 0, updated 0, deleted 0, truncates 1" in line
    assert f"lag {orders['dpone/lag_bytes']} bytes, {orders['dpone/lag_seconds']:.3f} s" in line
    assert f"slot retains {orders['dpone/retained_wal_bytes']} bytes of WAL (reserved)" in line
    verdicts = f"checks: {SLOT_CHECK_NAME}: passed on 2; {CHECK_NAME}: passed on 2"
    assert line.endswith(verdicts), line


def _catalog(dsn: str) -> list[tuple[object, ...]]:
    """Every schema and relation of the database but the system's."""
    return pg.fetch_all(
        dsn,
        "SELECT n.nspname, c.relname FROM pg_namespace n LEFT JOIN pg_class c"
        " ON c.relnamespace = n.oid WHERE n.nspname NOT LIKE 'pg\\_%%'"
        " AND n.nspname <> 'information_schema' ORDER BY 1, 2",
    )


def test_a_first_run_refused_writes_nothing_to_the_target(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """A group whose table has no key and no ``REPLICA IDENTITY FULL`` is refused at its first
    run with ``replica_identity_missing``: the target's catalog is as it was (no
    ``dpone_ledger`` schema, no table), and the source has no slot and no publication."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_refused_tgt")
    pg.execute(src, "CREATE SCHEMA shop; CREATE TABLE shop.history (at timestamptz, note text)")
    slot = unique_slot("dpone_refused")
    before = _catalog(tgt)
    shop = replication_assets(["shop.history"], slot=slot)
    result = dg.materialize([shop], resources=resources(src, tgt), raise_on_error=False)
    assert not result.success
    [failure] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
    assert failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "replica_identity_missing"
    assert _catalog(tgt) == before
    assert not pg.table_exists(tgt, "dpone_ledger", "replication_groups")
    assert pg.fetch_one(src, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,)) == 0  # fmt: skip
    assert pg.fetch_one(src, "SELECT count(*) FROM pg_publication") == 0


# -- an open transaction holding the slot, on a server of the test's own -------------------------


@pytest.fixture(scope="module")
def private_source() -> Iterator[str]:
    with private_server("dpone_held_by_") as dsn:
        yield dsn


def test_an_open_transaction_holding_the_slot_is_named_by_the_run_and_its_check(
    private_source: str, make_database: Any
) -> None:
    """A session of another database of the source writes a row and stays idle in its
    transaction. The run still applies what committed; its materializations name the holder
    (``dpone/slot_held_by``: pid, database, state, age, its statement with the literal masked;
    ``dpone/slot_held_seconds``), its log line names the pid, and ``dpone_slot_healthy`` warns
    naming it with the next actions (end it, ``idle_in_transaction_session_timeout``,
    ``max_slot_wal_keep_size``). Once the session ends, the next run's check passes and the
    slot retains under 16 MB."""
    src = pg.create_database("dpone_held_src", private_source)
    other = pg.create_database("dpone_held_other", private_source)
    tgt = make_database("dpone_held_tgt")
    holder: psycopg.Connection[tuple[object, ...]] | None = None
    try:
        pg.execute(src, SHOP + ";" + BUSY)
        pg.execute(other, BUSY)
        shop = replication_assets(["shop.orders", "shop.customers"], slot="dpone_held_by")
        instance = dg.DagsterInstance.ephemeral()
        assert dg.materialize([shop], resources=resources(src, tgt), instance=instance).success
        holder = psycopg.connect(other, application_name="nightly report")
        began = time.monotonic()
        holder.execute("INSERT INTO public.busy (pad) VALUES ('card 4111 1111')")
        pg.execute(src, "UPDATE shop.orders SET note = 'while held' WHERE id <= 3")
        write_wal([src, other], 5 * MB)
        checkpoint(src)
        held = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
        held_for = time.monotonic() - began  # the holder's age can be no more than this
        assert held.success
        assert table_metadata(held, ORDERS)["dpone/rows_updated"] == 3
        pid = holder.info.backend_pid
        _assert_named(held, instance, pid, other, held_for)
        holder.commit()
        holder.close()
        checkpoint(src)
        released = dg.materialize([shop], resources=resources(src, tgt), instance=instance)
        slot_checks = checks_of(released, SLOT_CHECK_NAME)
        assert all(e.passed for e in slot_checks.values())
        md = table_metadata(released, ORDERS)
        assert "dpone/slot_held_by" not in md and md["dpone/slot_held_seconds"] == 0
        assert md["dpone/retained_wal_bytes"] < 16 * MB
    finally:
        if holder is not None:
            holder.close()
        drop_logical_database(src)
        drop_logical_database(other)


def _assert_named(
    result: dg.ExecuteInProcessResult,
    instance: dg.DagsterInstance,
    pid: int,
    other: str,
    held_for: float,
) -> None:
    """The run names the holding session ``pid`` of the database ``other`` everywhere, its
    age at most ``held_for`` seconds (the test's own clock from before its transaction began
    to after the run)."""
    database = str(psycopg.conninfo.conninfo_to_dict(other)["dbname"])
    md = table_metadata(result, ORDERS)
    [holder] = md["dpone/slot_held_by"]
    assert (holder["pid"], holder["database"], holder["state"]) == (
        pid, database, "idle in transaction"
    )  # fmt: skip
    assert holder["application_name"] == "nightly report" and holder["seconds"] > 0
    assert holder["query"] == "INSERT INTO public.busy (pad) VALUES ('…')"
    assert holder["xact_start"] is not None
    assert 0 < holder["seconds"] <= held_for
    assert md["dpone/slot_held_seconds"] == holder["seconds"]  # the oldest (and only) holder
    for key, evaluation in checks_of(result, SLOT_CHECK_NAME).items():
        assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN, key
        text = evaluation.description or ""
        assert f"pid {pid}" in text and f"database {database}" in text, text
        assert "4111" not in text
        actions = values(evaluation.metadata)["dpone/next_actions"]
        for action in ("pg_terminate_backend", "idle_in_transaction_session_timeout",
                       "max_slot_wal_keep_size"):  # fmt: skip
            assert action in text and action in actions, action
    [line] = run_lines(instance, result.run_id, "dpone: replication slot")
    assert f"held back by pid {pid}" in line
    assert f"{SLOT_CHECK_NAME}: WARN on 2" in line
