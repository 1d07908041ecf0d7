"""The demo's schedule asks for the newest daily partition, and that run backfills it."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
import pytest

from demo.seed import seed
from tests.helpers import pg

ROOT = Path(__file__).resolve().parents[2]


def load_definitions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dpone_demo_definitions", ROOT / "definitions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_schedule_backfills_the_newest_complete_day(
    make_database: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source, target = make_database("dpone_sched_src"), make_database("dpone_sched_tgt")
    seed(source, target, rows=20_000)
    monkeypatch.setenv("DPONE_SOURCE_DSN", source)
    monkeypatch.setenv("DPONE_TARGET_DSN", target)
    defs: dg.Definitions = load_definitions().defs
    schedule = defs.resolve_schedule_def("page_views_daily_schedule")
    context = dg.build_schedule_context(
        scheduled_execution_time=datetime(2026, 1, 3, 1, 0, tzinfo=UTC)
    )
    [request] = list(schedule.evaluate_tick(context).run_requests or [])
    assert request.partition_key == "2026-01-02"

    job = defs.resolve_job_def(schedule.job_name)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = job.execute_in_process(instance=instance, partition_key=request.partition_key)
    assert result.success
    day = (
        "SELECT count(*), coalesce(sum(id), 0) FROM events.page_views "
        "WHERE happened_at >= '2026-01-02' AND happened_at < '2026-01-03'"
    )
    copied = pg.fetch_all(target, day)
    assert copied == pg.fetch_all(source, day)
    assert (
        copied[0][0] == 6646
        and pg.fetch_one(target, "SELECT count(*) FROM events.page_views") == 6646
    )
