"""Benchmark: each snapshot-copy strategy against the raw binary COPY pipe, in one run.

Builds a table of mixed types (1,000,000 rows, about 330 bytes a row, by default) in a fresh
source database and an indexed copy of its shape in a fresh target database, then times:

- the raw pipe: ``psql -c "COPY ... TO STDOUT (FORMAT binary)" | psql -c "COPY ... FROM STDIN
  (FORMAT binary)"`` into the indexed target table (truncated first);
- every strategy end to end through ``copy_tables(..., sink="replace")`` into that same table,
  each in a child process, so the reported peak RSS (``VmHWM``) is that strategy's alone;
- what a Dagster user runs: ``dagster.materialize`` of ``snapshot_copy_assets(["public.mixed"],
  strategy=...)`` with its default options and its default ``dpone_reconciled`` check, timed
  around the ``materialize`` call after a warm-up materialization of a trivial asset (the child
  process has loaded Dagster, as a run worker has);
- what a run worker pays (``cold:`` rows): a fresh ``python`` process that imports Dagster and
  the package, builds the ``Definitions`` of that asset and its resources and executes their
  asset job, timed from the process's start to its exit (``bench/materialize.py``);
- the same table backfilled instead (``dagster:backfill``, ``cold:backfill``): one ``0..rows``
  partition of ``backfill_asset("public.mixed", cursor="id")`` with its defaults and its check,
  without a target table (its step creates it and builds its key once the rows are in, as a
  first backfill does), whose ledger holds no run (``bench/backfill.py``'s asset and target:
  the ledger's tables exist, as every partition but a target database's first finds them). Beside
  the rows, each round's backfill ratio over the snapshot copy's ratio of the same kind and
  round (``backfill partition / snapshot copy``: the issue's target is 0.9), and its floor: once
  a round, the raw pipe into a new table loaded with ``FREEZE`` and keyed afterwards (the
  snapshot copy's way to load) beside the raw pipe into the keyed table (the way a backfill
  batch must load, into the table users query, whose key finds the rows a batch already holds).
  The second over the first is the most a partition's ratio over the copy's can reach on this
  machine whatever the engine spends beside the load into a keyed target (one that exists). A
  third pipe loads a new unkeyed table made before the load (no ``FREEZE``) and keys it
  afterwards: the most the backfill reaches that builds the key of a target it created once its
  rows are in (``dpone_dagster.backfill.deferred_key``).

Every run is bracketed by raw-pipe runs (raw, strategy, raw, next strategy, ...), and its ratio
is the mean of the two raw-pipe times around it over its own time (1.0 is as fast as the pipe):
this machine's speed drifts, and a baseline measured minutes earlier would blur the ratio. It
prints rows/s, the best and the median ratio of ``--repeat`` rounds, the client's peak RSS and,
beside the ratios, the raw pipe's median seconds and spread over the runs around that row's
runs; a row whose pipe runs spread over 15% (``--max-spread``) prints ``refused`` instead of its
ratios, and says why below the table (``bench/pipe.py``).

Run from the repository root::

    .venv/bin/python bench/snapshot_copy.py                 # 1M rows, every strategy
    .venv/bin/python bench/snapshot_copy.py --rows 3000000  # memory must stay flat
    .venv/bin/python bench/snapshot_copy.py --strategies batched_copy cold:batched_copy
    .venv/bin/python bench/snapshot_copy.py --strategies dagster:batched_copy dagster:backfill \
        cold:batched_copy cold:backfill                     # a partition against the copy

Beside each row it prints the machine's one-minute load average over the row's runs (read
before each run): the figures of a machine other work shares are not a quiet machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import backfill, pipe, result_file  # noqa: E402
from bench.partition_vs_copy import (  # noqa: E402
    Floor,
    backfill_of_copy,
    deferred_pipe,
    frozen_pipe,
    load_cell,
    load_floor,
)
from dpone_dagster.snapshot_copy import SnapshotCopyOptions, copy_tables  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.memory import own_peak_mb as peak_rss_mb  # noqa: E402

STRATEGIES = (
    "batched_copy",
    "partitioned_copy",
    "whole_copy",
    "stream_rows",
    "dagster:batched_copy",
    "dagster:partitioned_copy",
    "cold:batched_copy",
)
TARGETS = {
    "batched_copy": 0.85,
    "partitioned_copy": 0.85,
    "whole_copy": 0.55,
    "stream_rows": 0.18,
    "dagster:batched_copy": 0.85,
    "dagster:partitioned_copy": 0.85,
    "cold:batched_copy": 1.0,
    "cold:partitioned_copy": 1.0,
    "dagster:backfill": 0.85,
    "cold:backfill": 0.85,
}
CHOICES = (*STRATEGIES, "cold:partitioned_copy", "dagster:backfill", "cold:backfill")


def child_dagster(strategy: str, source: str, target: str) -> None:
    """Materializes the snapshot-copy asset with its defaults and its check; prints figures."""
    from bench.materialize import timed_materialize
    from dpone_dagster import PostgresSourceResource, PostgresTargetResource, snapshot_copy_assets

    assets = snapshot_copy_assets(["public.mixed"], strategy=strategy)  # type: ignore[arg-type]
    resources = {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
    }
    seconds, result = timed_materialize([assets], resources)
    [check] = result.get_asset_check_evaluations()
    [event] = result.get_asset_materialization_events()
    rows = event.materialization.metadata["dagster/row_count"].value
    proof = check.metadata["dpone/proof"].value
    print(json.dumps({"seconds": seconds, "rows": rows, "rss_mb": peak_rss_mb(), "proof": proof}))


def child_cold(strategy: str, source: str, target: str) -> None:
    """A run worker's run: imports Dagster and the package, builds the Definitions of the
    snapshot-copy asset and materializes it (the parent times this whole process)."""
    from bench.materialize import materialize_definitions
    from dpone_dagster import PostgresSourceResource, PostgresTargetResource, snapshot_copy_assets

    assets = snapshot_copy_assets(["public.mixed"], strategy=strategy)  # type: ignore[arg-type]
    resources = {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
    }
    result = materialize_definitions([assets], resources)
    [check] = result.get_asset_check_evaluations()
    [event] = result.get_asset_materialization_events()
    rows = event.materialization.metadata["dagster/row_count"].value
    print(json.dumps({"rows": rows, "proof": check.metadata["dpone/proof"].value,
                      "rss_mb": peak_rss_mb()}))  # fmt: skip


def child(strategy: str, source: str, target: str, workers: int, rows: int) -> None:
    """Runs one strategy and prints its figures as JSON (the parent's measurement)."""
    kind, _, name = strategy.rpartition(":")
    if name == "backfill":
        (backfill.child_dagster if kind == "dagster" else backfill.child_cold)(source, target, rows)
        return
    if kind == "dagster":
        child_dagster(name, source, target)
        return
    if kind == "cold":
        child_cold(name, source, target)
        return
    started = time.perf_counter()
    report = copy_tables(
        source,
        target,
        ["public.mixed"],
        options=SnapshotCopyOptions(strategy=strategy, sink="replace", workers=workers),
    )
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "rows": report.rows_loaded, "rss_mb": peak_rss_mb()}))


def settle_server(target: str) -> None:
    """Starts every measurement from the same state: a checkpoint, no dirty WAL backlog."""
    pg.execute(target, "CHECKPOINT")


def raw_pipe(source: str, target: str) -> float:
    pg.execute(target, "TRUNCATE public.mixed")
    settle_server(target)
    return pipe.psql_pipe(source, target, "public.mixed")


def run_strategy(
    strategy: str, source: str, target: str, workers: int, rows: int
) -> dict[str, Any]:
    """One run of ``strategy`` in its own process: its seconds, rows and peak RSS (a ``cold:``
    run's seconds are the whole process's, from its start to its exit). A backfill starts
    without a target table (its step creates it) and with a ledger that holds no run; a
    snapshot copy replaces the pipe's rows."""
    if strategy.endswith(":backfill"):
        backfill.fresh_target(target, table=False)
    settle_server(target)
    argv = [
        sys.executable, __file__, "--child", strategy, "--source", source, "--target", target,
        "--workers", str(workers), "--rows", str(rows),
    ]  # fmt: skip
    if strategy.startswith("cold:"):
        seconds, figures, rss = pipe.cold_process(argv)
        return {**figures, "seconds": seconds, "rss_mb": rss}
    result = subprocess.run(argv, check=True, capture_output=True, text=True)
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def same_rows(source: str, target: str) -> bool:
    """The target holds exactly the source's rows (count and md5 of every row in order)."""
    return bool(
        pg.table_fingerprint(source, "public", "mixed")
        == pg.table_fingerprint(target, "public", "mixed")
    )


def row_name(strategy: str, runs: list[dict[str, Any]], workers: int) -> str:
    """The row's label: the strategy, its workers, or the Dagster path and its check's proof."""
    kind, _, name = strategy.rpartition(":")
    if name == "partitioned_copy" and not kind:
        return f"{strategy} ({workers} workers)"
    if name == "backfill":
        partition = "one backfill_asset partition + check"
        return f"dagster: {partition}" if kind == "dagster" else f"cold process: {partition}"
    if kind == "dagster":
        return f"{strategy} + check ({runs[0]['proof']})"
    if kind == "cold":
        return f"cold process: materialize {name} + check ({runs[0]['proof']})"
    return strategy


def report(
    strategy: str, runs: list[dict[str, Any]], rows: int, workers: int, limit: float
) -> tuple[dict[str, object], str | None]:
    """One line: times, rows/s, the ratio to the raw pipe around each run (``refused`` when
    those pipe runs spread over ``limit``), the pipe's seconds and spread, peak RSS; returns it
    as the JSON result's row, and why its ratio was refused (None: it was not)."""
    if any(int(r["rows"]) != rows for r in runs):
        raise RuntimeError(f"{strategy} copied {[r['rows'] for r in runs]} rows")
    seconds, ratios = [r["seconds"] for r in runs], [r["ratio"] for r in runs]
    pipes = [p for r in runs for p in r["pipes"]]
    name = row_name(strategy, runs, workers)
    best = pipe.ratio_cell(max(ratios), pipes, limit)
    median = pipe.ratio_cell(statistics.median(ratios), pipes, limit)
    pipe_s, pipe_spread = pipe.pipe_cells(pipes)
    print(
        f"{name:<56} {min(seconds):7.2f} {statistics.median(seconds):9.2f} "
        f"{rows / min(seconds):>14,.0f} {best:>11} {median:>13} {pipe_s:>7} {pipe_spread:>7} "
        f"{TARGETS[strategy]:>7.2f} {max(r['rss_mb'] for r in runs):>12.0f} {load_cell(runs):>10}"
    )
    row = {
        "strategy": name,
        "best_seconds": round(min(seconds), 2),
        "rows_per_second": round(rows / min(seconds)),
        "ratio_best": best,
        "ratio_median": median,
        "pipe_seconds": pipe_s,
        "pipe_spread": pipe_spread,
        "target": TARGETS[strategy],
        "peak_rss_mb": round(max(r["rss_mb"] for r in runs)),
        "load": load_cell(runs),
    }
    return row, pipe.refusal(name, pipes, limit)


def measure_rounds(
    args: argparse.Namespace, source: str, target: str
) -> tuple[list[float], dict[str, list[dict[str, Any]]], list[Floor]]:
    """The rounds, each: raw pipe, a strategy, raw pipe, the next strategy, ... so that every
    run is compared with the raw pipe measured right before and right after it (the machine's
    speed drifts; a baseline taken minutes earlier would blur the ratio). With a backfill in
    the run, each round ends with the frozen pipe beside the keyed one before it (the floor).
    Returns the raw pipe's seconds, each strategy's runs and the floor's (keyed, frozen,
    deferred-key) seconds."""
    raws: list[float] = [raw_pipe(source, target)]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.strategies}
    floors: list[Floor] = []
    for round_ in range(args.repeat):
        for strategy in args.strategies:
            load = os.getloadavg()[0]
            figures = run_strategy(strategy, source, target, args.workers, args.rows)
            figures["load"] = load
            if round_ == args.repeat - 1 and not same_rows(source, target):
                raise RuntimeError(f"the target differs from the source after {strategy}")
            raws.append(raw_pipe(source, target))
            figures["pipes"] = raws[-2:]
            figures["ratio"] = (raws[-2] + raws[-1]) / 2 / figures["seconds"]
            runs[strategy].append(figures)
        if any(s.endswith(":backfill") for s in args.strategies):
            floors.append((raws[-1], frozen_pipe(source, target), deferred_pipe(source, target)))
    return raws, runs, floors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--workers", type=int, default=2, help="partitioned COPY workers")
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=CHOICES)
    parser.add_argument(
        "--max-spread", type=float, default=pipe.MAX_SPREAD,
        help="largest spread of the pipe runs around a row for which its ratio is printed",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.source, args.target, args.workers, args.rows)
        return

    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_tgt")
    began = result_file.machine(target)
    try:
        started = time.perf_counter()
        for start in range(1, args.rows + 1, 500_000):
            pg.create_mixed_table(source, rows=min(500_000, args.rows - start + 1), start=start)
        pg.execute(source, "VACUUM (FREEZE, ANALYZE) public.mixed")
        pg.create_mixed_table(target, rows=0)
        size = pg.fetch_one(source, "SELECT pg_total_relation_size('public.mixed')")
        print(
            f"table: {args.rows:,} rows, {int(size) / 1e6:.0f} MB "  # type: ignore[call-overload]
            f"(built in {time.perf_counter() - started:.0f} s); {os.cpu_count()} cores; "
            f"best and median of {args.repeat} runs"
        )
        raws, runs, floors = measure_rounds(args, source, target)
        print(
            f"{'raw binary psql pipe':<56} best {min(raws):6.2f} s  median "
            f"{statistics.median(raws):6.2f} s {args.rows / min(raws):>12,.0f} rows/s, spread "
            f"{pipe.spread(raws):.0%} over its {len(raws)} runs"
        )
        print(
            f"{'strategy':<56} {'best s':>7} {'median s':>9} {'rows/s (best)':>14} "
            f"{'ratio best':>11} {'ratio median':>13} {'pipe s':>7} {'spread':>7} {'target':>7} "
            f"{'peak RSS MB':>12} {'load':>10}"
        )
        reported = [report(s, runs[s], args.rows, args.workers, args.max_spread)
                    for s in args.strategies]  # fmt: skip
        table = [row for row, _ in reported] + backfill_of_copy(runs, args.max_spread)
        table += load_floor(floors, args.max_spread)
        print("target equals source after each strategy's last run (count and md5 of every row)")
        print("pipe s, spread: the raw pipe's median seconds and spread around the row's runs")
        for _, why in reported:
            if why is not None:
                print(why)
        if args.json:
            result_file.write(
                args.json, "snapshot_copy", began, table, table_rows=args.rows,
                table_mb=round(int(size) / 1e6),  # type: ignore[call-overload]
                repeat=args.repeat, raw_pipe_seconds=[round(min(raws), 2), round(max(raws), 2)],
                raw_pipe_spread=f"{pipe.spread(raws):.0%}", max_spread=f"{args.max_spread:.0%}",
            )  # fmt: skip
    finally:
        pg.drop_database(source)
        pg.drop_database(target)


if __name__ == "__main__":
    main()
