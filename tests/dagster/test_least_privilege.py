"""Every entry point runs with roles holding exactly the grants the privileges table lists
(docs/production.md), and nothing more (the databases' default grants to PUBLIC revoked): a
snapshot copy (created, then swapped, then merged with a new column), a backfill, an incremental
stream and a generic source's load (REST) into the target.

The grants below ARE the table of docs/production.md (``Privileges``): a grant a
feature needs but the table forgot fails here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pytest
from pydantic import BaseModel

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    backfill_asset,
    cursor_range_partitions,
    incremental_asset,
    rest_copy_asset,
    snapshot_copy_assets,
)
from dpone_dagster.dagster.resources import RestSourceResource
from dpone_dagster.sources import PageNumberPagination, RestRead, SourceCopyOptions
from tests.helpers import pg
from tests.helpers.http_api import ApiServer, Reply, Request
from tests.helpers.roles import as_role, role_with
from tests.incremental.conftest import ORDERS, insert_orders

SOURCE_GRANTS = (
    "GRANT CONNECT ON DATABASE {db} TO {role}",
    "GRANT USAGE ON SCHEMA shop TO {role}",
    "GRANT SELECT ON shop.orders TO {role}",
)
"""The source, for every feature: read the tables (snapshot copy, backfill, incremental)."""
TARGET_GRANTS = (
    "GRANT CONNECT, TEMPORARY ON DATABASE {db} TO {role}",
    "GRANT USAGE, CREATE ON SCHEMA analytics TO {role}",
)
"""The target: create the tables (it then owns them: a swap or an ALTER needs ownership) and
the staging tables, in an existing schema; no database CREATE. TEMPORARY: the reconciliation
of a merge or append stages keys in a temporary table."""
LEDGER_GRANTS = ("GRANT USAGE, CREATE ON SCHEMA dpone_ledger TO {role}",)
"""The ledger (backfill, incremental), an existing schema: create its tables once, then write
them (the role owns them)."""


@dataclass(frozen=True)
class Roles:
    """A source and a target DSN logging in as roles with exactly the grants above."""

    source: str
    target: str
    source_admin: str
    target_admin: str

    def resources(self) -> dict[str, Any]:
        return {
            "source": PostgresSourceResource(dsn=self.source),
            "target": PostgresTargetResource(dsn=self.target),
            "ledger": LedgerResource(),
        }


@contextmanager
def roles_with(
    source_dsn: str,
    target_dsn: str,
    source_grants: Sequence[str] = SOURCE_GRANTS,
    target_grants: Sequence[str] = (*TARGET_GRANTS, *LEDGER_GRANTS),
) -> Iterator[Roles]:
    """``shop.orders`` (500 rows) in the source, schemas ``analytics`` and ``dpone_ledger`` in
    the target, and a role on each side holding exactly the grants given."""
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 500)
    pg.execute(target_dsn, "CREATE SCHEMA analytics; CREATE SCHEMA dpone_ledger")
    with (
        role_with({source_dsn: source_grants}) as reader,
        role_with({target_dsn: target_grants}) as writer,
    ):
        yield Roles(
            as_role(source_dsn, reader), as_role(target_dsn, writer), source_dsn, target_dsn
        )


@pytest.fixture
def roles(source_dsn: str, target_dsn: str) -> Iterator[Roles]:
    with roles_with(source_dsn, target_dsn) as made:
        yield made


def materialize(assets: list[Any], roles: Roles, **kwargs: Any) -> dg.ExecuteInProcessResult:
    result = dg.materialize(assets, resources=roles.resources(), raise_on_error=False, **kwargs)
    failures = [e.event_specific_data for e in result.all_events if e.is_step_failure]
    assert result.success, failures
    return result


def source_rows(roles: Roles) -> list[tuple[object, ...]]:
    return pg.fetch_all(roles.source_admin, "SELECT id, note, amount FROM shop.orders ORDER BY 1")


def target_rows(roles: Roles, table: str) -> list[tuple[object, ...]]:
    return pg.fetch_all(roles.target_admin, f"SELECT id, note, amount FROM {table} ORDER BY 1")


def test_a_snapshot_copy_creates_swaps_and_evolves_with_the_least_privileges(roles: Roles) -> None:
    specs = [{"source": "shop.orders", "target": "analytics.orders"}]
    materialize([snapshot_copy_assets(specs, sink="replace")], roles)  # created
    insert_orders(roles.source_admin, 501, 100)
    materialize([snapshot_copy_assets(specs, sink="replace")], roles)  # swapped
    assert target_rows(roles, "analytics.orders") == source_rows(roles)
    pg.execute(roles.source_admin, "ALTER TABLE shop.orders ADD COLUMN channel text")
    insert_orders(roles.source_admin, 601, 50)
    materialize([snapshot_copy_assets(specs, sink="merge")], roles)  # merged, and evolved
    assert target_rows(roles, "analytics.orders") == source_rows(roles)
    assert pg.fetch_one(
        roles.target_admin, "SELECT count(*) FROM analytics.orders WHERE channel IS NULL"
    ) == len(source_rows(roles))


def test_a_backfill_runs_and_reconciles_with_the_least_privileges(roles: Roles) -> None:
    asset = backfill_asset(
        "shop.orders", cursor="id", partitions_def=cursor_range_partitions(0, 500, 500),
        batch_size=200, target_table="analytics.orders",
    )  # fmt: skip
    materialize([asset], roles, partition_key="0..500")
    assert target_rows(roles, "analytics.orders") == source_rows(roles)


def test_an_incremental_stream_runs_twice_with_the_least_privileges(roles: Roles) -> None:
    asset = incremental_asset(
        "shop.orders", cursor="updated_at", target_table="analytics.orders", deletes="soft"
    )
    materialize([asset], roles)
    insert_orders(roles.source_admin, 501, 30)
    pg.execute(roles.source_admin, "DELETE FROM shop.orders WHERE id <= 10")
    materialize([asset], roles)
    live = "_dpone_deleted_at IS NULL"
    assert pg.fetch_all(
        roles.target_admin,
        f"SELECT id, note, amount FROM analytics.orders WHERE {live} ORDER BY 1",
    ) == source_rows(roles)


class Item(BaseModel):
    id: int
    name: str


def rest_asset() -> dg.AssetsDefinition:
    """A REST source's asset into ``analytics.items`` (the generic sources' target side)."""
    return rest_copy_asset(
        key="items", target_table="analytics.items", options=SourceCopyOptions(primary_key=["id"]),
        read=RestRead(
            path="/items", model=Item, records_path="data", pagination=PageNumberPagination()
        ),
    )  # fmt: skip


def respond(request: Request) -> Reply:
    page = int(request.query["page"])
    return Reply({"data": [{"id": page, "name": f"p{page}"}] if page <= 3 else []})


def rest_resources(roles: Roles, server: ApiServer) -> dict[str, Any]:
    return {
        "rest": RestSourceResource(base_url=server.url),
        "target": PostgresTargetResource(dsn=roles.target),
    }


def test_a_generic_sources_load_runs_with_the_least_privileges(roles: Roles) -> None:
    with ApiServer(respond) as server:
        for _ in range(2):  # created, then swapped
            assert dg.materialize([rest_asset()], resources=rest_resources(roles, server)).success
    rows = pg.fetch_all(roles.target_admin, "SELECT id, name FROM analytics.items ORDER BY id")
    assert rows == [(1, "p1"), (2, "p2"), (3, "p3")]
