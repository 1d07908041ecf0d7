"""Every entry point, with each server down and with a login the server refuses.

A server is "down" when nothing listens on its port (a bound socket that never listens: the
connection is refused at once). A login is refused for real by the server: the test server
trusts local users, so a wrong password alone would be accepted; a role that does not exist is
refused with the same kind of ``FATAL`` error a wrong password gets. Each entry point must fail
with the side's stable code (``<side>_unreachable``, ``<side>_login_failed``) and next actions,
leave no transaction open and no staging table behind.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox
from psycopg import conninfo
from pydantic import BaseModel

from dpone_dagster import (
    LedgerResource,
    PostgresCopyComponent,
    PostgresSourceResource,
    PostgresTargetResource,
    RestSourceResource,
    backfill_asset,
    build_extraction_job,
    cursor_range_partitions,
    rest_copy_asset,
    snapshot_copy_assets,
)
from dpone_dagster.backfill import Backfill
from dpone_dagster.core import LedgerConfig
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, NEXT_ACTIONS_KEY
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.snapshot_copy import copy_tables
from tests.helpers import pg
from tests.helpers.http_api import ApiServer, Reply

APP = "dpone-test-unreachable"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "postgres_copy" / "defs.yaml"
FAULTS = ["down", "refused"]


@pytest.fixture
def down() -> Iterator[str]:
    """A DSN whose port is bound but never listens: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        yield f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=3"


def refused(dsn: str) -> str:
    """``dsn`` with a role the server refuses to log in (and a password it never checks)."""
    return conninfo.make_conninfo(dsn, user="dpone_no_such_role", password="wrong")


def broken(fault: str, good: str, down: str) -> str:
    return down if fault == "down" else refused(good)


def code_of(fault: str, side: str) -> str:
    return f"{side}_unreachable" if fault == "down" else f"{side}_login_failed"


def failure(result: dg.ExecuteInProcessResult) -> tuple[str, str]:
    """The code and next actions of the run's failed step."""
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data.user_failure_data
            assert data is not None, event.step_failure_data.error
            return str(data.metadata[ERROR_CODE_KEY].value), str(
                data.metadata[NEXT_ACTIONS_KEY].value
            )
    raise AssertionError("no step failed")


def nothing_left_open(*dsns: str) -> None:
    for dsn in dsns:
        assert not pg.open_transactions(dsn), dsn
        staging = r"SELECT count(*) FROM pg_class WHERE relname LIKE '\_dpone\_stg\_%%'"
        assert pg.fetch_one(dsn, staging) == 0, dsn


@pytest.fixture
def shop(source_dsn: str) -> str:
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=300)
    return source_dsn


def sides(side: str, fault: str, source: str, target: str, down: str) -> tuple[str, str]:
    bad = broken(fault, source if side == "source" else target, down)
    return (bad, target) if side == "source" else (source, bad)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("side", ["source", "target"])
def test_snapshot_copy_assets(shop: str, target_dsn: str, down: str, side: str, fault: str) -> None:
    source, target = sides(side, fault, shop, target_dsn, down)
    result = dg.materialize(
        [snapshot_copy_assets(["shop.orders"])],
        resources={
            "source": PostgresSourceResource(dsn=source, application_name=APP),
            "target": PostgresTargetResource(dsn=target, application_name=APP),
        },
        raise_on_error=False,
    )
    code, actions = failure(result)
    assert code == code_of(fault, side)
    assert "DSN" in actions
    nothing_left_open(shop, target_dsn)
    assert not pg.table_exists(target_dsn, "shop", "orders")


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("side", ["source", "target", "ledger"])
def test_backfill_asset(shop: str, target_dsn: str, down: str, side: str, fault: str) -> None:
    source, target = (
        sides(side, fault, shop, target_dsn, down) if side != "ledger" else (shop, target_dsn)
    )
    # A ledger DSN naming the target's own database is the default ledger, whatever its user
    # (tests/dagster/test_ledger_in_target.py): the refused ledger names a database of its own.
    elsewhere = pg.with_db(target_dsn, "dpone_ledger_elsewhere")
    ledger = broken(fault, elsewhere, down) if side == "ledger" else None
    asset = backfill_asset(
        "shop.orders", cursor="id", partitions_def=cursor_range_partitions(0, 300, 300)
    )
    result = dg.materialize(
        [asset],
        partition_key="0..300",
        resources={
            "source": PostgresSourceResource(dsn=source, application_name=APP),
            "target": PostgresTargetResource(dsn=target, application_name=APP),
            "ledger": LedgerResource(dsn=ledger),
        },
        raise_on_error=False,
    )
    assert failure(result)[0] == code_of(fault, side)
    nothing_left_open(shop, target_dsn)
    if side != "target" and pg.table_exists(target_dsn, "shop", "orders"):
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders") == 0


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("side", ["source", "target"])
def test_build_extraction_job(shop: str, target_dsn: str, down: str, side: str, fault: str) -> None:
    source, target = sides(side, fault, shop, target_dsn, down)
    defs = dg.Definitions(
        jobs=[build_extraction_job("shop.orders")],
        resources={
            "source": PostgresSourceResource(dsn=source, application_name=APP),
            "target": PostgresTargetResource(dsn=target, application_name=APP),
        },
    )
    result = defs.resolve_job_def("extract_shop__orders").execute_in_process(raise_on_error=False)
    assert failure(result)[0] == code_of(fault, side)
    nothing_left_open(shop, target_dsn)


@pytest.mark.parametrize("fault", FAULTS)
def test_the_component(
    shop: str, target_dsn: str, down: str, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_SOURCE_DSN", broken(fault, shop, down))
    monkeypatch.setenv("DPONE_TARGET_DSN", target_dsn)
    contents = yaml.safe_load(EXAMPLE.read_text())
    contents["attributes"]["snapshot_copies"] = [{"tables": ["shop.orders"], "group_name": "shop"}]
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=PostgresCopyComponent, defs_yaml_contents=contents
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            job = dg.define_asset_job("copy", selection=dg.AssetSelection.groups("shop"))
            runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
            result = runnable.resolve_job_def("copy").execute_in_process(raise_on_error=False)
    assert failure(result)[0] == code_of(fault, "source")
    nothing_left_open(shop, target_dsn)


class Item(BaseModel):
    id: int


@pytest.mark.parametrize("fault", FAULTS)
def test_a_generic_source_asset(target_dsn: str, down: str, fault: str) -> None:
    with ApiServer(lambda _: Reply([{"id": 1}])) as api:
        asset = rest_copy_asset(key="items", target_table="raw.items", path="/items", model=Item)
        result = dg.materialize(
            [asset],
            resources={
                "rest": RestSourceResource(base_url=api.url),
                "target": PostgresTargetResource(dsn=broken(fault, target_dsn, down)),
            },
            raise_on_error=False,
        )
        assert failure(result)[0] == code_of(fault, "target")
        assert api.requests == [], "the source is not read when the target cannot be reached"
    nothing_left_open(target_dsn)


def domain_code(call: Callable[[], Any]) -> str:
    with pytest.raises(DponeError) as raised:
        call()
    assert raised.value.next_actions
    return raised.value.code


@pytest.mark.parametrize("fault", FAULTS)
def test_the_domain_entry_points(shop: str, target_dsn: str, down: str, fault: str) -> None:
    bad = broken(fault, shop, down)
    assert domain_code(lambda: copy_tables(bad, target_dsn, "shop.orders")) == code_of(
        fault, "source"
    )
    assert domain_code(lambda: copy_tables(shop, bad, "shop.orders")) == code_of(fault, "target")
    pg.create_mixed_table(target_dsn, "shop", "orders", rows=0)
    for side, source, target, ledger in (
        ("source", bad, target_dsn, None),
        ("target", shop, bad, None),
        ("ledger", shop, target_dsn, bad),
    ):
        backfill = Backfill(
            source, target, "shop.orders", cursor="id", ledger=LedgerConfig(dsn=ledger)
        )
        assert domain_code(backfill.run) == code_of(fault, side)
    nothing_left_open(shop, target_dsn)
