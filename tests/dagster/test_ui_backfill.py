"""A partition backfill launched the way the UI launches it, on a dagster-postgres instance.

`dagster dev` serves the repository's workspace.yaml with the documented deploy/dagster.yaml
(runs and event logs in PostgreSQL). The test launches a partition-range backfill through the
GraphQL API, terminates one run mid-backfill, launches the range again, and checks that the
target ends equal to the source with every batch applied exactly once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from psycopg import conninfo

from demo.seed import seed
from tests.helpers import pg
from tests.helpers.dagster_server import ROOT, DagsterDev

ASSET = ["events", "page_views"]
DAYS = [f"2026-01-{d:02d}" for d in range(1, 11)]


@pytest.fixture
def dagster_dev(make_database: Any, tmp_path: Path) -> Any:
    source, target = make_database("dpone_ui_src"), make_database("dpone_ui_tgt")
    instance_db = make_database("dpone_ui_instance")
    seed(source, target, rows=80_000)
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    params = conninfo.conninfo_to_dict(instance_db)
    env = {
        "DPONE_SOURCE_DSN": source,
        "DPONE_TARGET_DSN": target,
        "DAGSTER_PG_HOST": str(params.get("host") or "127.0.0.1"),
        "DAGSTER_PG_PORT": str(params.get("port") or "5432"),
        "DAGSTER_PG_USER": str(params.get("user") or "postgres"),
        "DAGSTER_PG_PASSWORD": str(params.get("password") or ""),
        "DAGSTER_PG_DB": str(params["dbname"]),
    }
    server = DagsterDev(tmp_path, env)
    try:
        server.wait_ready()
        yield server, source, target, instance_db
    finally:
        server.stop()


def day_rows(dsn: str) -> int:
    return int(pg.fetch_one(  # type: ignore[arg-type]
        dsn, "SELECT count(*) FROM events.page_views WHERE happened_at >= '2026-01-01' "
             "AND happened_at < '2026-01-11'",
    ))  # fmt: skip


def committed_run(server: DagsterDev, backfill_id: str) -> str | None:
    """The backfill's run once a batch has committed (its ``dpone/checkpoint`` tag is set)."""
    runs = server.backfill(backfill_id).get("runs") or []
    tags = {t["key"]: t["value"] for t in runs[0]["tags"]} if runs else {}
    return str(runs[0]["runId"]) if "dpone/checkpoint" in tags else None


def test_a_ui_launched_backfill_survives_termination_and_resumes_exactly_once(
    dagster_dev: Any,
) -> None:
    server, source, target, instance_db = dagster_dev
    first = server.launch_backfill(ASSET, DAYS)

    # Wait until a batch has committed (the run's progress tags show it), then terminate.
    try:
        run_id = pg.wait_until(
            lambda: committed_run(server, first), timeout=180, interval=0.2,
            what=f"a batch of backfill {first} has committed",
        )  # fmt: skip
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{server.log()}") from None
    result = server.terminate(run_id)
    assert result["__typename"] == "TerminateRunSuccess", result
    server.wait_backfill(first)
    status = server.run(run_id)["status"]
    assert status in ("CANCELED", "FAILURE"), status
    copied_before = pg.fetch_one(
        target, "SELECT coalesce(sum((run_json->'progress'->>'copied_count')::int), 0) "
                "FROM dpone_ledger.backfill_runs",
    )  # fmt: skip
    assert 0 < int(copied_before) < day_rows(source), "terminated mid-backfill"  # type: ignore[call-overload]
    # The terminated run's process may still be going down: its sessions end with it.
    pg.wait_for_no_open_transaction(source, target, application_name="dpone-dagster")

    second = server.launch_backfill(ASSET, DAYS)
    state = server.wait_backfill(second)
    assert state["status"] == "COMPLETED_SUCCESS", f"{state}\n{server.log()}"

    assert day_rows(target) == day_rows(source)
    assert pg.fetch_one(target, "SELECT count(*) FROM events.page_views") == day_rows(source)
    receipts = pg.fetch_all(
        target,
        "SELECT run_id, sequence, (receipt_json->'observation'->>'copied_count')::int, "
        "(receipt_json->'observation'->>'duplicate_count')::int "
        "FROM dpone_ledger.backfill_batch_receipts",
    )
    assert len({(r[0], r[1]) for r in receipts}) == len(receipts), "each batch once per run"
    assert sum(int(r[2]) for r in receipts) == day_rows(source)  # type: ignore[call-overload]
    assert sum(int(r[3]) for r in receipts) == 0, "no batch was applied twice"  # type: ignore[call-overload]
    assert pg.fetch_one(
        target, "SELECT count(*) FROM dpone_ledger.backfill_runs WHERE status = 'succeeded'"
    ) == len(DAYS)
    # The instance itself lives in PostgreSQL (dagster-postgres), not in SQLite files.
    assert int(pg.fetch_one(instance_db, "SELECT count(*) FROM runs")) >= 2  # type: ignore[arg-type]
