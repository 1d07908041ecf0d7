"""Runs of one replication group wait in Dagster's queue, through a real `dagster dev` (webserver,
daemon, run queue) whose instance enforces pools per run: the group's op is in the pool of its
slot's name by default, given a limit of 1 as the docs say. A run that still finds the slot held
(here by a real consumer on the replication protocol) logs that it waits, for whom and how
long."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.dagster.test_replication_assets import SHOP
from tests.helpers import logical, pg
from tests.helpers.dagster_server import ROOT, DagsterDev, postgres_instance_yaml
from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
    logical_server,
    logical_source_dsn,
    make_logical_database,
)

LOCATION = "replication_queue"
INSTANCE = """
# What docs/replication.md asks of an instance: pools enforced per run, so that a run whose
# pool is full waits in the run queue (QUEUED in the UI) instead of starting. The storage is
# PostgreSQL, as on a platform: the run queue's daemon stops enforcing pools for a pass when it
# cannot read them, which SQLite's file lock made it do under load.
concurrency:
  pools:
    granularity: run
"""
LAUNCH_RUN = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on UnauthorizedError { message }
  }
}
"""
RUN = """
query($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { status startTime endTime } }
}
"""
LOGS = """
query($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
  }
}
"""
DONE = {"SUCCESS", "FAILURE", "CANCELED"}


class Server:
    """The `dagster dev` of the test and what it asks of it."""

    def __init__(self, dev: DagsterDev, slot: str) -> None:
        self.dev, self.slot = dev, slot
        self.group_job = f"__anonymous_asset_job_replication_{slot}_schedule"

    def launch(self, job: str) -> str:
        selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                    "jobName": job}  # fmt: skip
        result = self.dev.graphql(LAUNCH_RUN, params={"selector": selector})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return str(result["run"]["runId"])

    def run(self, run_id: str) -> dict[str, Any]:
        run: dict[str, Any] = self.dev.graphql(RUN, runId=run_id)["runOrError"]
        return run

    def messages(self, run_id: str) -> list[str]:
        logs = self.dev.graphql(LOGS, runId=run_id)["logsForRun"]
        return [e["message"] for e in logs.get("events") or [] if e.get("message")]

    def wait(self, run_id: str, what: str, predicate: Any, timeout: float = 180) -> Any:
        try:
            return pg.wait_until(lambda: predicate(run_id), timeout=timeout, interval=0.5,
                                 what=f"run {run_id} {what}")  # fmt: skip
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {self.run(run_id)}\n{self.dev.log()}") from None

    def finished(self, run_id: str) -> dict[str, Any]:
        """The run once it ended, which it must have done with success."""

        def ended(run_id: str) -> dict[str, Any] | None:
            run = self.run(run_id)
            return run if run["status"] in DONE else None

        run: dict[str, Any] = self.wait(run_id, "ends", ended)
        assert run["status"] == "SUCCESS", f"{run}\n{self.messages(run_id)[-5:]}"
        return run


@pytest.fixture
def server(logical_source_dsn: str, make_database: Any, tmp_path: Path) -> Any:  # noqa: F811
    """`dagster dev` serving tests/dagster/replication_queue_defs.py, its instance enforcing
    pools per run and the group's pool (the slot's name) limited to 1 by the documented
    command."""
    src, tgt = logical_source_dsn, make_database("dpone_queue_tgt")
    pg.execute(src, SHOP)
    slot = f"dpone_queue_{uuid.uuid4().hex[:8]}"
    storage = postgres_instance_yaml(make_database("dpone_queue_instance"))
    (tmp_path / "dagster.yaml").write_text(INSTANCE + storage)
    workspace = tmp_path / "workspace.yaml"
    defs = ROOT / "tests" / "dagster" / "replication_queue_defs.py"
    workspace.write_text(
        f"load_from:\n  - python_file:\n      relative_path: {defs}\n"
        f"      location_name: {LOCATION}\n      working_directory: {ROOT}\n"
    )
    dagster = Path(sys.executable).parent / "dagster"
    limit = subprocess.run(
        [str(dagster), "instance", "concurrency", "set", slot, "1"], capture_output=True,
        text=True, env={**os.environ, "DAGSTER_HOME": str(tmp_path)}, timeout=120,
    )  # fmt: skip
    assert limit.returncode == 0, limit.stderr
    env = {"DPONE_SOURCE_DSN": src, "DPONE_TARGET_DSN": tgt, "DPONE_QUEUE_SLOT": slot}
    dev = DagsterDev(tmp_path, env, workspace=workspace)
    try:
        dev.wait_ready()
        yield Server(dev, slot), src, tgt
    finally:
        dev.stop()


def test_a_second_run_of_a_group_queues_in_dagster_while_the_first_holds_the_slot(
    server: Any,
) -> None:
    """The group's first run copies. A real consumer then holds the slot: the next run starts
    and logs that it waits for the slot, naming the consumer's pid and its limit (lock_wait).
    A second run launched meanwhile stays QUEUED in Dagster's run queue (its pool, the slot's
    name, is full) while a run of another job launched after it starts and ends. Once the
    consumer lets go, the first run logs how long it waited and applies; the second starts
    only after the first ended, never waits for the slot itself, and both succeed."""
    dagster, src, tgt = server
    dagster.finished(dagster.launch(dagster.group_job))  # the initial copy
    pg.execute(src, "UPDATE shop.orders SET note = 'queued' WHERE id <= 2")
    consumer = logical.hold_slot(src, dagster.slot, dagster.slot)
    try:
        pid = logical.holder_pid(src, dagster.slot)
        waiting = f"is held by the session of pid {pid}"
        first = dagster.launch(dagster.group_job)
        dagster.wait(first, "logs that it waits for the slot",
                     lambda r: any(waiting in m for m in dagster.messages(r)))  # fmt: skip
        second = dagster.launch(dagster.group_job)
        dagster.finished(dagster.launch("heartbeat_job"))  # the queue went past the second
        queued = dagster.run(second)["status"]
        assert queued == "QUEUED", f"{queued}\n{dagster.dev.log()}"
        assert dagster.run(first)["status"] == "STARTED"
    finally:
        consumer.finish()
    ended = dagster.finished(first)
    started = dagster.finished(second)
    assert started["startTime"] >= ended["endTime"]
    first_log = dagster.messages(first)
    [wait_line] = [m for m in first_log if waiting in m]
    assert "for at most 300 s (lock_wait)" in wait_line and dagster.slot in wait_line
    assert any(f"was let go by the session of pid {pid} after" in m for m in first_log)
    assert any("applied 1 source transaction(s)" in m for m in first_log)
    assert not any("is held by the session" in m for m in dagster.messages(second))
    with psycopg.connect(tgt) as conn:
        notes = conn.execute("SELECT count(*) FROM shop.orders WHERE note = 'queued'").fetchone()
    assert notes == (2,)
