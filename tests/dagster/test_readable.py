"""What a person reads, through dagster.materialize against the real server (issue 26, points 3
and 4): metadata rounded to what it means and never empty, observation keys apart from the
materialization's, a summary and plottable numbers on every check, descriptions from the
source's ``COMMENT ON``, run tags that hold for the whole run with a short checkpoint, and
failures whose first line holds the code, the message and the first next action."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dpone_dagster.dagster.assets import backfill_asset, incremental_asset, snapshot_copy_assets
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.resources.sessions import InvalidDsnWarning
from tests.helpers import pg

ROOT = Path(__file__).resolve().parents[2]
COMMENTS = """
COMMENT ON TABLE shop.orders IS 'One row per order the shop took.';
COMMENT ON COLUMN shop.orders.amount IS 'What the customer paid, in euros.';
COMMENT ON COLUMN shop.orders.label IS '';
"""


def resources(source_dsn: str, target_dsn: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }


@pytest.fixture
def orders(source_dsn: str) -> str:
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=900)
    pg.execute(source_dsn, COMMENTS)
    return source_dsn


def assert_readable(metadata: dict[str, Any], where: str) -> None:
    """No empty value; seconds to the millisecond; rates as whole numbers."""
    for key, value in metadata.items():
        raw = getattr(value, "value", value)
        assert raw not in ("", None), (where, key)
        if key.endswith("_per_second"):
            assert isinstance(value, dg.IntMetadataValue), (where, key)
        if key.startswith("dpone/seconds_") or key.endswith("_seconds"):
            assert isinstance(raw, float) and round(raw, 3) == raw, (where, key, raw)


def assert_described(metadata: dict[str, Any]) -> None:
    """The table's comment as ``dpone/description``, each commented column's in the schema."""
    assert metadata["dpone/description"].value == "One row per order the shop took."
    columns = {c.name: c for c in metadata["dagster/column_schema"].schema.columns}
    assert columns["amount"].description == "What the customer paid, in euros."
    assert columns["id"].description is None  # no comment, no description
    assert columns["label"].description is None  # COMMENT ... IS '' drops the comment


def test_a_snapshot_copy_reads_rounded_unempty_described_and_its_check_summarized(
    orders: str, target_dsn: str
) -> None:
    result = dg.materialize([snapshot_copy_assets(["shop.orders"])], resources=resources(
        orders, target_dsn
    ))  # fmt: skip
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = dict(event.materialization.metadata)
    assert_readable(metadata, "copy")
    assert_described(metadata)
    assert "dpone/copy_format_reason" not in metadata  # binary COPY: no reason to give
    [check] = result.get_asset_check_evaluations()
    assert check.passed and check.description
    assert "\n" not in check.description
    assert_readable(dict(check.metadata), "check")
    assert check.metadata["dpone/source_rows"] == dg.MetadataValue.int(900)


def test_a_backfill_run_reads_whole_run_tags_apart_observations_and_a_check_summary(
    orders: str, target_dsn: str, tmp_path: Path
) -> None:
    parts = cursor_range_partitions(0, 900, 300)
    asset = backfill_asset("shop.orders", cursor="id", partitions_def=parts, batch_size=100)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [asset], resources=resources(orders, target_dsn), instance=instance,
            tags={
                "dagster/asset_partition_range_start": "0..300",
                "dagster/asset_partition_range_end": "600..900",
            },
        )  # fmt: skip
        assert result.success
        tags = instance.get_run_by_id(result.run_id).tags  # type: ignore[union-attr]
    # The tags hold for the run: every partition done, the rows of all three, a short digest.
    assert tags["dpone/partitions_done"] == "3 of 3"
    assert tags["dpone/copied"] == "900"
    assert re.fullmatch(r"sha256:[0-9a-f]{12}", tags["dpone/checkpoint"]), tags
    materializations = [e.materialization for e in result.get_asset_materialization_events()]
    assert len(materializations) == 3
    figures: set[str] = set()
    for materialization in materializations:
        metadata = dict(materialization.metadata)
        assert_readable(metadata, f"partition {materialization.partition}")
        assert_described(metadata)
        figures |= set(metadata)
    observations = [
        e.asset_observation_data.asset_observation
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    ]
    assert len(observations) == 9, "three batches of 100 rows per partition"
    for observation in observations:
        keys = {k for k in observation.metadata if k.startswith("dpone/")}
        assert keys and all(k.startswith("dpone/progress_") for k in keys), keys
        assert not keys & figures, "an observation's keys plot apart from the partition's"
        assert_readable(dict(observation.metadata), "observation")
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == CHECK_NAME and check.passed
    assert check.description is not None and "\n" not in check.description
    assert check.description.startswith("3 partition(s) checked"), check.description
    assert check.metadata["dpone/partitions_checked"] == dg.MetadataValue.int(3)
    assert check.metadata["dpone/partitions_differing"] == dg.MetadataValue.int(0)
    assert isinstance(check.metadata["dpone/ranges_proven"], dg.IntMetadataValue)
    assert check.metadata["dpone/ranges_proven"].value == 9


def test_an_incremental_run_reads_described_and_its_observations_apart(
    orders: str, target_dsn: str
) -> None:
    asset = incremental_asset("shop.orders", cursor="id", batch_size=400)
    result = dg.materialize([asset], resources=resources(orders, target_dsn))
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = dict(event.materialization.metadata)
    assert_readable(metadata, "incremental")
    assert_described(metadata)
    observations = [
        e.asset_observation_data.asset_observation
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    ]
    assert len(observations) == 3
    for observation in observations:
        keys = {k for k in observation.metadata if k.startswith("dpone/")}
        assert keys == {
            "dpone/progress_batch", "dpone/progress_run", "dpone/progress_rows",
            "dpone/progress_checkpoint",
        }  # fmt: skip
        assert not keys & set(metadata)
    [check] = result.get_asset_check_evaluations()
    assert check.description and "\n" not in check.description


def test_a_failure_reads_its_code_message_and_first_next_action_on_its_first_line(
    source_dsn: str, target_dsn: str
) -> None:
    asset = backfill_asset(
        "shop.missing", cursor="id", partitions_def=cursor_range_partitions(0, 10, 10)
    )
    result = dg.materialize(
        [asset], resources=resources(source_dsn, target_dsn), partition_key="0..10",
        raise_on_error=False,
    )  # fmt: skip
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    data = failure.step_failure_data
    assert data.user_failure_data is not None
    first = (data.user_failure_data.description or "").splitlines()[0]
    code = data.user_failure_data.metadata[ERROR_CODE_KEY].value
    assert first.startswith(f"[{code}] ") and "shop" in first and "missing" in first, first
    assert " Next: " in first and not first.endswith("Next: "), first
    # What the CLI prints first: the exception's name, then that same line.
    assert data.error is not None
    assert (
        data.error.message.splitlines()[0]
        == f"dpone_dagster.dagster.failures.DponeFailure: {first}"
    )


BAD_DSN = "postgresql://loader:hunter2@127.0.0.1:notaport/shop"


def test_a_malformed_env_var_dsn_is_one_line_at_load_and_fails_the_run_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPONE_READABLE_DSN", BAD_DSN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = PostgresSourceResource(dsn=dg.EnvVar("DPONE_READABLE_DSN"))
    [warning] = [w for w in caught if issubclass(w.category, InvalidDsnWarning)]
    line = str(warning.message)
    assert "\n" not in line and "hunter2" not in line
    assert "DPONE_READABLE_DSN: [dsn_invalid]" in line and " Next: " in line, line
    asset = snapshot_copy_assets(["shop.orders"])
    result = dg.materialize(
        [asset], raise_on_error=False,
        resources={"source": source, "target": PostgresTargetResource(dsn="postgresql://x@h/t")},
    )  # fmt: skip
    assert not result.success
    [failure] = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.RESOURCE_INIT_FAILURE
    ]
    error = failure.engine_event_data.error
    assert error is not None
    text = repr(error)
    assert "ValidationError" not in text and "pydantic_core" not in text
    assert "hunter2" not in text
    first = error.message.splitlines()[0]
    assert first.startswith("dpone_dagster.dagster.failures.DponeFailure: [dsn_invalid] "), first
    assert " Next: " in first, first


def test_the_cli_says_a_malformed_env_var_dsn_in_one_line_without_a_traceback(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "DPONE_SOURCE_DSN": BAD_DSN}
    dagster = Path(sys.executable).parent / "dagster"
    done = subprocess.run(
        [str(dagster), "asset", "materialize", "-f", "definitions.py", "--select", "shop/stock"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    # Loading is not a Python traceback: one warning line, and the definitions load.
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    assert "ValidationError" not in out and "hunter2" not in out, out[-3000:]
    [load, *_] = [line for line in out.splitlines() if "InvalidDsnWarning" in line]
    assert "DPONE_SOURCE_DSN: [dsn_invalid]" in load and " Next: " in load, load
    # The run fails when it starts, its error's first line the code, message and next action.
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "RESOURCE_INIT_FAILURE" in line)
    first = next(line for line in lines[start + 1 :] if line.strip())
    assert first.startswith("dpone_dagster.dagster.failures.DponeFailure: [dsn_invalid] "), first
    assert " Next: " in first, first
