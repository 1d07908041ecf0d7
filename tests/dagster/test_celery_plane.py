"""A UI backfill spread over Celery workers heals by itself, and the ledger and the pool hold.

Real processes on ``deploy/celery``'s configuration: a daemon, a webserver and three Celery
workers, each in its own directory, sharing only PostgreSQL and Redis. A backfill of 12
cursor-range partitions (one run each) is launched through GraphQL as the UI does. Four of the
partitions are ten batches long; the test holds an uncommitted row in the target at the last id
of each, so their runs stop inside their last batch (nine committed, the tenth's transaction
open) and the test acts on the server's state, never after a sleep:

* P1: the pool process executing the run is killed with SIGKILL (the run worker crashes);
* P10: the whole Celery worker is killed with SIGKILL (its host is gone);
* P7: the run's source backend is ended with ``pg_terminate_backend``;
* P4: a second backfill of the same partition is launched and waits on the ledger's lock.

Then every partition is materialized, the target equals the source, every batch was applied
once, the killed runs were retried by Dagster and resumed after the ledger's checkpoint, and the
source never saw more dpone sessions than the pool allows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus
from dagster._core.storage.dagster_run import RunsFilter
from psycopg import conninfo

from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import table_columns
from dpone_dagster.reconcile import Digest
from dpone_dagster.reconcile.digest import digest_query, pin_settings, row_hash, run_digest
from tests.helpers import pg
from tests.helpers.celery_plane import (
    BIN,
    CeleryPlane,
    RedisSpace,
    instance_env,
    write_workspace,
)
from tests.helpers.dagster_server import ROOT

ASSET = ["public", "events"]
PARTITIONS, WIDTH, BATCH = 12, 10_000, 1_000
KEYS = [f"{i * WIDTH}..{(i + 1) * WIDTH}" for i in range(PARTITIONS)]
KILL_RUN_WORKER, DUPLICATE, TERMINATE, KILL_WORKER = KEYS[1], KEYS[4], KEYS[7], KEYS[10]
DENSE = (KILL_RUN_WORKER, DUPLICATE, TERMINATE, KILL_WORKER)
NAMES = {KILL_RUN_WORKER: "run worker killed", KILL_WORKER: "whole worker killed"}
POOL, POOL_LIMIT = "dpone_source", 2
APP = "dpone-celery-"
RANGE_TAG = "dagster/asset_partition_range_start"
IN_PROGRESS = {
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING,
}  # fmt: skip
TABLE = """CREATE TABLE public.events (
    id bigint PRIMARY KEY, payload text NOT NULL, amount numeric(12,2), created_at timestamptz
)"""


def digest(dsn: str) -> Digest:
    """The one reconciliation's digest of ``public.events`` (count and exact content hash)."""
    table = TableName("public", "events")
    with psycopg.connect(dsn) as conn:
        pin_settings(conn, local=True)
        columns = [c for c in table_columns(conn, table) if not c.generated]
        return run_digest(conn, *digest_query(table, row_hash(conn, columns)))


def bounds(key: str) -> tuple[int, int]:
    lo, hi = key.split("..")
    return int(lo), int(hi)


def seed(source: str, target: str) -> None:
    """Every tenth id in most partitions (one batch each); every id in the four dense ones."""
    pg.execute(source, TABLE)
    pg.execute(target, TABLE)  # an existing target is used as it is (no DDL mid-test)
    dense = [b for key in DENSE for b in bounds(key)]
    pg.execute(
        source,
        "INSERT INTO public.events SELECT g, md5(g::text), g * 0.01,"
        " timestamptz '2026-01-01' + g * interval '1 second'"
        " FROM generate_series(1, %s) AS g WHERE g %% 10 = 0"
        + " OR (g > %s AND g <= %s)"
        * len(DENSE),
        (PARTITIONS * WIDTH, *dense),
    )


@dataclass
class Plane:
    celery: CeleryPlane
    instance: DagsterInstance
    source: str
    target: str

    def runs(self, partition: str | None = None) -> list[DagsterRun]:
        tags = {RANGE_TAG: partition} if partition else {}
        return list(self.instance.get_runs(RunsFilter(tags=tags)))

    def ledger_receipts(self, partition: str) -> int:
        lo, _ = bounds(partition)
        return int(pg.fetch_one(  # type: ignore[arg-type]
            self.target,
            "SELECT count(*) FROM dpone_ledger.backfill_batch_receipts AS r"
            " JOIN dpone_ledger.backfill_runs AS b USING (run_id)"
            " WHERE b.run_json->'scope'->>'lower' = %s",
            (str(lo),),
        ))  # fmt: skip


@pytest.fixture
def plane(
    make_database: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Plane]:
    source, target = make_database("dpone_cel_src"), make_database("dpone_cel_tgt")
    instance_db = make_database("dpone_cel_instance")
    seed(source, target)
    workspace = write_workspace(tmp_path / "workspace.yaml")
    env = {
        "DPONE_SOURCE_DSN": source,
        "DPONE_TARGET_DSN": target,
        "DPONE_APPLICATION_NAME": f"{APP}daemon",
        "DPONE_PARTITIONS": str(PARTITIONS),
        "DPONE_PARTITION_WIDTH": str(WIDTH),
        "DPONE_BATCH_SIZE": str(BATCH),
        **instance_env(instance_db),
    }
    space = RedisSpace()
    celery = CeleryPlane(tmp_path / "plane", env, workspace, space)
    instance: DagsterInstance | None = None
    try:
        celery.migrate()
        for key, value in celery.env.items():
            monkeypatch.setenv(key, value)
        instance = DagsterInstance.from_config(str(celery.root / "migrate"))
        # The pool's size, set explicitly as deploy/celery/README.md says (default_limit alone
        # is applied one dequeue pass late by dagster 1.13: the first pass dequeues unlimited).
        celery.size_pool(POOL, POOL_LIMIT)
        celery.start_daemon()
        for name in ("w1", "w2", "w3"):
            celery.start_worker(name, {"DPONE_APPLICATION_NAME": f"{APP}{name}"})
        celery.start_webserver()
        celery.wait_workers_ready()
        yield Plane(celery, instance, source, target)
    finally:
        celery.stop()
        space.release()
        if instance is not None:
            instance.dispose()


@dataclass
class PoolSampler:
    """Counts the source's dpone sessions (``pg_stat_activity``) every 20 ms in a thread."""

    source: str
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        dbname = conninfo.conninfo_to_dict(self.source)["dbname"]
        with psycopg.connect(pg.admin_dsn(), autocommit=True) as conn:
            while not self._stop.wait(0.02):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                    " AND application_name LIKE %s",
                    (dbname, APP + "%"),
                ).fetchone()
                self.samples.append(int(row[0]) if row else 0)

    def __enter__(self) -> PoolSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


class RowHold:
    """An uncommitted target row at a partition's last id: its run waits there, in its last
    batch (the batch's transaction open, every earlier batch committed)."""

    def __init__(self, target: str, partition: str) -> None:
        self.partition = partition
        self.conn = psycopg.connect(target)
        self.conn.execute(
            "INSERT INTO public.events (id, payload) VALUES (%s, 'held')", (bounds(partition)[1],)
        )
        self.pid = self.conn.info.backend_pid

    def waiter(self) -> tuple[int, str] | None:
        """The dpone session waiting on this row (pid, application name), once there is one."""
        rows = pg.fetch_all(
            pg.admin_dsn(),
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE %s = ANY (pg_blocking_pids(pid)) AND application_name LIKE %s",
            (self.pid, APP + "%"),
        )
        return (int(rows[0][0]), str(rows[0][1])) if rows else None  # type: ignore[call-overload]

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


@dataclass
class Story:
    """What the test did and saw, for the assertions."""

    killed: dict[str, tuple[str, float]] = field(default_factory=dict)  # partition: run, time
    detected: dict[str, float] = field(default_factory=dict)  # partition: seconds to FAILURE
    committed_before: dict[str, int] = field(default_factory=dict)
    duplicate_backfill: str = ""
    duplicate_waited_on: int = 0
    missed_retries: list[str] = field(default_factory=list)


def the_run(plane: Plane, partition: str) -> DagsterRun:
    started = [r for r in plane.runs(partition) if r.status == DagsterRunStatus.STARTED]
    assert len(started) == 1, [(r.run_id, r.status) for r in plane.runs(partition)]
    return started[0]


def worker_named(plane: Plane, application_name: str) -> Any:
    return next(w for w in plane.celery.workers if application_name == f"{APP}{w.name}")


def kill(plane: Plane, story: Story, hold: RowHold, whole_worker: bool) -> None:
    """SIGKILL to the run's pool process (from Celery's task record), or to its whole worker."""
    _, application_name = hold.waiter() or (0, "")
    run = the_run(plane, hold.partition)
    story.committed_before[hold.partition] = plane.ledger_receipts(hold.partition)
    worker = worker_named(plane, application_name)
    if whole_worker:
        os.killpg(worker.process.pid, signal.SIGKILL)
    else:
        meta = plane.celery.redis_space.task_meta(run.tags["dagster-celery/task_id"])
        assert meta and meta["status"] == "STARTED", meta
        os.kill(int(meta["result"]["pid"]), signal.SIGKILL)
    story.killed[hold.partition] = (run.run_id, time.monotonic())
    hold.release()


def terminate_source(plane: Plane, story: Story, hold: RowHold) -> None:
    _, application_name = hold.waiter() or (0, "")
    story.committed_before[hold.partition] = plane.ledger_receipts(hold.partition)
    backends = pg.backends(plane.source, application_name)
    assert backends, f"no source session of {application_name}"
    pg.terminate(backends)
    hold.release()


def launch_duplicate(plane: Plane, story: Story, hold: RowHold) -> None:
    webserver = plane.celery.webserver
    assert webserver is not None
    story.committed_before[hold.partition] = plane.ledger_receipts(hold.partition)
    story.duplicate_backfill = webserver.launch_backfill(
        ASSET, [hold.partition], tags={"dagster/priority": "10"}
    )


def duplicate_waits_on_the_ledger(plane: Plane, hold: RowHold) -> int | None:
    """The pid of the duplicate's ledger session, once it waits on the original's lock."""
    original = hold.waiter()
    if original is None:
        return None
    rows = pg.fetch_all(
        pg.admin_dsn(),
        "SELECT a.pid FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
        " WHERE l.locktype = 'advisory' AND NOT l.granted AND %s = ANY (pg_blocking_pids(a.pid))",
        (original[0],),
    )
    return int(rows[0][0]) if rows else None  # type: ignore[call-overload]


def drive(plane: Plane, holds: dict[str, RowHold], story: Story, timeout: float = 200) -> None:
    """Acts on each held partition as soon as its run waits on the held row."""
    pending = dict(holds)
    deadline = time.monotonic() + timeout
    while pending or len(story.detected) < len(story.killed):
        if time.monotonic() > deadline:
            raise TimeoutError(f"still pending: {sorted(pending)}\n{plane.celery.logs()}")
        for partition, hold in list(pending.items()):
            if partition == DUPLICATE and story.duplicate_backfill:
                waiting = duplicate_waits_on_the_ledger(plane, hold)
                if waiting is not None:
                    story.duplicate_waited_on = waiting
                    hold.release()
                    del pending[partition]
                continue
            if hold.waiter() is None:
                continue
            if partition == DUPLICATE:
                launch_duplicate(plane, story, hold)
                continue
            if partition == TERMINATE:
                terminate_source(plane, story, hold)
            else:
                kill(plane, story, hold, whole_worker=partition == KILL_WORKER)
            del pending[partition]
        for partition, (run_id, killed_at) in story.killed.items():
            run = plane.instance.get_run_by_id(run_id)
            if partition not in story.detected and run and run.status == DagsterRunStatus.FAILURE:
                story.detected[partition] = time.monotonic() - killed_at
        time.sleep(0.05)


MISSED_RETRY_GRACE = 60.0


def heal_missed_retries(plane: Plane, story: Story) -> None:
    """Dagster 1.13.27 sometimes never launches a retry it promised (docs/deployment.md: its
    event-log consumer can read a RUN_FAILURE before the run's status says FAILURE). A run
    tagged ``dagster/will_retry=true`` still without a retry a minute after it failed is
    re-executed from failure as a person would from the UI, and noted for the assertions."""
    webserver = plane.celery.webserver
    assert webserver is not None
    runs = plane.runs()
    parents = {r.parent_run_id for r in runs}
    for record in plane.instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE])):
        run = record.dagster_run
        if run.tags.get("dagster/will_retry") != "true" or run.run_id in parents:
            continue
        if record.end_time and time.time() - record.end_time > MISSED_RETRY_GRACE:
            webserver.reexecute_from_failure(run.run_id)
            plane.instance.add_run_tags(run.run_id, {"dagster/will_retry": "false"})
            story.missed_retries.append(run.run_id)


def all_done(plane: Plane) -> bool:
    done = plane.instance.get_materialized_partitions(AssetKey(ASSET)) >= set(KEYS)
    return done and not any(r.status in IN_PROGRESS for r in plane.runs())


def observed_batches(plane: Plane, run_id: str) -> list[tuple[int, bool]]:
    """(batch, replayed) of every batch a run mirrored into Dagster, in order."""
    out = []
    for event in plane.instance.all_logs(run_id, of_type=DagsterEventType.ASSET_OBSERVATION):
        metadata = event.get_dagster_event().asset_observation_data.asset_observation.metadata
        out.append(
            (
                int(metadata["dpone/progress_batch"].value),
                bool(metadata["dpone/progress_replayed"].value),
            )
        )
    return out


def error_code(plane: Plane, run_id: str) -> str | None:
    for event in plane.instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        failure = event.get_dagster_event().step_failure_data.user_failure_data
        if failure is not None and "dpone/error_code" in failure.metadata:
            return str(failure.metadata["dpone/error_code"].value)
    return None


def failure_message(plane: Plane, run: DagsterRun) -> str:
    """The first line of the run's step or run failure, for the report."""
    kinds = (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE)
    for kind in kinds:
        for event in plane.instance.all_logs(run.run_id, of_type=kind):
            message = event.get_dagster_event().message or event.user_message
            return message.splitlines()[0][:200] if message else kind.value
    return "?"


def retry_of(plane: Plane, run_id: str) -> DagsterRun:
    retries = [r for r in plane.runs() if r.tags.get("dagster/parent_run_id") == run_id]
    assert len(retries) == 1, f"run {run_id} was retried {len(retries)} times"
    return retries[0]


@pytest.mark.timeout(480)
def test_a_backfill_on_celery_workers_heals_itself_and_holds_the_ledger_and_the_pool(
    plane: Plane,
) -> None:
    started = time.monotonic()
    holds = {p: RowHold(plane.target, p) for p in DENSE}
    story = Story()
    webserver = plane.celery.webserver
    assert webserver is not None
    try:
        with PoolSampler(plane.source) as sampler:
            backfill = webserver.launch_backfill(ASSET, KEYS)
            drive(plane, holds, story)
            pg.wait_until(
                lambda: heal_missed_retries(plane, story) or all_done(plane),
                timeout=300,
                what="every partition materialized",
                interval=1.0,
            )
    finally:
        for hold in holds.values():
            hold.release()
    duplicates = [
        (r.status.value, error_code(plane, r.run_id))
        for r in plane.runs(DUPLICATE)
        if r.tags.get("dagster/backfill") == story.duplicate_backfill
    ]
    print(
        f"\ncelery-plane: {time.monotonic() - started:.0f} s; failure detected after "
        + ", ".join(f"{p} ({NAMES[p]}): {s:.1f} s" for p, s in story.detected.items())
        + f"; duplicate runs {duplicates}"
        + f"; retries Dagster promised and never launched: {story.missed_retries or 'none'}"
        + "; failed runs "
        + str(
            [
                (r.tags.get(RANGE_TAG), error_code(plane, r.run_id) or failure_message(plane, r))
                for r in plane.runs()
                if r.status == DagsterRunStatus.FAILURE
            ]
        )
        + f"; pool samples {len(sampler.samples)}, most {max(sampler.samples)}"
    )
    assert webserver.wait_backfill(backfill, 120)["status"] == "COMPLETED_SUCCESS"

    # The target equals the source (count and the one reconciliation's exact digest).
    assert digest(plane.target) == digest(plane.source)
    assert_every_batch_once(plane)

    # The killed runs were detected, retried by Dagster, and resumed after the checkpoint.
    for partition in (KILL_RUN_WORKER, KILL_WORKER):
        run_id, _ = story.killed[partition]
        assert plane.instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE  # type: ignore[union-attr]
        retry = retry_of(plane, run_id)
        assert retry.status == DagsterRunStatus.SUCCESS
        if run_id not in story.missed_retries:
            assert retry.tags.get("dagster/retry_number") == "1", "retried by Dagster"
        before = story.committed_before[partition]
        assert before == WIDTH // BATCH - 1, "killed inside the last batch"
        assert observed_batches(plane, retry.run_id) == [(before + 1, False)], (
            "the retry starts after the ledger's checkpoint, not from zero"
        )

    # The run whose source backend was terminated stopped with its stable code; its retry
    # resumed after the checkpoint.
    (failed,) = [r for r in plane.runs(TERMINATE) if r.status == DagsterRunStatus.FAILURE]
    assert error_code(plane, failed.run_id) == "backfill_persistence_failed"
    assert observed_batches(plane, retry_of(plane, failed.run_id).run_id) == [
        (story.committed_before[TERMINATE] + 1, False)
    ]

    # The duplicate ran while the original held the partition's ledger lock, waited on it, and
    # applied nothing: it succeeded on replays only, or stopped with its stable code.
    assert story.duplicate_waited_on
    backfill_of = {r.run_id: r.tags.get("dagster/backfill") for r in plane.runs(DUPLICATE)}
    duplicate = [
        r for r in plane.runs(DUPLICATE) if backfill_of[r.run_id] == story.duplicate_backfill
    ]
    assert duplicate
    first = duplicate[-1]  # get_runs lists the newest first
    batches = observed_batches(plane, first.run_id)
    assert all(replayed for _, replayed in batches), batches
    if first.status == DagsterRunStatus.FAILURE:
        assert error_code(plane, first.run_id) == "backfill_checkpoint_stale"
    else:
        assert first.status == DagsterRunStatus.SUCCESS

    # The pool held across all workers: never more dpone sessions on the source than its size.
    assert sampler.samples and 1 <= max(sampler.samples) <= POOL_LIMIT, sampler.samples
    # Nothing left open on either side.
    for dsn in (plane.source, plane.target):
        open_ = pg.fetch_all(
            pg.admin_dsn(),
            "SELECT pid, application_name, state FROM pg_stat_activity WHERE datname = %s"
            " AND application_name LIKE %s AND xact_start IS NOT NULL",
            (conninfo.conninfo_to_dict(dsn)["dbname"], APP + "%"),
        )
        assert not open_, open_


def assert_every_batch_once(plane: Plane) -> None:
    """Each partition's ledger run: sequences 1..n without a gap, each checkpoint built on the
    previous one, every source row counted once, no row found already present."""
    runs = pg.fetch_all(
        plane.target,
        "SELECT run_id, status, (run_json->'scope'->>'lower')::bigint,"
        " (run_json->'scope'->>'upper')::bigint, (run_json->'progress'->>'batch_count')::int"
        " FROM dpone_ledger.backfill_runs ORDER BY 3",
    )
    assert [(r[2], r[3]) for r in runs] == [bounds(k) for k in KEYS]
    for run_id, status, lo, hi, batch_count in runs:
        assert status == "succeeded", (run_id, status)
        receipts = pg.fetch_all(
            plane.target,
            "SELECT sequence, previous_checkpoint, checkpoint, copied_count, duplicate_count"
            " FROM dpone_ledger.backfill_batch_receipts WHERE run_id = %s ORDER BY sequence",
            (run_id,),
        )
        sequences = [int(r[0]) for r in receipts]  # type: ignore[call-overload]
        assert sequences == list(range(1, int(batch_count) + 1)), "no batch skipped"  # type: ignore[call-overload]
        chain = [None] + [r[2] for r in receipts[:-1]]
        assert [r[1] for r in receipts] == chain, "each checkpoint builds on the previous one"
        rows = pg.fetch_one(
            plane.source, "SELECT count(*) FROM public.events WHERE id > %s AND id <= %s", (lo, hi)
        )
        assert sum(int(r[3]) for r in receipts) == rows  # type: ignore[call-overload]
        assert all(int(r[4]) == 0 for r in receipts), "no batch was applied twice"  # type: ignore[call-overload]


def test_the_celery_deployment_serves_the_demo_on_the_in_process_executor() -> None:
    """deploy/celery's workspace loads (the demo, wrapped for Celery pool processes)."""
    result = subprocess.run(
        [BIN / "dagster", "definitions", "validate", "-w", ROOT / "deploy/celery/workspace.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    import yaml

    values = yaml.safe_load((ROOT / "deploy/kubernetes/values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["dagsterDaemon"]["runMonitoring"]["enabled"] is True
