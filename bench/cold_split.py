"""Where a cold run worker's time goes, phase by phase, beside the raw binary COPY pipe.

A run worker is a fresh interpreter: it starts Python, imports Dagster and the code location,
builds the ``Definitions``, creates its instance and executes the run. ``bench/pipe.py``'s
:func:`~bench.pipe.cold_process` times that whole process (the ``cold:`` rows of
``bench/snapshot_copy.py``, ``bench/backfill.py --cold``); this script runs the same kind of
process and splits its time. Two runs, each in a child process of its own:

- ``snapshot``: ``dagster.materialize``-equivalent execution of ``snapshot_copy_assets(
  ["public.mixed"])`` with its defaults and its ``dpone_reconciled`` check, into a target that
  holds the raw pipe's rows (as in ``bench/snapshot_copy.py``: the swap drops a full table);
- ``backfill``: one ``0..rows`` partition of ``backfill_asset("public.mixed", cursor="id")``
  with its defaults and its check, without a target table (its step creates it, its key built
  once the rows are in), into a target database whose ledger holds no run (as in
  ``bench/backfill.py``).

How each phase is timed:

- the interpreter's start: from the parent's ``Popen`` to the child script's first statement,
  and the process's exit: from the child's last mark to the parent's ``wait`` returning (both
  ``time.monotonic()``, the system-wide ``CLOCK_MONOTONIC`` on Linux, so the two processes'
  marks compare);
- the imports, the assets, the ``Definitions`` and the ephemeral instance: marks around each;
  the modules imported lazily during the run itself are read from ``-X importtime`` (the child
  runs with it; marker lines on stderr split its report by phase);
- inside the run: the engine's functions (plan, the rows' COPY, the key build and the swap, the
  row-version evidence, the commit, the check's two sides, the catalog and receipt metadata,
  the backfill's batches and reconciliation) and the instance's ``handle_new_event`` (every event
  Dagster stores) are wrapped in this child process with timers that count a call's time
  *exclusively* (a phase called inside another is taken out of the outer one), so the phases
  add up to the run; their behaviour is unchanged. What remains of ``execute_in_process`` is
  Dagster's own work (run and step orchestration, resources, event construction): before the
  step's body first runs, between its yields, and after it ends. Calls in other threads (the
  check's two sides, the backfill's progress reporter) run concurrently with the main thread
  and are printed apart, outside the sum.

Around each child the parent measures the raw pipe (``bench/pipe.py``, before and after; the
fixed cost is the child's time minus the pipe's mean, in seconds and as a share of the pipe),
the WAL the server wrote and the buffers backends had to write themselves (``pg_stat_bgwriter
.buffers_backend``: dirty pages evicted by a scan's ring, such as those a first read dirties by
setting hint bits). Once, after a raw-pipe load, it reads the freshly copied table twice with
``EXPLAIN (ANALYZE, BUFFERS)``: the first read pays the hint bits (pages dirtied and written),
the second does not.

Run from the repository root::

    .venv/bin/python bench/cold_split.py                   # 1M rows, both runs
    .venv/bin/python bench/cold_split.py --rows 200000 --runs snapshot
    .venv/bin/python bench/cold_split.py --rows 1000000 --json bench/results/cold_split.json
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # the child's first mark: the interpreter has started by now

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUNS = ("snapshot", "backfill")
MARK = "cold_split mark: "
"""The prefix of the lines the child writes on stderr between its phases (``-X importtime``
writes its own lines there: a mark splits them by phase)."""
_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


class Clock:
    """Seconds per phase, exclusive: a timed call inside another timed call of the same thread
    is taken out of the outer one. The main thread's phases add up; other threads' are kept
    apart (:attr:`concurrent`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.concurrent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.segments: list[tuple[float, float]] = []  # the step body's runs between yields
        self.outermost: list[tuple[float, float]] = []  # the main thread's outermost calls
        self._main = threading.get_ident()
        self._local = threading.local()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the block as ``name``, without the timed blocks nested in it."""
        stack: list[list[Any]] = self._local.__dict__.setdefault("stack", [])
        stack.append([name, 0.0])
        started = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            _, inner = stack.pop()
            main = threading.get_ident() == self._main
            book = self.seconds if main else self.concurrent
            book[name] = book.get(name, 0.0) + elapsed - inner
            self.calls[name] = self.calls.get(name, 0) + 1
            if stack:
                stack[-1][1] += elapsed
            elif main:
                self.outermost.append((started, started + elapsed))

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Replaces ``owner.attribute`` (a function or method) with one timed as ``name``."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)

    def wrap_body(self, owner: Any, attribute: str, name: str) -> None:
        """Replaces the step body's event iterator ``owner.attribute`` with one whose every
        resumption is timed as ``name`` (and recorded in :attr:`segments`)."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            events = original(*args, **kwargs)
            while True:
                started = time.monotonic()
                try:
                    with self.phase(name):
                        event = next(events)
                except StopIteration:
                    return
                finally:
                    self.segments.append((started, time.monotonic()))
                yield event

        setattr(owner, attribute, timed)


def mark(name: str) -> float:
    """Writes a phase mark on stderr (it splits ``-X importtime``'s lines); the time now."""
    sys.stderr.write(f"{MARK}{name}\n")
    sys.stderr.flush()
    return time.monotonic()


def instrument_snapshot(clock: Clock) -> None:
    """Times the snapshot copy's engine functions where the run looks them up."""
    from dpone_dagster.dagster.events import snapshot_copy as events
    from dpone_dagster.postgres import load, sinks
    from dpone_dagster.reconcile import copy_check
    from dpone_dagster.snapshot_copy.batched_copy import BatchedCopyArtifact
    from dpone_dagster.snapshot_copy.engine import SnapshotCopy

    clock.wrap_body(events.CopyEvents, "__iter__", "step body: snapshot export, sessions, rest")
    clock.wrap(SnapshotCopy, "plan", "plan: both catalogs")
    clock.wrap(SnapshotCopy, "extract", "extract (batched: lazy, nothing read)")
    clock.wrap(SnapshotCopy, "load", "load: staging table, types, settle (rest)")
    clock.wrap(BatchedCopyArtifact, "_load", "copy: the rows (batched COPY relay)")
    clock.wrap(sinks, "_swap", "key build: ADD PRIMARY KEY on staging")
    clock.wrap(sinks, "_swap_in", "swap: drop the old table, rename")
    clock.wrap(load, "load_writers", "row-version evidence")
    clock.wrap(load, "commit_target", "commit")
    clock.wrap(SnapshotCopy, "close", "close: settle, sessions")
    clock.wrap(events, "table_catalog_metadata", "metadata: catalogs (column schema, comments)")
    clock.wrap(events, "table_metadata", "metadata: receipts")
    clock.wrap(events, "step_seconds_metadata", "metadata: receipts")
    clock.wrap(events, "reconcile_copy", "check: reconcile (sessions, snapshot import)")
    clock.wrap(events, "copy_check_result", "check: result")
    clock.wrap(copy_check, "_count", "check thread: source count(*) in the snapshot")
    clock.wrap(copy_check, "_target_versions", "check thread: target count + xmin scan")


def instrument_backfill(clock: Clock) -> None:
    """Times the backfill's engine functions where the run looks them up."""
    from dpone_dagster.backfill import api, copier, reconcile
    from dpone_dagster.cursor.cursor_ledger import RunLedger
    from dpone_dagster.cursor.mark_policies import FixedMark
    from dpone_dagster.dagster.events import backfill as events
    from dpone_dagster.dagster.events.progress import ProgressReporter

    clock.wrap_body(events.BackfillEvents, "__iter__", "step body: rest")
    clock.wrap(events, "prepare_target", "prepare target: create the table")
    clock.wrap(api.Backfill, "_connect", "sessions: connect")
    clock.wrap(RunLedger, "ensure", "ledger: ensure its schema")
    clock.wrap(api.Backfill, "_plan", "plan: shape, run")
    clock.wrap(FixedMark, "take", "plan: high-water mark")
    clock.wrap(api, "copy_batch", "batches: lock, ledger reads, commit (rest)")
    clock.wrap(copier, "_bounds", "batches: bounds")
    clock.wrap(copier, "_copy", "copy: the rows (relay + content hash)")
    clock.wrap(copier, "_count_target", "batches: target count + evidence")
    clock.wrap(RunLedger, "record", "batches: receipt + run write")
    clock.wrap(api, "build_key", "key build: ADD PRIMARY KEY (deferred key)")
    clock.wrap(api.Backfill, "_reconcile", "check: reconcile (rest)")
    clock.wrap(reconcile, "_prove", "check: row-version proofs (both sides)")
    clock.wrap(api.Backfill, "receipts", "ledger: receipts read")
    clock.wrap(api.Backfill, "load", "ledger: run read")
    clock.wrap(events._PartitionRunner, "_recorded_checkpoint", "Dagster: last materialization")
    clock.wrap(events, "partition_metadata", "metadata: receipts")
    clock.wrap(events._PartitionRunner, "_catalog_metadata", "metadata: catalogs")
    clock.wrap(events, "backfill_check", "check: result")
    clock.wrap(api.Backfill, "close", "close: sessions")
    clock.wrap(ProgressReporter, "flush", "progress: wait for the reporter")
    clock.wrap(ProgressReporter, "_write", "reporter thread: batch observations")


def child(run: str, source: str, target: str, rows: int) -> None:
    """One cold run worker's run, phase by phase; prints its figures as JSON."""
    marks = {"started": STARTED, "dagster": mark("import dagster")}
    import dagster as dg

    marks["dpone_dagster"] = mark("import dpone_dagster")
    import dpone_dagster

    marks["factories"] = mark("dpone_dagster's Dagster layer")
    from dpone_dagster import (
        LedgerResource,
        PostgresSourceResource,
        PostgresTargetResource,
        backfill_asset,
        cursor_range_partitions,
        snapshot_copy_assets,
    )

    marks["assets"] = mark("assets and resources")
    resources: dict[str, Any] = {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
    }
    kwargs: dict[str, Any] = {}
    if run == "snapshot":
        asset = snapshot_copy_assets(["public.mixed"])
    else:  # the asset bench/backfill.py materializes
        partitions = cursor_range_partitions(0, rows, rows)
        asset = backfill_asset("public.mixed", cursor="id", partitions_def=partitions)
        resources["ledger"] = LedgerResource()
        kwargs["partition_key"] = f"0..{rows}"
    marks["definitions"] = mark("Definitions and the asset job")
    defs = dg.Definitions(assets=[asset], resources=resources)
    job = defs.resolve_implicit_global_asset_job_def()
    marks["instance"] = mark("the ephemeral instance")
    instance = dg.DagsterInstance.ephemeral()
    clock = Clock()
    clock.wrap(instance, "handle_new_event", "Dagster: storing events (handle_new_event)")
    clock.wrap(instance, "add_run_tags", "Dagster: run tags")
    (instrument_snapshot if run == "snapshot" else instrument_backfill)(clock)
    marks["execute"] = mark("execute_in_process")
    result = job.execute_in_process(instance=instance, **kwargs)
    marks["executed"] = mark("after the run")
    checks = result.get_asset_check_evaluations()
    if not result.success or not all(c.passed for c in checks):
        raise SystemExit(f"the run failed or its check did not pass: {checks}")
    events = [e.dagster_event.event_type_value for e in instance.all_logs(result.run_id)
              if e.dagster_event is not None]  # fmt: skip
    from tests.helpers.memory import own_peak_mb

    figures: dict[str, Any] = {
        "run": run, "marks": marks, "seconds": clock.seconds, "concurrent": clock.concurrent,
        "calls": clock.calls, "segments": clock.segments, "outermost": clock.outermost,
        "rss_mb": own_peak_mb(),
        "events": {t: events.count(t) for t in sorted(set(events))},
        "modules": len(sys.modules), "package": dpone_dagster.__version__,
    }  # fmt: skip
    figures["marks"]["end"] = mark("exit")
    print(json.dumps(figures))
    sys.stdout.flush()


def imports_by_phase(stderr: str) -> dict[str, tuple[float, int]]:
    """``-X importtime``'s top-level imports, summed per phase mark: (seconds, modules)."""
    found: dict[str, tuple[float, int]] = {}
    phase = "interpreter start"
    for line in stderr.splitlines():
        if line.startswith(MARK):
            phase = line[len(MARK) :]
            continue
        match = _IMPORT_LINE.match(line)
        if match is None or match.group(4) == "imported":
            continue
        seconds, modules = found.get(phase, (0.0, 0))
        top = len(match.group(3)) <= 1  # its cumulative time covers its nested imports
        found[phase] = (seconds + (int(match.group(2)) / 1e6 if top else 0.0), modules + 1)
    return found


def untimed(figures: dict[str, Any], begin: float, end: float) -> float:
    """Seconds of ``[begin, end]`` the main thread spent outside every timed call."""
    timed = sum(e - s for s, e in figures["outermost"] if s >= begin and e <= end)
    return float(end - begin - timed)


def phases(figures: dict[str, Any], spawned: float, ended: float) -> list[tuple[str, float]]:
    """The child's phases, from its spawn to its exit, in order; they add up to its time."""
    m, segments = figures["marks"], figures["segments"]
    first, last = segments[0][0], segments[-1][1]
    between = sum(untimed(figures, a[1], b[0]) for a, b in itertools.pairwise(segments))
    return [
        ("interpreter start (python, site, this script)", m["dagster"] - spawned),
        ("import dagster", m["dpone_dagster"] - m["dagster"]),
        ("import dpone_dagster", m["factories"] - m["dpone_dagster"]),
        ("import the factories and resources (Dagster layer)", m["assets"] - m["factories"]),
        ("build the assets and resources", m["definitions"] - m["assets"]),
        ("build the Definitions, resolve the job", m["instance"] - m["definitions"]),
        ("the ephemeral instance", m["execute"] - m["instance"]),
        ("Dagster: run start to the step's body", untimed(figures, m["execute"], first)),
        *figures["seconds"].items(),
        ("Dagster: between the step's yields", between),
        ("Dagster: the step's end to the run's result", untimed(figures, last, m["executed"])),
        ("after the run: result, event log read, print", m["end"] - m["executed"]),
        ("process exit (interpreter teardown)", ended - m["end"]),
    ]


PHASE_IMPORTS = {
    "interpreter start": "interpreter start (python, site, this script)",
    "import dagster": "import dagster",
    "import dpone_dagster": "import dpone_dagster",
    "dpone_dagster's Dagster layer": "import the factories and resources (Dagster layer)",
    "assets and resources": "build the assets and resources",
    "Definitions and the asset job": "build the Definitions, resolve the job",
    "the ephemeral instance": "the ephemeral instance",
    "after the run": "after the run: result, event log read, print",
}
"""The stderr mark (``-X importtime``'s phase) of each phase row that is mostly imports."""


def run_child(run: str, source: str, target: str, rows: int) -> dict[str, Any]:
    """One cold child (``python -X importtime``), timed from its spawn to its exit: its
    figures, phases, seconds and imports."""
    argv = [
        sys.executable, "-X", "importtime", __file__, "--child", run, "--source", source,
        "--target", target, "--rows", str(rows),
    ]  # fmt: skip
    spawned = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    ended = time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"the {run} child failed:\n{err[-4000:]}\n{out[-2000:]}")
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    figures["phases"] = phases(figures, spawned, ended)
    figures["total"] = ended - spawned
    figures["imports"] = imports_by_phase(err)
    return figures


def scan(dsn: str) -> tuple[float, dict[str, int]]:
    """One read of every row version of the target table, as the check's target side reads
    it (``xmin`` of each row): its execution time and its shared buffers
    (``EXPLAIN (ANALYZE, BUFFERS)``)."""
    from tests.helpers import pg

    plan = pg.fetch_all(
        dsn,
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        "SELECT count(*), bool_and(xmin::text <> '0') FROM public.mixed",
    )
    top: Any = plan[0][0]
    top = top[0]
    buffers = {k: int(top["Plan"].get(f"Shared {k.title()} Blocks", 0))
               for k in ("hit", "read", "dirtied", "written")}  # fmt: skip
    return float(top["Execution Time"]) / 1000, buffers


def server_counters(dsn: str) -> tuple[int, int, int]:
    """The WAL position (bytes) and the buffers backends and checkpoints wrote, so far."""
    from tests.helpers import pg

    row: Any = pg.fetch_all(
        dsn,
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, buffers_backend, buffers_checkpoint "
        "FROM pg_stat_bgwriter",
    )[0]
    return int(row[0]), int(row[1]), int(row[2])


def measure(run: str, source: str, target: str, rows: int) -> dict[str, Any]:
    """Raw pipe, the cold child, raw pipe; the server's counters around the child (with a
    checkpoint after it: the pages it left dirty) and a re-read of its target."""
    from bench import backfill, snapshot_copy
    from tests.helpers import pg

    def pipe_run() -> float:
        if run == "snapshot":
            return snapshot_copy.raw_pipe(source, target)
        return backfill.raw_pipe(source, target)

    before = pipe_run()
    if run == "snapshot":
        snapshot_copy.settle_server(target)  # the target keeps the pipe's rows, as there
    else:
        backfill.fresh_target(target, table=False)  # the step creates it, as a first run does
    counters = server_counters(target)
    figures = run_child(run, source, target, rows)
    pg.execute(target, "CHECKPOINT")
    after_counters = server_counters(target)
    figures["wal_mb"] = (after_counters[0] - counters[0]) / 1e6
    figures["backend_writes"] = after_counters[1] - counters[1]
    figures["checkpoint_writes"] = after_counters[2] - counters[2]
    figures["reread"] = scan(target)
    figures["pipes"] = [before, pipe_run()]
    return figures


def print_run(figures: dict[str, Any], rows: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Prints the run's table (phase, seconds, share, imports) and its figures beside it;
    returns the table's rows and those figures for the result file."""
    total, pipes = figures["total"], figures["pipes"]
    pipe_s = sum(pipes) / len(pipes)
    imports = {PHASE_IMPORTS.get(k, k): v for k, v in figures["imports"].items()}
    print(f"\n== {figures['run']}: cold process {total:.2f} s for {rows:,} rows; raw pipe "
          f"{pipes[0]:.2f} / {pipes[1]:.2f} s (ratio {pipe_s / total:.2f})")  # fmt: skip
    print(f"{'phase':<58} {'seconds':>8} {'share':>6} {'imports s':>10} {'calls':>6}")
    table = []
    for name, seconds in figures["phases"]:
        imported = imports.get(name, (0.0, 0))[0]
        calls = figures["calls"].get(name, "")
        shown = f"{imported:.2f}" if imported else ""
        print(f"{name:<58} {seconds:8.3f} {seconds / total:6.1%} {shown:>10} {calls!s:>6}")
        table.append({"run": figures["run"], "phase": name, "seconds": round(seconds, 3),
                      "share": f"{seconds / total:.1%}", "imports_seconds": round(imported, 3),
                      "calls": calls or None})  # fmt: skip
    accounted = sum(s for _, s in figures["phases"])
    print(f"{'sum of the phases (the process: ' + f'{total:.2f} s)':<58} {accounted:8.3f}")
    for name, seconds in figures["concurrent"].items():
        print(f"  concurrent, other thread: {name:<44} {seconds:6.3f} s")
    lazy, modules = figures["imports"].get("execute_in_process", (0.0, 0))
    print(f"  modules imported during the run (inside the rows above): {modules}, {lazy:.2f} s")
    copy = sum(s for n, s in figures["phases"] if n.startswith("copy:"))
    print(f"  fixed cost: the process minus the pipe {total - pipe_s:.2f} s "
          f"({(total - pipe_s) / pipe_s:.0%} of the pipe); minus its own COPY of the rows "
          f"{total - copy:.2f} s ({(total - copy) / pipe_s:.0%} of the pipe)")  # fmt: skip
    reread_s, buffers = figures["reread"]
    print(f"  server: WAL {figures['wal_mb']:.0f} MB; buffers written by backends "
          f"{figures['backend_writes']}, by the checkpoint after the run "
          f"{figures['checkpoint_writes']} (pages the run left dirty); peak RSS "
          f"{figures['rss_mb']} MB")  # fmt: skip
    print(f"  the target's rows read again after the run: {reread_s:.2f} s, buffers {buffers}")
    print(f"  Dagster events stored: {sum(figures['events'].values())} {figures['events']}")
    summary = {
        "process_seconds": round(total, 2), "pipe_seconds": [round(p, 2) for p in pipes],
        "ratio": round(pipe_s / total, 2), "fixed_seconds": round(total - pipe_s, 2),
        "fixed_share_of_pipe": f"{(total - pipe_s) / pipe_s:.0%}",
        "beyond_own_copy_seconds": round(total - copy, 2),
        "concurrent_seconds": {k: round(v, 3) for k, v in figures["concurrent"].items()},
        "run_imports": {"modules": modules, "seconds": round(lazy, 3)},
        "wal_mb": round(figures["wal_mb"]), "backend_writes": figures["backend_writes"],
        "checkpoint_writes": figures["checkpoint_writes"],
        "reread": {"seconds": round(reread_s, 3), "buffers": buffers},
        "events": figures["events"], "peak_rss_mb": figures["rss_mb"],
    }  # fmt: skip
    return table, summary


def hint_bits(source: str, target: str) -> tuple[tuple[float, dict[str, int]], ...]:
    """Two reads of a table the raw pipe just wrote (no hint bits set yet, nothing frozen)."""
    from bench import snapshot_copy

    snapshot_copy.raw_pipe(source, target)
    return scan(target), scan(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=RUNS)
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.source, args.target, args.rows)
        return
    from bench import result_file
    from tests.helpers import pg

    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_tgt")
    began = result_file.machine(target)
    try:
        for start in range(1, args.rows + 1, 500_000):
            pg.create_mixed_table(source, rows=min(500_000, args.rows - start + 1), start=start)
        pg.execute(source, "VACUUM (FREEZE, ANALYZE) public.mixed")
        pg.create_mixed_table(target, rows=0)
        first, second = hint_bits(source, target)
        print(f"a table the raw pipe just wrote, read twice (count and xmin of every row): "
              f"{first[0]:.2f} s {first[1]}, then {second[0]:.2f} s {second[1]}")  # fmt: skip
        table: list[dict[str, Any]] = []
        summaries: dict[str, dict[str, Any]] = {}
        for run in args.runs:
            rows, summaries[run] = print_run(measure(run, source, target, args.rows), args.rows)
            table += rows
    finally:
        pg.drop_database(source)
        pg.drop_database(target)
    if args.json:
        result_file.write(
            args.json, "cold_split", began, table, table_rows=args.rows, runs=summaries,
            hint_bits={"first_read_s": round(first[0], 2), "second_read_s": round(second[0], 2),
                       "first_buffers": first[1], "second_buffers": second[1]},
        )  # fmt: skip


if __name__ == "__main__":
    main()
