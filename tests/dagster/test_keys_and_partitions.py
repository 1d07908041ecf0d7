"""Asset keys for any PostgreSQL name, range partitions, and failures with stable codes."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest
from pydantic import ValidationError

from dpone_dagster.dagster.failures import (
    ERROR_CODE_KEY,
    NEXT_ACTIONS_KEY,
    DponeFailure,
    dagster_failures,
)
from dpone_dagster.dagster.partitions import (
    PartitionError,
    cursor_range_partitions,
    parse_range_key,
    partition_cursor_range,
)
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator, key_part
from dpone_dagster.lifecycle import DponeError

HOSTILE = ["orders", "Orders", "Order Items", "order items", 'a"b', "a;--", "заказы", "заказ"]


def test_every_name_maps_to_a_valid_distinct_key_part() -> None:
    parts = [key_part(name) for name in HOSTILE]
    assert all(dg.AssetKey([p]).to_python_identifier() for p in parts)
    assert len(set(parts)) == len(HOSTILE), "different names must get different keys"
    assert key_part("orders") == "orders" and key_part("Orders") == "Orders"
    assert [key_part(n) for n in HOSTILE] == parts, "the mapping is deterministic"


def test_hostile_names_load_as_assets_and_keep_their_exact_name() -> None:
    translator = DponeTranslator()
    sources = ['"s p"."Order Items"', '"s p"."a""b;--"', '"s p"."заказы"']
    specs = [translator.get_asset_spec(CopyTableSpec(source=s)) for s in sources]
    defs = dg.Definitions(assets=specs)
    keys = {spec.key for spec in defs.resolve_all_asset_specs()}
    assert dg.AssetKey([key_part("s p"), key_part("Order Items")]) in keys
    assert dg.AssetKey(["source", key_part("s p"), key_part("Order Items")]) in keys
    assert len(keys) == 6  # three copies and their three source tables
    assert [s.metadata["dpone/table"] for s in specs] == sources


def test_a_spec_can_rename_the_target_and_rejects_bad_names_at_load() -> None:
    spec = CopyTableSpec(source="sales.orders", target='analytics."Orders Copy"')
    assert DponeTranslator(key_prefix=("wh",)).get_asset_key(spec) == dg.AssetKey(
        ["wh", "analytics", key_part("Orders Copy")]
    )
    with pytest.raises(ValidationError) as err:
        CopyTableSpec(source="sales.order items")
    assert "identifier_invalid" in str(err.value)
    with pytest.raises(ValidationError, match="Unterminated"):
        CopyTableSpec.coerce('"unterminated')


def test_cursor_range_partitions_encode_lower_exclusive_upper_inclusive_ranges() -> None:
    parts = cursor_range_partitions(-100, 250, 100)
    assert parts.get_partition_keys() == ["-100..0", "0..100", "100..200", "200..250"]
    assert parse_range_key("-100..0").lower == -100
    rng = partition_cursor_range(parts, "200..250")
    assert (rng.lower, rng.upper) == (200, 250)
    with pytest.raises(PartitionError) as err:
        cursor_range_partitions(10, 10, 1)
    assert err.value.code == "plan_invalid"
    for bad in ["1-2", "5..5", "9..3", "a..b"]:
        with pytest.raises(PartitionError):
            parse_range_key(bad)


def test_time_window_partitions_give_timestamp_ranges() -> None:
    daily = dg.DailyPartitionsDefinition(start_date="2026-01-01")
    rng = partition_cursor_range(daily, "2026-01-02")
    assert rng.lower == datetime(2026, 1, 1, 23, 59, 59, 999999, tzinfo=UTC)
    assert rng.upper == datetime(2026, 1, 2, 23, 59, 59, 999999, tzinfo=UTC)


def test_domain_errors_become_failures_with_code_and_next_actions() -> None:
    with pytest.raises(DponeFailure) as raised, dagster_failures():
        raise DponeError("backfill_checkpoint_stale", "stale", ["Reload the run."])
    failure = raised.value
    assert failure.code == "backfill_checkpoint_stale"
    assert isinstance(failure, dg.Failure)
    assert failure.metadata[ERROR_CODE_KEY].value == "backfill_checkpoint_stale"
    assert "Reload the run." in str(failure.metadata[NEXT_ACTIONS_KEY].value)
