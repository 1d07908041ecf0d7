"""A code for every failure: every psycopg error class maps to a code of the one catalog, and
every entry point (snapshot copy, backfill, incremental stream), under real faults (a source
role without SELECT, a target schema that takes no tables, a target statement canceled by its
statement_timeout, a cursor that is no column), fails with a DponeFailure whose code is
catalogued: never a bare exception."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import psycopg
import pytest

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    backfill_asset,
    cursor_range_partitions,
    incremental_asset,
    snapshot_copy_assets,
)
from dpone_dagster.backfill import Backfill
from dpone_dagster.backfill.target import prepare_target
from dpone_dagster.core.errors import ENGINE_ERRORS
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, NEXT_ACTIONS_KEY
from dpone_dagster.incremental import IncrementalOptions, IncrementalSync
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.connection import SESSION_ERRORS
from dpone_dagster.postgres.failures import DATABASE_ERRORS, database_error
from dpone_dagster.snapshot_copy import copy_tables
from tests.dagster.test_least_privilege import (
    LEDGER_GRANTS,
    SOURCE_GRANTS,
    TARGET_GRANTS,
    Roles,
    respond,
    rest_asset,
    rest_resources,
    roles_with,
)
from tests.helpers import pg
from tests.helpers.http_api import ApiServer
from tests.incremental.conftest import insert_orders

CATALOG = {**ENGINE_ERRORS, **DATABASE_ERRORS}
ORDERS = TableName("shop", "orders")
TARGET = TableName("analytics", "orders")


def psycopg_error_classes() -> list[type[psycopg.Error]]:
    return sorted(
        (
            cls
            for _, cls in inspect.getmembers(psycopg.errors, inspect.isclass)
            if issubclass(cls, psycopg.Error)
        ),
        key=lambda cls: cls.__name__,
    )


def test_every_psycopg_error_class_maps_to_a_catalogued_code_and_every_code_is_reached() -> None:
    reached: set[str] = set()
    for cls in psycopg_error_classes():
        for side in ("source", "target"):
            error = database_error(cls("permission denied for table orders"), side)  # type: ignore[arg-type]
            assert isinstance(error, DponeError), cls
            assert error.code in DATABASE_ERRORS, (cls, error.code)
            assert error.code.startswith(side), (cls, error.code)
            assert error.next_actions, (cls, error.code)
            reached.add(error.code)
    statements = set(DATABASE_ERRORS) - set(SESSION_ERRORS)  # sessions: tests/tls, test_unreachable
    assert reached == statements, sorted(statements - reached)


def test_a_privilege_error_names_the_privilege_the_object_and_the_grant() -> None:
    exc = psycopg.errors.InsufficientPrivilege("permission denied for table orders")
    error = database_error(exc, "source", known=[ORDERS])
    assert error.code == "source_permission_denied"
    assert "SELECT on table shop.orders" in error.message, error.message
    assert any("GRANT SELECT ON TABLE shop.orders TO" in a for a in error.next_actions)
    owner = psycopg.errors.InsufficientPrivilege("must be owner of table orders")
    error = database_error(owner, "target", known=[TARGET])
    assert error.code == "target_permission_denied"
    assert any("ALTER TABLE analytics.orders OWNER TO" in a for a in error.next_actions)


# -- every entry point under real faults ---------------------------------------------------------

Build = Callable[[], list[Any]]
ENTRY_POINTS: dict[str, tuple[Build, dict[str, Any]]] = {
    "snapshot_copy_assets": (
        lambda: [
            snapshot_copy_assets(
                [{"source": "shop.orders", "target": "analytics.orders"}], sink="merge"
            )
        ],
        {},
    ),
    "backfill_asset": (
        lambda: [
            backfill_asset(
                "shop.orders",
                cursor="id",
                partitions_def=cursor_range_partitions(0, 500, 500),
                target_table="analytics.orders",
            )
        ],
        {"partition_key": "0..500"},
    ),
    "incremental_asset": (
        lambda: [
            incremental_asset("shop.orders", cursor="updated_at", target_table="analytics.orders")
        ],
        {},
    ),
}


def failure_of(
    roles: Roles, entry: str, *, target_timeout_ms: int = 0
) -> tuple[str, str, list[str]]:
    """Materializes ``entry``; asserts it failed with a DponeFailure (no bare exception) and
    returns its code, message and next actions."""
    build, kwargs = ENTRY_POINTS[entry]
    resources = {
        "source": PostgresSourceResource(dsn=roles.source),
        "target": PostgresTargetResource(dsn=roles.target, statement_timeout_ms=target_timeout_ms),
        "ledger": LedgerResource(),
    }
    result = dg.materialize(build(), resources=resources, raise_on_error=False, **kwargs)
    assert not result.success
    [failure] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
    assert failure.user_failure_data is not None, failure.error  # a bare exception otherwise
    metadata = failure.user_failure_data.metadata
    code = str(metadata[ERROR_CODE_KEY].value)
    assert code in CATALOG, code
    actions = str(metadata[NEXT_ACTIONS_KEY].value)
    assert failure.error is not None
    return code, failure.error.message, actions.splitlines()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_source_role_without_select_is_source_permission_denied_and_nothing_is_created(
    source_dsn: str, target_dsn: str, entry: str
) -> None:
    no_select = [g for g in SOURCE_GRANTS if "SELECT" not in g]
    with roles_with(source_dsn, target_dsn, source_grants=no_select) as roles:
        code, message, actions = failure_of(roles, entry)
        assert code == "source_permission_denied", message
        assert "SELECT on table shop.orders" in message, message
        assert any("GRANT SELECT ON TABLE shop.orders TO" in a for a in actions), actions
        assert not pg.table_exists(target_dsn, "analytics", "orders")
        assert pg.staging_tables(target_dsn) == []


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_target_schema_that_takes_no_tables_is_target_permission_denied(
    source_dsn: str, target_dsn: str, entry: str
) -> None:
    usage_only = [
        g.replace("USAGE, CREATE ON SCHEMA analytics", "USAGE ON SCHEMA analytics")
        for g in TARGET_GRANTS
    ]
    with roles_with(source_dsn, target_dsn, target_grants=[*usage_only, *LEDGER_GRANTS]) as roles:
        code, message, actions = failure_of(roles, entry)
        assert code == "target_permission_denied", message
        assert "CREATE on schema analytics" in message, message
        assert any("GRANT CREATE ON SCHEMA analytics TO" in a for a in actions), actions
        assert not pg.table_exists(target_dsn, "analytics", "orders")


@contextmanager
def target_locked_for_writes(roles: Roles) -> Iterator[None]:
    """An existing target the role may write, held in SHARE mode by another session (reads
    pass, every write waits): the role's statement_timeout cancels the write."""
    pg.execute(
        roles.target_admin,
        "CREATE TABLE analytics.orders (id bigint PRIMARY KEY,"
        " updated_at timestamptz NOT NULL, note text, amount numeric(12, 2));"
        " CREATE INDEX ON analytics.orders (updated_at)",
    )
    role = psycopg.conninfo.conninfo_to_dict(roles.target)["user"]
    pg.execute(roles.target_admin, f"GRANT SELECT, INSERT, UPDATE ON analytics.orders TO {role}")
    with psycopg.connect(roles.target_admin, application_name="dpone-test-holder") as holder:
        holder.execute("LOCK TABLE analytics.orders IN SHARE MODE")
        yield


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_target_statement_canceled_mid_run_is_target_query_canceled(
    source_dsn: str, target_dsn: str, entry: str
) -> None:
    with roles_with(source_dsn, target_dsn) as roles, target_locked_for_writes(roles):
        code, message, _ = failure_of(roles, entry, target_timeout_ms=1500)
        assert code == "target_query_canceled", message
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM analytics.orders") == 0
    assert pg.staging_tables(target_dsn) == []


def test_a_backfill_cursor_that_is_no_column_is_cursor_not_found_at_plan_time(
    source_dsn: str, target_dsn: str
) -> None:
    with roles_with(source_dsn, target_dsn) as roles:
        with pytest.raises(DponeError) as caught:
            prepare_target(roles.source, roles.target, ORDERS, TARGET, "nope")
        assert caught.value.code == "cursor_not_found"
        assert "'updated_at'" in caught.value.message  # the table's columns are listed
        with pytest.raises(DponeError) as caught:
            Backfill(roles.source, roles.target, ORDERS, cursor="nope", target_table=TARGET).plan()
        assert caught.value.code == "cursor_not_found"
        asset = backfill_asset(
            "shop.orders",
            cursor="nope",
            target_table="analytics.orders",
            partitions_def=cursor_range_partitions(0, 500, 500),
        )
        result = dg.materialize(
            [asset], resources=roles.resources(), partition_key="0..500", raise_on_error=False
        )
        [failure] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
        assert failure.user_failure_data is not None, failure.error
        assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "cursor_not_found"
        assert not pg.table_exists(target_dsn, "analytics", "orders")


def test_the_domain_entry_points_raise_coded_errors_too(source_dsn: str, target_dsn: str) -> None:
    no_select = [g for g in SOURCE_GRANTS if "SELECT" not in g]
    with roles_with(source_dsn, target_dsn, source_grants=no_select) as roles:
        calls: list[Callable[[], object]] = [
            lambda: copy_tables(roles.source, roles.target, [(ORDERS, TARGET)]),
            lambda: Backfill(
                roles.source, roles.target, ORDERS, cursor="id", target_table=TARGET
            ).plan(),
            lambda: IncrementalSync(
                roles.source,
                roles.target,
                ORDERS,
                cursor="updated_at",
                target_table=TARGET,
                options=IncrementalOptions(reconcile=False),
            ).run(),
            lambda: prepare_target(roles.source, roles.target, ORDERS, TARGET, "id"),
        ]
        for call in calls:
            with pytest.raises(DponeError) as caught:
                call()
            assert caught.value.code == "source_permission_denied", caught.value


def locking_assets(entry: str, *, second: bool) -> list[Any]:
    """The assets of ``entry``; with ``second``, as the run that needs a strong lock builds them."""
    if entry == "snapshot_copy_assets":  # the swap's DROP and RENAME
        return [snapshot_copy_assets([{"source": "shop.orders", "target": "analytics.orders"}])]
    # incremental_asset: the ALTER of a column the source gained; incremental_soft_deletes: the
    # ALTER adding the soft-delete column to a target streamed without it so far.
    deletes = "soft" if entry == "incremental_soft_deletes" and second else "ignore"
    return [incremental_asset("shop.orders", cursor="updated_at", deletes=deletes,
                              target_table="analytics.orders")]  # fmt: skip


@pytest.mark.parametrize(
    "entry", ["snapshot_copy_assets", "incremental_asset", "incremental_soft_deletes"]
)
def test_a_reader_holding_the_target_gives_target_lock_timeout_at_the_resources_lock_wait(
    source_dsn: str, target_dsn: str, entry: str
) -> None:
    with roles_with(source_dsn, target_dsn) as roles:
        resources = roles.resources()
        assert dg.materialize(locking_assets(entry, second=False), resources=resources).success
        added = "_dpone_deleted_at" if entry == "incremental_soft_deletes" else "channel"
        if added == "channel":
            pg.execute(roles.source_admin, "ALTER TABLE shop.orders ADD COLUMN channel text")
        insert_orders(roles.source_admin, 501, 10)
        resources["target"] = PostgresTargetResource(dsn=roles.target, lock_wait=2)
        with psycopg.connect(roles.target_admin, application_name="dpone-test-holder") as holder:
            holder.execute("SELECT count(*) FROM analytics.orders").fetchone()
            assets = locking_assets(entry, second=True)
            result = dg.materialize(assets, resources=resources, raise_on_error=False)
        [failure] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
        assert failure.user_failure_data is not None, failure.error
        metadata = failure.user_failure_data.metadata
        assert metadata[ERROR_CODE_KEY].value == "target_lock_timeout"
        assert failure.error is not None and "dpone-test-holder" in failure.error.message
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM analytics.orders") == 500
        assert not pg.fetch_one(
            target_dsn, "SELECT count(*) FROM pg_attribute WHERE attname = %s"
            " AND attrelid = 'analytics.orders'::regclass", (added,),
        )  # fmt: skip


def test_a_privilege_postgresql_refuses_mid_run_is_coded_too(
    source_dsn: str, target_dsn: str
) -> None:
    """No plan-time check covers the reconciliation's temporary table: PostgreSQL's refusal,
    raised after the copy committed, is still ``target_permission_denied`` with its GRANT."""
    no_temporary = [g.replace("CONNECT, TEMPORARY", "CONNECT") for g in TARGET_GRANTS]
    with roles_with(source_dsn, target_dsn, target_grants=[*no_temporary, *LEDGER_GRANTS]) as roles:
        code, message, actions = failure_of(roles, "snapshot_copy_assets")
        assert code == "target_permission_denied", message
        assert "TEMPORARY on database" in message, message
        assert any("GRANT TEMPORARY ON DATABASE" in a for a in actions), actions


def test_a_generic_sources_load_into_a_schema_that_takes_no_tables_is_coded(
    source_dsn: str, target_dsn: str
) -> None:
    usage_only = [g.replace("USAGE, CREATE ON SCHEMA analytics", "USAGE ON SCHEMA analytics")
                  for g in TARGET_GRANTS]  # fmt: skip
    with (
        roles_with(source_dsn, target_dsn, target_grants=usage_only) as roles,
        ApiServer(respond) as server,
    ):
        result = dg.materialize(
            [rest_asset()], resources=rest_resources(roles, server), raise_on_error=False
        )
    [failure] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
    assert failure.user_failure_data is not None, failure.error
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "target_permission_denied"
    assert not pg.table_exists(target_dsn, "analytics", "items")


def test_a_target_schema_to_create_without_database_create_is_target_permission_denied(
    source_dsn: str, target_dsn: str
) -> None:
    """Only a schema that does not exist needs the database's CREATE; its GRANT is named."""
    connect_only = [g for g in TARGET_GRANTS if "DATABASE" in g]
    with (
        roles_with(source_dsn, target_dsn, target_grants=connect_only) as roles,
        pytest.raises(DponeError) as caught,
    ):
        copy_tables(roles.source, roles.target, [(ORDERS, TableName("fresh", "orders"))])
    assert caught.value.code == "target_permission_denied"
    assert "CREATE on database" in caught.value.message, caught.value.message
    assert any("CREATE SCHEMA fresh;" in a for a in caught.value.next_actions)
    assert not pg.fetch_one(target_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'fresh'")
