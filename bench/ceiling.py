"""What this machine lets a copy reach: the raw pipe's CPU by process, and Dagster's own start.

A ratio to the raw ``psql | psql`` pipe (``bench/pipe.py``) has a ceiling that the machine sets,
whatever the code does: a copy needs CPU for the same rows (a source backend that reads them, a
target backend that writes them, a client between), and a Dagster run worker pays Dagster's own
start before its first step. This script measures both in one run, beside the copy engine and
the cold process a run worker is, and prints the ceilings they set:

- the raw pipe, ``--repeat`` times: its seconds and the CPU seconds of each of its processes
  (the two backends, read from ``/proc/<pid>/stat`` while they live; the two ``psql`` clients,
  from ``getrusage`` of this process's children; the server's other processes: WAL writer,
  checkpointer, background writer) and of the whole machine (``/proc/stat``), as cores used;
- two raw pipes at once, each copying half of the table's keys (``COPY (SELECT * ... WHERE id
  BETWEEN ...)``) into the same target table: what a second reader and writer buy on these cores;
- the ``batched_copy`` engine (``copy_tables(..., sink="replace")``, the default strategy) in
  this process, the same way (its client is this process's own CPU);
- Dagster's floor: a fresh ``python`` that imports Dagster, builds the ``Definitions`` of one
  asset that does nothing and executes their asset job, as ``bench/snapshot_copy.py``'s cold rows
  do for the copy (``bench/materialize.py``), timed from its start to its exit;
- the cold process itself: ``bench/snapshot_copy.py``'s ``cold:batched_copy`` child.

Then the ceilings. A copy of these rows that spends no less CPU than the pipe (the engine
spends more: its figures are printed beside) and keeps every core of the machine busy all the
time takes at least the pipe's CPU seconds over the cores; its ratio to the pipe is at most the
pipe's seconds over that. A cold process takes at least Dagster's floor plus that copy, so its
ratio is at most the pipe's seconds over their sum. Both are upper bounds: no copy reaches
them (the engine's own ratio is printed beside), and a bound under a target says the machine,
not the code, keeps the target out of reach at that size.

Last, what the cold process's target (its ratio at least :data:`OF_CEILING` of that bound)
asks: the floor plus the raw pipe, summed, is a cold process that does the pipe and nothing
else (no code of its own to import, no key to build, no check). Its share of the bound is
printed beside the snapshot copy's; when it is under the target too, no integration that copies
as fast as the pipe meets the target on this machine.

Run from the repository root (a quiet machine: the pipe's spread is printed)::

    .venv/bin/python bench/ceiling.py                     # 1M rows
    .venv/bin/python bench/ceiling.py --rows 3000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import pipe, result_file  # noqa: E402
from dpone_dagster.snapshot_copy import Strategy, copy_tables  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.memory import own_peak_mb  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
OF_CEILING = 0.85
"""The cold target of the speed issue: a cold process's ratio at least this share of the
ceiling."""


def _cpu_seconds(pid: int) -> float | None:
    """A process's user + system CPU seconds so far, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _machine_busy() -> float:
    """CPU seconds every core of the machine spent busy since boot (``/proc/stat``'s cpu line,
    all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS


class ServerCpu:
    """The CPU seconds the server's processes spend while it is open, by role.

    The backends of ``databases`` and any parallel worker are found as they start (a new pid in
    ``/proc`` whose command line names them) and read every 20 ms while they live (a process's
    last 20 ms can be missed); the server's long-lived processes are read at both ends.
    """

    def __init__(self, databases: dict[str, str]) -> None:
        self.databases = databases  # database name -> role ("source", "target")
        self.known = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        self.lasting = {
            pid: (role, _cpu_seconds(pid) or 0.0)
            for pid in self.known
            if (role := self._role(_cmdline(pid), lasting=True))
        }
        self.tracked: dict[int, tuple[str, float]] = {}
        self.watcher_cpu = 0.0  # this watcher's own CPU, taken out of an in-process client's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _role(self, cmdline: str, *, lasting: bool = False) -> str | None:
        if not cmdline.startswith("postgres: "):
            return None
        if "parallel worker" in cmdline:
            return "server: parallel workers"
        for name, role in self.databases.items():
            if f" {name} " in cmdline:
                return f"{role} backend"
        return "server: WAL writer, checkpointer, others" if lasting else None

    def _watch(self) -> None:
        started = time.thread_time()
        while not self._stop.is_set():
            self._tick()
            time.sleep(0.02)
        self.watcher_cpu = time.thread_time() - started

    def _tick(self) -> None:
        for pid in {int(p) for p in os.listdir("/proc") if p.isdigit()} - self.known:
            self.known.add(pid)
            role = self._role(_cmdline(pid))
            if role is not None:
                self.tracked[pid] = (role, 0.0)
        for pid, (role, _) in list(self.tracked.items()):
            seconds = _cpu_seconds(pid)
            if seconds is not None:
                self.tracked[pid] = (role, seconds)

    def __enter__(self) -> ServerCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._tick()

    def by_role(self) -> dict[str, float]:
        """CPU seconds by role over the measured span."""
        roles: dict[str, float] = {}
        for role, seconds in self.tracked.values():
            roles[role] = roles.get(role, 0.0) + seconds
        for pid, (role, before) in self.lasting.items():
            after = _cpu_seconds(pid)
            if after is not None:
                roles[role] = roles.get(role, 0.0) + after - before
        return roles


def _clients_cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measured(run: Callable[[], object], databases: dict[str, str], client: int) -> dict[str, Any]:
    """Runs ``run`` once: its seconds, the machine's cores used, and CPU seconds by process."""
    busy, clients = _machine_busy(), _clients_cpu(client)
    with ServerCpu(databases) as server:
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    own = server.watcher_cpu if client == resource.RUSAGE_SELF else 0.0
    cpu = {**server.by_role(), "client": _clients_cpu(client) - clients - own}
    return {
        "seconds": seconds,
        "cores": (_machine_busy() - busy) / seconds,
        "cpu": cpu,
        "cpu_total": sum(cpu.values()),
    }


def two_pipes(source: str, target: str, rows: int) -> float:
    """Seconds for two raw pipes at once, each copying one half of the keys into the table."""
    started = time.perf_counter()
    processes = []
    for lower, upper in ((1, rows // 2), (rows // 2 + 1, rows)):
        select = f"SELECT * FROM public.mixed WHERE id BETWEEN {lower} AND {upper}"
        out = subprocess.Popen(
            [*pipe.psql_args(source), "-c", f"COPY ({select}) TO STDOUT (FORMAT binary)"],
            stdout=subprocess.PIPE,
        )
        inp = subprocess.Popen(
            [*pipe.psql_args(target), "-c", "COPY public.mixed FROM STDIN (FORMAT binary)"],
            stdin=out.stdout,
        )
        assert out.stdout is not None
        out.stdout.close()
        processes += [out, inp]
    if any(p.wait() != 0 for p in processes):
        raise RuntimeError("a raw psql pipe failed")
    return time.perf_counter() - started


def child_floor() -> None:
    """Dagster's own cold run: one asset that does nothing (no database, no package)."""
    import dagster as dg

    from bench.materialize import materialize_definitions

    @dg.asset
    def nothing() -> None:
        """Does nothing: what remains is Dagster's start, run and exit."""

    materialize_definitions([nothing], {})
    print(json.dumps({"rss_mb": own_peak_mb()}))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of several :func:`measured` runs."""
    roles = sorted({role for r in runs for role in r["cpu"]})
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "cores": statistics.median(r["cores"] for r in runs),
        "cpu": {role: statistics.median(r["cpu"].get(role, 0.0) for r in runs) for role in roles},
        "cpu_total": statistics.median(r["cpu_total"] for r in runs),
    }


def cpu_line(name: str, run: dict[str, Any]) -> str:
    parts = ", ".join(
        f"{role} {s:.2f}" for role, s in sorted(run["cpu"].items(), key=lambda x: -x[1])
    )
    return (
        f"{name:<26} {run['seconds']:6.2f} s  {run['cores']:.2f} of {os.cpu_count()} cores busy  "
        f"CPU {run['cpu_total']:.2f} s: {parts}"
    )


def table_row(
    name: str, run: dict[str, Any], ratio: float | None = None, ceiling: float | None = None
) -> dict[str, object]:
    """One row of the result file: seconds, cores, CPU seconds by process, ratio, ceiling."""
    cpu = run.get("cpu", {})
    return {
        "run": name,
        "seconds": round(run["seconds"], 2),
        "cores_busy": f"{run['cores']:.2f}" if "cores" in run else "",
        "cpu_seconds": f"{run['cpu_total']:.2f}" if cpu else "",
        **{
            role.replace(" ", "_"): f"{cpu.get(role, 0.0):.2f}" if cpu else ""
            for role in ("target backend", "source backend", "client")
        },
        "ratio_to_pipe": "" if ratio is None else f"{ratio:.2f}",
        "ceiling": "" if ceiling is None else f"{ceiling:.2f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measurement")
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "floor":
        child_floor()
        return

    source, target = pg.create_database("dpone_ceil_src"), pg.create_database("dpone_ceil_tgt")
    began = result_file.machine(target)
    names = {str(pg.fetch_one(dsn, "SELECT current_database()")): role
             for dsn, role in ((source, "source"), (target, "target"))}  # fmt: skip
    try:
        for start in range(1, args.rows + 1, 500_000):
            pg.create_mixed_table(source, rows=min(500_000, args.rows - start + 1), start=start)
        pg.execute(source, "VACUUM (FREEZE, ANALYZE) public.mixed")
        pg.create_mixed_table(target, rows=0)
        cores = os.cpu_count() or 1

        def emptied(copy: Callable[[], float]) -> Callable[[], float]:
            """``copy`` into the emptied target table, after a checkpoint."""

            def run() -> float:
                pg.execute(target, "TRUNCATE public.mixed")
                pg.execute(target, "CHECKPOINT")
                return copy()

            return run

        raw = emptied(lambda: pipe.psql_pipe(source, target, "public.mixed"))
        raw_two = emptied(lambda: two_pipes(source, target, args.rows))

        def engine() -> object:
            pg.execute(target, "CHECKPOINT")
            return copy_tables(source, target, ["public.mixed"], strategy=Strategy.BATCHED_COPY,
                               sink="replace")  # fmt: skip

        pipes, doubles, engines, floors, colds = [], [], [], [], []
        for _ in range(args.repeat):  # alternated, so that drift touches every row alike
            pipes.append(measured(raw, names, resource.RUSAGE_CHILDREN))
            doubles.append(measured(raw_two, names, resource.RUSAGE_CHILDREN))
            engines.append(measured(engine, names, resource.RUSAGE_SELF))
            floors.append(pipe.cold_process([sys.executable, __file__, "--child", "floor"])[0])
            pg.execute(target, "CHECKPOINT")
            colds.append(pipe.cold_process([
                sys.executable, str(ROOT / "bench" / "snapshot_copy.py"), "--child",
                "cold:batched_copy", "--source", source, "--target", target,
            ])[0])  # fmt: skip
        p, d, e = median_run(pipes), median_run(doubles), median_run(engines)
        floor, cold = statistics.median(floors), statistics.median(colds)
        best_copy = p["cpu_total"] / cores
        copy_ceiling = p["seconds"] / best_copy
        cold_ceiling = p["seconds"] / (floor + best_copy)
        spread = pipe.spread([r["seconds"] for r in pipes])
        print(f"{args.rows:,} rows; medians of {args.repeat} alternated runs; the pipe's spread "
              f"{spread:.0%}")  # fmt: skip
        print(cpu_line("raw binary psql pipe", p))
        print(cpu_line("two raw pipes at once", d))
        print(cpu_line("batched_copy engine", e))
        print(f"{'Dagster floor, cold':<26} {floor:6.2f} s  (one asset that does nothing)")
        print(f"{'snapshot copy, cold':<26} {cold:6.2f} s  (cold:batched_copy + check)")
        print(
            f"a copy at the pipe's CPU, every core busy: >= {best_copy:.2f} s, ratio <= "
            f"{copy_ceiling:.2f} (two pipes at once: "
            f"{p['seconds'] / d['seconds']:.2f}; the engine: {p['seconds'] / e['seconds']:.2f})"
        )
        print(
            f"a cold process: >= {floor + best_copy:.2f} s, ratio <= {cold_ceiling:.2f} "
            f"(the cold process: {p['seconds'] / cold:.2f})"
        )
        bare = p["seconds"] / (floor + p["seconds"])  # Dagster's floor, then the pipe alone
        print(
            f"a cold process that does the raw pipe and nothing else (the floor plus the pipe): "
            f"{floor + p['seconds']:.2f} s, ratio {bare:.2f}, {bare / cold_ceiling:.2f} of the "
            f"ceiling; the snapshot copy's cold process: {p['seconds'] / cold / cold_ceiling:.2f} "
            f"of it (target {OF_CEILING:.2f})"
        )
        ratio = {"raw binary psql pipe": 1.0, "two raw pipes at once": p["seconds"] / d["seconds"],
                 "batched_copy engine": p["seconds"] / e["seconds"]}  # fmt: skip
        rows = [
            table_row(name, run, ratio[name], copy_ceiling)
            for name, run in (("raw binary psql pipe", p), ("two raw pipes at once", d),
                              ("batched_copy engine", e))
        ]  # fmt: skip
        rows.append(table_row("Dagster floor, cold (one asset doing nothing)", {"seconds": floor}))
        rows.append(table_row("the floor plus the raw pipe (a cold process doing only the pipe)",
                              {"seconds": floor + p["seconds"]}, bare, cold_ceiling))  # fmt: skip
        rows.append(table_row("snapshot copy, cold process", {"seconds": cold},
                              p["seconds"] / cold, cold_ceiling))  # fmt: skip
        if args.json:
            result_file.write(args.json, "ceiling", began, rows, table_rows=args.rows,
                              repeat=args.repeat, raw_pipe_spread=f"{spread:.0%}")  # fmt: skip
    finally:
        pg.drop_database(source)
        pg.drop_database(target)


if __name__ == "__main__":
    main()
