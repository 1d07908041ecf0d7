"""Scale-out benchmark: one 16-partition backfill of 1M rows on 1, 2 and 4 Celery workers.

    .venv/bin/python bench/scale_out.py                        # 1, 2 and 4 workers
    .venv/bin/python bench/scale_out.py --workers 1 2 --rows 200000
    .venv/bin/python bench/scale_out.py --json bench/results/scale_out.json   # for the docs

It creates its own databases on ``DPONE_TEST_PG_DSN`` (default: local postgres) and its own Redis
database (``DPONE_TEST_REDIS_URL``), and drops them. The source is the mixed-type table of
``bench/backfill.py`` (16 columns, about 320 bytes per row in binary COPY). For each worker
count it starts a fresh run plane on ``deploy/celery/dagster.yaml`` (a new instance database,
an empty target, a daemon, a webserver and N ``dagster-celery`` workers, as in
``tests/dagster/test_celery_plane.py``), sets the ``dpone_source`` pool to the number of
partitions so that only the workers limit concurrency, launches the 16 partitions (one run
each, 50,000-row batches) through GraphQL as the UI does, and waits until every partition is
materialized. It prints:

* wall time from the first run's start to the last run's end (the run plane's work; the
  backfill daemon's own 30-second tick before the first run is shown apart), rows/s, the ratio
  to one worker and to the raw binary COPY pipe measured in the same session;
* where the time goes: CPU seconds of the PostgreSQL backends of the source and the target (the
  instance database's connections live too briefly to sample), of Redis, the Celery workers
  (main and pool processes), the daemon and the webserver (with their code servers), and the
  machine's busy cores, over the window;
* the median run and the median of its one step (the backfill itself): the difference is what
  a run costs around its work (the worker loading the code location, run and step events).

With ``--json PATH`` it also writes that table, the command and the machine
(``bench/result_file.py``) for ``docs/benchmarks.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from dagster import AssetKey, DagsterInstance, DagsterRunStatus  # noqa: E402
from dagster._core.storage.dagster_run import RunsFilter  # noqa: E402
from psycopg import conninfo  # noqa: E402

from bench import result_file  # noqa: E402
from bench.backfill import fresh_target, raw_pipe  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.celery_plane import (  # noqa: E402
    CeleryPlane,
    RedisSpace,
    instance_env,
    write_workspace,
)

PARTITIONS = 16
TICK = os.sysconf("SC_CLK_TCK")
_CPU = ("pg_source", "pg_target", "redis", "workers", "daemon", "webserver")
"""The parts whose CPU seconds the table shows, in its order."""
_CPU_COLUMN = "CPU s: pg source / pg target / Redis / Celery workers / daemon / webserver"


def children(pid: int) -> list[int]:
    """``pid`` and all its descendants that are alive."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            text = Path(f"/proc/{current}/task/{current}/children").read_text()
        except OSError:
            continue
        todo += [int(c) for c in text.split()]
    return found


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of the live processes ``pids`` plus what their exited children used."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def pids_named(name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICK


class BackendSampler:
    """CPU seconds of the PostgreSQL backends serving given databases, sampled every 0.2 s.

    The server is shared (other databases, other users), so its processes' total CPU says
    little; this reads each backend of our databases (``pg_stat_activity``) from ``/proc`` and
    keeps its last reading. A backend that ends between two readings loses at most 0.2 s of
    its CPU, so the figures are lower bounds.
    """

    def __init__(self, databases: dict[str, str]) -> None:
        self.databases = databases  # label: DSN
        self.seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        labels = {str(conninfo.conninfo_to_dict(d)["dbname"]): k for k, d in self.databases.items()}
        with psycopg.connect(pg.admin_dsn(), autocommit=True) as conn:
            while not self._stop.wait(0.2):
                rows = conn.execute(
                    "SELECT pid, datname FROM pg_stat_activity WHERE datname = ANY(%s)",
                    (list(labels),),
                ).fetchall()
                for pid, datname in rows:
                    self.seen[int(pid)] = (labels[str(datname)], cpu_seconds([int(pid)]))

    def __enter__(self) -> BackendSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def totals(self) -> dict[str, float]:
        out = dict.fromkeys(self.databases, 0.0)
        for label, seconds in self.seen.values():
            out[label] += seconds
        return out


@dataclass
class Meter:
    """CPU seconds per part of the deployment, read at the start and the end of a window."""

    plane: CeleryPlane

    def read(self) -> dict[str, float]:
        workers = [p for w in self.plane.workers for p in children(w.process.pid)]
        assert self.plane.daemon is not None
        assert self.plane.webserver is not None
        return {
            "redis": cpu_seconds(pids_named("redis-server")),
            "workers": cpu_seconds(workers),
            "daemon": cpu_seconds(children(self.plane.daemon.pid)),
            "webserver": cpu_seconds(children(self.plane.webserver.process.pid)),
            "machine": machine_busy(),
        }


def plane_env(source: str, target: str, instance_db: str, rows: int, batch: int) -> dict[str, str]:
    return {
        "DPONE_SOURCE_DSN": source,
        "DPONE_TARGET_DSN": target,
        "DPONE_APPLICATION_NAME": "dpone-scale-out",
        "DPONE_TABLE": "public.mixed",
        "DPONE_PARTITIONS": str(PARTITIONS),
        "DPONE_PARTITION_WIDTH": str(rows // PARTITIONS),
        "DPONE_BATCH_SIZE": str(batch),
        **instance_env(instance_db),
    }


def one_round(source: str, workers: int, rows: int, batch: int) -> dict[str, float]:
    """A fresh plane with ``workers`` workers runs the whole backfill; its figures."""
    target, instance_db = pg.create_database("dpone_scale_dst"), pg.create_database("dpone_scale_i")
    space = RedisSpace()
    root = Path(tempfile.mkdtemp(prefix="dpone-scale-out-"))
    workspace = write_workspace(root / "workspace.yaml")
    env = plane_env(source, target, instance_db, rows, batch)
    plane = CeleryPlane(root / "plane", env, workspace, space)
    try:
        plane.migrate()
        plane.size_pool("dpone_source", PARTITIONS)
        plane.start_daemon()
        for n in range(workers):
            plane.start_worker(f"w{n + 1}")
        webserver = plane.start_webserver()
        plane.wait_workers_ready()
        os.environ.update(plane.env)
        instance = DagsterInstance.from_config(str(plane.root / "migrate"))
        width = rows // PARTITIONS
        keys = [f"{i * width}..{(i + 1) * width}" for i in range(PARTITIONS)]
        meter = Meter(plane)

        def done() -> bool:
            materialized = instance.get_materialized_partitions(AssetKey(["public", "mixed"]))
            return materialized >= set(keys)

        databases = {"source": source, "target": target}
        with BackendSampler(databases) as backends:
            before = meter.read()
            launched = time.time()
            webserver.launch_backfill(["public", "mixed"], keys)
            pg.wait_until(done, timeout=1800, what=f"the backfill on {workers} workers is done",
                          interval=0.5)  # fmt: skip
            after = meter.read()
        records = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        starts = [r.start_time for r in records if r.start_time]
        ends = [r.end_time for r in records if r.end_time]
        durations = [r.end_time - r.start_time for r in records if r.start_time and r.end_time]
        steps = [
            s.end_time - s.start_time
            for r in records
            for s in instance.get_run_step_stats(r.dagster_run.run_id)
            if s.start_time and s.end_time
        ]
        figures = {k: after[k] - before[k] for k in before}
        figures.update({f"pg_{k}": v for k, v in backends.totals().items()})
        figures.update(
            runs=len(records),
            tick=min(starts) - launched,
            wall=max(ends) - min(starts),
            run_median=statistics.median(durations),
            step_median=statistics.median(steps),
            copied=float(pg.fetch_one(target, "SELECT count(*) FROM public.mixed")),  # type: ignore[arg-type]
        )
        instance.dispose()
        return figures
    finally:
        plane.stop()
        space.release()
        pg.drop_database(target)
        pg.drop_database(instance_db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    args = parser.parse_args()
    source = pg.create_database("dpone_scale_src")
    raw_target = pg.create_database("dpone_scale_raw")
    began = result_file.machine(source)
    try:
        pg.create_mixed_table(source, rows=args.rows)
        pg.execute(source, "VACUUM ANALYZE public.mixed")
        fresh_target(raw_target)
        raw = args.rows / raw_pipe(source, raw_target)
        print(f"raw binary COPY pipe: {raw:,.0f} rows/s ({args.rows:,} rows)", flush=True)
        results = {n: one_round(source, n, args.rows, args.batch) for n in args.workers}
    finally:
        pg.drop_database(source)
        pg.drop_database(raw_target)
    rows = table_rows(results, raw)
    print_table(rows, args.rows)
    if args.json:
        result_file.write(
            args.json, "scale_out", began, rows, table_rows=args.rows, partitions=PARTITIONS,
            batch=args.batch, raw_pipe_rows_per_second=round(raw),
        )  # fmt: skip


def table_rows(results: dict[int, dict[str, float]], raw: float) -> list[dict[str, Any]]:
    """Each worker count's figures, rounded as printed (the result table's rows)."""
    one = results.get(1)
    rows = []
    for n, f in results.items():
        speed = f["copied"] / f["wall"]
        rows.append({
            "workers": n,
            "wall_s": f"{f['wall']:.1f}",
            "rows_per_s": f"{speed:,.0f}",
            "vs_1_worker": f"{one['wall'] / f['wall']:.2f}" if one else "-",
            "vs_raw_pipe": f"{speed / raw:.3f}",
            "median_run_s": f"{f['run_median']:.1f}",
            "median_step_s": f"{f['step_median']:.1f}",
            "daemon_tick_s": f"{f['tick']:.1f}",
            _CPU_COLUMN: " / ".join(f"{f[k]:.1f}" for k in _CPU),
            "busy_cores": f"{f['machine'] / (f['wall'] + f['tick']):.2f}",
        })  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]], copied: int) -> None:
    """The figures as two tables: speed, and where the CPU went."""
    print(
        f"\n{PARTITIONS} partitions, {copied:,} rows, one run per partition\n"
        "workers | wall s | rows/s | vs 1 worker | vs raw pipe | median run s | median step s"
        " | daemon tick s"
    )
    for r in rows:
        print(
            f"{r['workers']:7} | {r['wall_s']:>6} | {r['rows_per_s']:>9} | {r['vs_1_worker']:>11} |"
            f" {r['vs_raw_pipe']:>11} | {r['median_run_s']:>12} | {r['median_step_s']:>13} |"
            f" {r['daemon_tick_s']:>13}"
        )
    print(
        "\nCPU seconds from the launch to the last run's end: PostgreSQL backends of the source"
        " and the target databases (lower bounds, see BackendSampler), "
        "Redis, the Celery workers, the daemon and the webserver (with their code servers); "
        f"busy = the whole machine's busy CPU seconds per second, of {os.cpu_count()} cores "
        "(other users of the machine included)\n"
        f"workers | {_CPU_COLUMN} | busy cores"
    )
    for r in rows:
        print(f"{r['workers']:7} | {r[_CPU_COLUMN]} | {r['busy_cores']:>10}")


if __name__ == "__main__":
    main()
