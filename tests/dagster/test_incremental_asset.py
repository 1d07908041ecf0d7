"""incremental_asset materialized through Dagster, asserting on the target, the metadata and the
dpone_reconciled check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest

from dpone_dagster import IncrementalOptions, incremental_asset
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.lifecycle import DponeError
from tests.helpers import pg
from tests.incremental.conftest import ORDERS, Stream, insert_orders

KEY = dg.AssetKey(["shop", "orders"])


def resources(source_dsn: str, target_dsn: str, **ledger: Any) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(**ledger),
    }


@pytest.fixture
def stream(source_dsn: str, target_dsn: str) -> Stream:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 2000)
    return Stream(source_dsn, target_dsn)


def _materialize(
    stream: Stream, asset: dg.AssetsDefinition, **ledger: Any
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [asset], resources=resources(stream.source, stream.target, **ledger), raise_on_error=False
    )


def _proved_at(md: dict[str, Any]) -> datetime:
    """A check's ``dpone/proved_at``: a timestamp metadata value (seconds since the epoch)."""
    value = md["dpone/proved_at"]
    assert isinstance(value, float)
    return datetime.fromtimestamp(value, UTC)


def _same_time(text: str, at: datetime) -> bool:
    """``text`` (ISO 8601) names ``at`` (a float timestamp keeps microseconds to about one)."""
    return abs((datetime.fromisoformat(text) - at).total_seconds()) < 1e-5


def _metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    [event] = result.asset_materializations_for_node(result.job_def.nodes[0].name)
    return {k: getattr(v, "value", v) for k, v in event.metadata.items()}


def test_runs_copy_changes_late_rows_and_deletes_with_metadata_and_the_check(
    stream: Stream,
) -> None:
    orders = incremental_asset("shop.orders", cursor="updated_at", deletes="hard", batch_size=700)
    first = _materialize(stream, orders)
    assert first.success
    md = _metadata(first)
    assert md["dagster/row_count"] == 2000 and md["dpone/rows_inserted"] == 2000
    assert md["dpone/batches"] == 3 and "dpone/old_mark" not in md  # no mark yet: left out
    assert md["dpone/snapshot_label"] == "several_snapshots"
    assert isinstance(md["dpone/lag_seconds"], float)
    [check] = first.get_asset_check_evaluations()
    assert check.check_name == CHECK_NAME and check.passed
    stream.assert_equal()

    pg.execute(stream.source, "UPDATE shop.orders SET note = 'c', updated_at = now() WHERE id <= 5")
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id BETWEEN 100 AND 109")
    second = _materialize(stream, orders)
    assert second.success
    md = _metadata(second)
    assert (md["dpone/rows_updated"], md["dpone/rows_deleted"], md["dpone/rows_inserted"]) == (
        5,
        10,
        0,
    )
    assert md["dagster/row_count"] == 1990
    assert md["dpone/old_mark"] < md["dpone/new_mark"]
    assert md["dpone/snapshot_label"] == "single_snapshot"
    observations = [e for e in second.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert len(observations) == 1
    assert second.get_asset_check_evaluations()[0].passed
    stream.assert_equal()


SCANS = (
    "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
    " WHERE relid = 'shop.orders'::regclass"
)
CLIENTS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)


def _scans(target: str) -> int:
    """The scans of the target table the server counted, once every other session of its
    database has ended (a session reports its statistics before it leaves pg_stat_activity)."""
    pg.wait_until(lambda: pg.fetch_one(target, CLIENTS) == 0, timeout=30,
                  what="the target's sessions end")  # fmt: skip
    return int(str(pg.fetch_one(target, SCANS)))


def test_a_run_with_nothing_to_do_reports_the_row_count_without_reading_the_table(
    stream: Stream,
) -> None:
    """``dagster/row_count`` of a run with nothing to do comes from the ledger: the target's scan
    counters do not move (a ``count(*)`` moves them by one)."""
    # The check reads its slice of the table by design (its budget): left out here.
    orders = incremental_asset(
        "shop.orders", cursor="updated_at", options=IncrementalOptions(reconcile=False)
    )
    assert _materialize(stream, orders).success
    pg.execute(stream.source, "UPDATE shop.orders SET note = 'c', updated_at = now() WHERE id <= 5")
    insert_orders(stream.source, 5001, 3)
    changed = _materialize(stream, orders)
    assert _metadata(changed)["dagster/row_count"] == 2003
    before = _scans(stream.target)
    idle = _materialize(stream, orders)
    assert idle.success and _metadata(idle)["dagster/row_count"] == 2003
    assert _scans(stream.target) == before  # no scan of the target, by index or heap
    assert pg.fetch_one(stream.target, "SELECT count(*) FROM shop.orders") == 2003
    assert _scans(stream.target) == before + 1  # what a count would have left


def test_bad_input_fails_at_definition_time_or_with_a_stable_code(stream: Stream) -> None:
    with pytest.raises(DponeError) as info:
        incremental_asset("shop.orders", cursor="updated_at", deletes="everything")  # type: ignore[arg-type]
    assert info.value.code == "incremental_options_invalid"
    with pytest.raises(ValueError, match="identifier_invalid"):
        incremental_asset("shop.", cursor="updated_at")
    pg.execute(stream.source, "DROP INDEX shop.orders_updated_at")
    result = _materialize(stream, incremental_asset("shop.orders", cursor="updated_at"))
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failure.step_failure_data
    assert data is not None and data.user_failure_data is not None
    code = data.user_failure_data.metadata[ERROR_CODE_KEY]
    assert getattr(code, "value", code) == "incremental_cursor_unindexed"
    assert not pg.table_exists(stream.target, "shop", "orders")


def test_a_ledger_in_another_database_is_refused(stream: Stream, make_database: Any) -> None:
    other = make_database("dpone_led")
    result = _materialize(stream, incremental_asset("shop.orders", cursor="updated_at"), dsn=other)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failure.step_failure_data
    assert data is not None and data.user_failure_data is not None
    code = data.user_failure_data.metadata[ERROR_CODE_KEY]
    assert getattr(code, "value", code) == "incremental_options_invalid"
    assert not pg.table_exists(stream.target, "shop", "orders")
    assert not pg.table_exists(other, "dpone_ledger", "incremental_streams")


def test_a_column_added_between_runs_is_listed_and_the_check_stays_green(stream: Stream) -> None:
    orders = incremental_asset("shop.orders", cursor="updated_at")
    assert _materialize(stream, orders).success
    pg.execute(
        stream.source,
        "ALTER TABLE shop.orders ADD channel text NOT NULL DEFAULT 'web';"
        " UPDATE shop.orders SET channel = 'shop', updated_at = now() WHERE id <= 10",
    )
    freeze = IncrementalOptions(schema_changes="freeze")
    frozen = _materialize(stream, incremental_asset("shop.orders", cursor="updated_at",
                                                    options=freeze))  # fmt: skip
    failure = frozen.failure_data_for_node(frozen.job_def.nodes[0].name)
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "schema_change_incompatible"
    evolved = _materialize(stream, orders)
    assert evolved.success
    [change] = _metadata(evolved)["dpone/schema_changes"]
    assert (change["column"], change["kind"], change["after"]) == (
        "channel", "added", "text DEFAULT 'web'::text",
    )  # fmt: skip
    [check] = evolved.get_asset_check_evaluations()
    assert check.passed, check.description
    stream.assert_equal()


def test_the_check_alone_copies_nothing_and_verifies_what_the_target_holds(stream: Stream) -> None:
    orders = incremental_asset("shop.orders", cursor="updated_at", deletes="hard", batch_size=700)
    only_check = dg.AssetSelection.checks(dg.AssetCheckKey(KEY, CHECK_NAME))

    def check_alone() -> tuple[bool, dict[str, Any]]:
        result = dg.materialize(
            [orders], resources=resources(stream.source, stream.target), selection=only_check
        )
        assert result.success
        assert not result.asset_materializations_for_node(result.job_def.nodes[0].name)
        [check] = result.get_asset_check_evaluations()
        severities.append(check.severity)
        return check.passed, {k: getattr(v, "value", v) for k, v in check.metadata.items()}

    severities: list[dg.AssetCheckSeverity] = []
    # No run yet: nothing verified, and said with a warning, never a pass.
    assert check_alone() == (False, {"dpone/verified": False})
    assert severities == [dg.AssetCheckSeverity.WARN]
    assert not pg.table_exists(stream.target, "shop", "orders")
    assert _materialize(stream, orders).success
    pg.execute(stream.source, "UPDATE shop.orders SET note = 'c', updated_at = now() WHERE id <= 5")
    insert_orders(stream.source, 5001, 3)
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id BETWEEN 100 AND 109")
    state = pg.fetch_all(stream.target, "SELECT state_json FROM dpone_ledger.incremental_streams")
    rows = pg.table_fingerprint(stream.target, "shop", "orders")
    passed, md = check_alone()
    assert passed and md["dpone/verified"] is True
    assert (md["dpone/changed_since_mark"], md["dpone/deleted_kept"], md["dpone/unexplained"]) == (
        8,
        10,
        0,
    )
    assert pg.table_fingerprint(stream.target, "shop", "orders") == rows  # nothing copied
    assert pg.fetch_all(
        stream.target, "SELECT state_json FROM dpone_ledger.incremental_streams"
    ) == (state)
    pg.execute(stream.target, "UPDATE shop.orders SET note = 'tampered' WHERE id = 42")
    passed, md = check_alone()
    assert not passed
    assert (md["dpone/unexplained"], md["dpone/examples"]) == (1, [["42"]])


def test_the_default_check_says_what_it_verified_run_by_run(stream: Stream) -> None:
    from dpone_dagster.incremental import Sweep

    pg.execute(stream.source, "ANALYZE shop.orders")  # the estimate the ranges come from
    orders = incremental_asset(
        "shop.orders", cursor="updated_at", options=IncrementalOptions(sweep=Sweep(rows=500))
    )

    def run() -> tuple[bool, dict[str, Any]]:
        result = _materialize(stream, orders)
        assert result.success
        [check] = result.get_asset_check_evaluations()
        return check.passed, {k: getattr(v, "value", v) for k, v in check.metadata.items()}

    passed, md = run()
    assert passed and md["dpone/check_scope"] == "run" and md["dpone/keys_checked"] == 2000
    assert (md["dpone/ranges_checked"], md["dpone/ranges_total"]) == (1, 4)
    assert 0 < md["dpone/check_seconds"] < 60  # the comparisons' own time, plotted run by run
    assert "dpone/swept_at" not in md  # an empty value is left out
    begun = _proved_at(md)  # a timestamp value: the check's point in time
    prefix = "this run exact; table not yet swept (sweep begun at "
    assert md["dpone/guarantee"].startswith(prefix) and md["dpone/guarantee"].endswith(")")
    assert _same_time(md["dpone/guarantee"][len(prefix) : -1], begun)
    pg.execute(stream.target, "UPDATE shop.orders SET note = 'tampered' WHERE id = 1700")
    pg.execute(stream.source, "UPDATE shop.orders SET note = 'c', updated_at = now() WHERE id = 3")
    passed, md = run()  # keys (500, 1000]: the tampered row is not claimed
    assert passed and md["dpone/keys_checked"] == 1
    assert _same_time(md["dpone/sweep_started_at"], begun)
    passed, md = run()  # (1000, 1500]
    assert passed and md["dpone/keys_checked"] == 0
    passed, md = run()  # (1500, +inf): the last range, caught; that sweep is no full sweep
    assert not passed and (md["dpone/unexplained"], md["dpone/examples"]) == (1, [["1700"]])
    assert "dpone/swept_at" not in md and "dpone/sweep_started_at" not in md
    pg.execute(stream.target, "UPDATE shop.orders SET note = 'n1700' WHERE id = 1700")
    for _ in range(4):  # repaired: a clean sweep, range by range
        passed, md = run()
        assert passed
    assert _same_time(md["dpone/swept_at"], _proved_at(md))
    assert "dpone/sweep_started_at" not in md
    assert md["dpone/guarantee"] == f"this run exact; table swept at {md['dpone/swept_at']}"


def test_a_check_names_the_ranges_and_keys_that_differ_and_repair_rewrites_only_them(
    stream: Stream,
) -> None:
    from dpone_dagster.incremental import Sweep

    sweep = Sweep(rows=500)  # slices (-inf, 500], (500, 1000], ...
    options = IncrementalOptions(sweep=sweep)
    plain = incremental_asset("shop.orders", cursor="updated_at", options=options)
    mending = incremental_asset(
        "shop.orders", cursor="updated_at", options=options.replace(repair=True)
    )

    def run(asset: dg.AssetsDefinition) -> tuple[bool, dict[str, Any]]:
        result = _materialize(stream, asset)
        assert result.success
        [check] = result.get_asset_check_evaluations()
        assert isinstance(check.metadata["dpone/proved_at"], dg.TimestampMetadataValue)
        return check.passed, {k: getattr(v, "value", v) for k, v in check.metadata.items()}

    assert run(plain)[0]
    pg.execute(stream.target, "UPDATE shop.orders SET note = 'x' WHERE id IN (600, 900)")
    passed, md = run(plain)
    assert not passed and (md["dpone/unexplained"], md["dpone/examples"]) == (2, [["600"], ["900"]])
    assert md["dpone/differing_ranges"] == [{"after": ["500"], "through": ["1000"]}]
    assert "dpone/repaired_keys" not in md
    versions = dict(pg.fetch_all(stream.target, "SELECT id, xmin::text FROM shop.orders"))
    passed, md = run(mending)
    assert passed and (md["dpone/repaired_keys"], md["dpone/repaired_rows"]) == (2, 2)
    assert md["dpone/repaired_ranges"] == [{"after": ["500"], "through": ["1000"]}]
    now = dict(pg.fetch_all(stream.target, "SELECT id, xmin::text FROM shop.orders"))
    assert {k for k, v in now.items() if versions.get(k) != v} == {600, 900}
    stream.assert_equal()
    passed, md = run(plain)
    assert passed and "dpone/repaired_keys" not in md


def test_repair_without_the_check_is_refused_when_definitions_load() -> None:
    with pytest.raises(DponeError) as caught:
        incremental_asset(
            "shop.orders",
            cursor="updated_at",
            options=IncrementalOptions(reconcile=False, repair=True),
        )
    assert caught.value.code == "incremental_options_invalid"


def _declared(asset: dg.AssetsDefinition) -> tuple[Any, ...]:
    """What a definition declares: its specs, checks, op and tags."""
    [spec] = asset.specs
    checks = sorted(c.name for c in asset.check_specs)
    return (spec.key, dict(spec.metadata), spec.freshness_policy, spec.group_name, checks,
            asset.op.name, dict(asset.op.tags))  # fmt: skip


def test_the_old_keyword_arguments_build_the_same_asset_with_a_deprecation_warning(
    stream: Stream,
) -> None:
    from dpone_dagster.incremental import Sweep

    with pytest.warns(DeprecationWarning, match=r"incremental_asset\(\.\.\., reconcile, sweep="):
        old = incremental_asset(
            "shop.orders", cursor="updated_at", deletes="hard", reconcile=False,
            sweep=Sweep(rows=500), cron_schedule="*/5 * * * *",
        )  # fmt: skip
    new = incremental_asset(
        "shop.orders", cursor="updated_at", deletes="hard", cron_schedule="*/5 * * * *",
        options=IncrementalOptions(reconcile=False, sweep=Sweep(rows=500)),
    )  # fmt: skip
    assert _declared(old) == _declared(new)
    assert "dpone_reconciled" not in _declared(old)[4]  # reconcile=False reached the options
    with pytest.raises(TypeError, match="unexpected keyword argument 'verify'"):
        incremental_asset("shop.orders", cursor="updated_at", verify=True)
    result = _materialize(stream, old)
    assert result.success
    assert {c.check_name for c in result.get_asset_check_evaluations()} == {"dpone_fresh"}
    stream.assert_equal()


def test_the_resource_methods_old_keyword_arguments_run_with_a_deprecation_warning(
    stream: Stream,
) -> None:
    from dpone_dagster.dagster.metadata import DponeMetadataSet

    names = DponeMetadataSet(source_table="shop.orders", table="shop.orders", cursor="updated_at")

    # `context` unannotated: this module's annotations are strings, which Dagster refuses there.
    @dg.asset(key=KEY, metadata=dict(names))
    def orders(context, source: PostgresSourceResource, target: PostgresTargetResource) -> Any:
        yield from source.incremental(context, target=target, deletes="hard", batch_size=700)

    with pytest.warns(DeprecationWarning, match=r"incremental\(\.\.\., batch_size, deletes="):
        first = _materialize(stream, orders)
    assert first.success and _metadata(first)["dpone/batches"] == 3  # batch_size=700
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id BETWEEN 100 AND 109")
    with pytest.warns(DeprecationWarning, match="options=IncrementalOptions"):
        second = _materialize(stream, orders)
    assert _metadata(second)["dpone/rows_deleted"] == 10  # deletes="hard"
    stream.assert_equal()

    @dg.asset(key=KEY, metadata=dict(names))
    def misspelt(context, source: PostgresSourceResource, target: PostgresTargetResource) -> Any:
        yield from source.incremental(context, target=target, deletes="everything")

    with pytest.warns(DeprecationWarning, match="deletes="):
        failed = _materialize(stream, misspelt)
    failure = failed.failure_data_for_node(failed.job_def.nodes[0].name)
    assert failure is not None and failure.user_failure_data is not None
    assert failure.user_failure_data.metadata[ERROR_CODE_KEY].value == "incremental_options_invalid"


def test_a_yaml_stream_entry_resolves_into_the_same_options_object() -> None:
    from dpone_dagster.dagster.components.postgres_copy.models import IncrementalStreamModel
    from dpone_dagster.incremental import Sweep

    entry = IncrementalStreamModel(
        table="shop.orders", cursor="updated_at", deletes="soft", lookback_seconds=30,  # type: ignore[arg-type]
        sweep_rows=500, check="full", repair=True, fillfactor=100,  # type: ignore[arg-type]
    )  # fmt: skip
    assert entry.options() == IncrementalOptions(
        deletes="soft", lookback=timedelta(seconds=30), sweep=Sweep(rows=500), check="full",
        repair=True, fillfactor=100,
    )  # fmt: skip
    assert IncrementalStreamModel(table="shop.orders", cursor="id").options() == (
        IncrementalOptions()
    )
    with pytest.raises(DponeError) as caught:
        IncrementalStreamModel(table="shop.orders", cursor="id", sweep_rows=0).options()
    assert caught.value.code == "incremental_options_invalid"
