"""The cursor engine's one table check: one refusal vocabulary, each refusal with the code its
policy always gave, and nothing written when it refuses."""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import Backfill, prepare_target
from dpone_dagster.core import ENGINE_ERRORS, EngineError
from dpone_dagster.core.errors import TABLE_REFUSALS, RefusalColumn, TableRefusal
from dpone_dagster.incremental import IncrementalOptions, IncrementalSync
from dpone_dagster.postgres import TableName
from tests.helpers import pg
from tests.incremental.conftest import Stream


def test_each_refusal_keeps_the_code_its_policy_always_gave() -> None:
    assert {r.name: TABLE_REFUSALS[r] for r in TableRefusal} == {
        "SOURCE_MISSING": ("plan_invalid", "table_not_found"),
        "CURSOR_MISSING": ("cursor_not_found", "cursor_not_found"),
        "CURSOR_TYPE": ("plan_invalid", "incremental_cursor_invalid"),
        "PRIMARY_KEY": ("plan_invalid", "incremental_primary_key_missing"),
        "CURSOR_INDEX": ("plan_invalid", "incremental_cursor_unindexed"),
        "TARGET_KEY": ("destination_expansion_incomplete", "incremental_target_key_differs"),
        "CURSOR_NULL": ("plan_invalid", "incremental_cursor_null"),
        "TARGET_NOT_READY": (
            "destination_expansion_incomplete", "destination_expansion_incomplete",
        ),
    }  # fmt: skip
    codes = {TABLE_REFUSALS[r][c] for r in TableRefusal for c in RefusalColumn}
    assert codes <= set(ENGINE_ERRORS), sorted(codes - set(ENGINE_ERRORS))


def refused(call: object) -> EngineError:
    with pytest.raises(EngineError) as info:
        call()  # type: ignore[operator]
    assert info.value.message and info.value.next_actions
    return info.value


def test_a_missing_source_table_is_refused_with_each_policys_code_and_nothing_written(
    stream: Stream,
) -> None:
    missing = TableName("shop", "missing")
    backfill = Backfill(stream.source, stream.target, missing, cursor="updated_at")
    error = refused(backfill.plan)
    assert error.code == "plan_invalid" and "shop.missing does not exist" in error.message
    assert refused(lambda: prepare_target(stream.source, stream.target, missing, missing,
                                          "updated_at")).code == "plan_invalid"  # fmt: skip
    options = IncrementalOptions(reconcile=False)
    sync = IncrementalSync(stream.source, stream.target, missing, cursor="updated_at",
                           options=options)  # fmt: skip
    error = refused(sync.run)
    assert error.code == "table_not_found" and "shop.missing does not exist" in error.message
    assert not pg.table_exists(stream.target, "shop", "missing")
    assert pg.fetch_one(stream.target, "SELECT count(*) FROM dpone_ledger.backfill_runs") == 0
    streams = "SELECT count(*) FROM dpone_ledger.incremental_streams"
    assert not pg.table_exists(stream.target, "dpone_ledger", "incremental_streams") or (
        pg.fetch_one(stream.target, streams) == 0
    )


@pytest.mark.parametrize(
    ("cursor", "ddl"),
    [
        ("note", ""),
        ("amount", ""),
        ("updated_at", "ALTER TABLE shop.orders DROP CONSTRAINT orders_pkey"),
    ],
    ids=["cursor-type", "cursor-index", "primary-key"],
)
def test_prepare_target_refuses_the_source_the_plan_refuses_and_creates_nothing(
    stream: Stream, cursor: str, ddl: str
) -> None:
    if ddl:
        pg.execute(stream.source, ddl)
    orders = TableName("shop", "orders")
    error = refused(lambda: prepare_target(stream.source, stream.target, orders, orders, cursor))
    assert error.code == "plan_invalid"
    assert not pg.table_exists(stream.target, "shop", "orders")
