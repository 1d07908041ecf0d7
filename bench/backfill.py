"""Backfill benchmark: the raw binary COPY pipe against the backfill, from an empty target to done.

    .venv/bin/python bench/backfill.py                   # 1,000,000 rows, batches by width
    .venv/bin/python bench/backfill.py --batch 50000     # 50,000-row batches
    .venv/bin/python bench/backfill.py --repeat 5        # five alternating rounds: best, median
    .venv/bin/python bench/backfill.py --rows 3000000    # the flat-memory check at 3M rows
    .venv/bin/python bench/backfill.py --rows 100000 --json bench/results/backfill.json

It creates its own databases on ``DPONE_TEST_PG_DSN`` (default: local postgres) and drops them.
Each round measures, on the same mixed-type table (16 columns, about 320 bytes per row in binary
COPY), one after the other:

* raw pipe: ``psql COPY ... TO STDOUT (FORMAT binary) | psql COPY ... FROM STDIN (FORMAT binary)``
  into an empty target with the same primary key, right before and right after each measured
  path (raw, backfill, raw, Dagster path, raw, ...): a path's ratio is the mean of the two raw
  times around it over its own time, since this machine's speed drifts;
* the backfill, in a child process (its peak RSS is its own ``VmHWM``), from an empty target
  with its key (the engine alone creates no table):
  ``Backfill.batches()`` to the mark (each batch under its own snapshot, counted, hashed,
  committed with its receipt), then ``Backfill.reconcile()`` (every batch range on both servers,
  under one snapshot each: proven by row versions where nobody wrote it since its batch, else
  by count and exact content hash). "To done" is the two together. For contrast, the same
  reconciliation with every range hashed (``row_versions=False``) is timed after it;
* the checkpoint cost: the real ``RunLedger.record`` (receipt INSERT and run compare-and-swap)
  timed 400 times inside the real batch transaction at ~100,000 and at ~1,000,000 rows already
  copied, each time rolled back to a savepoint so the ledger is left as it was; medians;
* what a Dagster user runs, in another child process, without a target table (the step creates
  it, and builds its key once the rows are in, as a first backfill does): ``dagster.materialize``
  of ``backfill_asset("public.mixed", cursor="id", partitions_def=cursor_range_partitions(0,
  rows, rows))`` for its one partition, with the factory's default options
  (batches sized from the table's width) and its default ``dpone_reconciled`` check, timed
  around ``materialize`` after a warm-up materialization of a trivial asset (the process has
  loaded Dagster, as a run worker has);
* what a run worker pays, in a fresh ``python`` process: it imports Dagster and the package,
  builds the ``Definitions`` of that asset and its resources and executes their asset job for
  the one partition; timed from the process's start to its exit (``bench/materialize.py``).

Beside each ratio it prints the raw pipe's median seconds and its spread over the pipe runs
around that path; a ratio whose pipe runs spread over 15% (``--max-spread``) is printed as
``refused``, with why (``bench/pipe.py``). Per batch, it prints where the time goes beyond the
relay, from the engine's own phase calls (``on_phase``): before the copy (the run's lock, the
run and receipt read in the ledger, the batch's snapshot, its bounds and the column check), the
copy (the relay with its content hash, the target's count and row-version evidence, the
receipt and the run written: the batch-commit protocol's ``"commit"`` phase comes just before
the COMMIT), the commit (the COMMIT), and what hashing the batch's bytes alone
costs (SHA-256 of as many bytes, in the relay's 64 KiB writes).

Then, once, the seed's row-by-row approach (select as JSON, look up, ``jsonb_populate_record``
insert) on 20,000 rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench import pipe, result_file  # noqa: E402
from bench.backfill_report import Summary, phase_lines, phase_ms, print_round  # noqa: E402
from dpone_dagster.backfill import (  # noqa: E402
    Backfill,
    BackfillOptions,
    BackfillRun,
    BatchReceipt,
    RunLedger,
)
from dpone_dagster.postgres.copy import RELAY_WRITE  # noqa: E402
from dpone_dagster.reconcile import Proof  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.memory import own_peak_mb  # noqa: E402

SAMPLES = 400
WARMUP = 20


class TimedLedger(RunLedger):
    """The real ledger; at two points of the run it times many checkpoint writes in place."""

    def __init__(self, schema: str, points: list[int]) -> None:
        super().__init__(schema)
        self.points = points
        self.timings: dict[int, list[float]] = {}
        self.sampling = 0.0

    def record(
        self, conn: Any, before: BackfillRun, after: BackfillRun, receipt: BatchReceipt
    ) -> None:
        copied = before.progress.copied_count
        if self.points and (copied >= self.points[0] or after.progress.remaining_estimate == 0):
            self.points.pop(0)
            samples = self.timings.setdefault(copied, [])
            began = time.perf_counter()
            for _ in range(SAMPLES):
                with conn.transaction(force_rollback=True):  # a savepoint, rolled back
                    started = time.perf_counter()
                    super().record(conn, before, after, receipt)
                    samples.append(time.perf_counter() - started)
            self.sampling += time.perf_counter() - began
        super().record(conn, before, after, receipt)


PHASE_AFTER = {"copy": "before copy", "commit": "copy", "committed": "commit"}
"""The phase each of the engine's phase calls ends."""


class BatchPhases:
    """Seconds spent in each phase of the batches, summed, from the engine's ``on_phase`` calls
    (a phase runs from the previous call, or from :meth:`start`, to the one that ends it)."""

    def __init__(self) -> None:
        self.mark = time.perf_counter()
        self.seconds = dict.fromkeys(PHASE_AFTER.values(), 0.0)

    def start(self) -> None:
        """The first batch starts now."""
        self.mark = time.perf_counter()

    def on_phase(self, phase: str) -> None:
        """Ends the phase that ``phase`` closes."""
        now = time.perf_counter()
        self.seconds[PHASE_AFTER[phase]] += now - self.mark
        self.mark = now


def sha256_seconds(size: int) -> float:
    """Seconds SHA-256 takes over ``size`` bytes fed in the relay's writes (a batch's content
    hash costs this much of its copy)."""
    chunk, digest = os.urandom(RELAY_WRITE), hashlib.sha256()
    started = time.perf_counter()
    for _ in range(-(-size // RELAY_WRITE)):
        digest.update(chunk)
    return time.perf_counter() - started


def child(source: str, target: str, batch: int, rows: int) -> None:
    """Runs the backfill in this process and prints its timings as JSON."""
    phases = BatchPhases()
    backfill = Backfill(
        source, target, "public.mixed", cursor="id",
        options=BackfillOptions(batch_size=batch or None), on_phase=phases.on_phase,
    )  # fmt: skip
    ledger = TimedLedger(backfill.ledger.schema, [100_000, rows])
    backfill.ledger = ledger
    started = time.perf_counter()
    backfill.plan()
    plan_seconds = time.perf_counter() - started
    phases.start()
    batches = sum(1 for _ in backfill.batches())
    copy_seconds = time.perf_counter() - started
    receipts = [r.observation for r in backfill.receipts()]
    moved = sum(o.byte_count for o in receipts)
    started = time.perf_counter()
    report = backfill.reconcile()
    reconcile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    hashed = backfill.reconcile(row_versions=False)
    hash_seconds = time.perf_counter() - started
    backfill.close()
    content_hash_seconds = sha256_seconds(moved)
    print(
        json.dumps(
            {
                "batches": batches,
                "batch_rows": max(o.source_count for o in receipts),
                "copy_seconds": copy_seconds - ledger.sampling,  # without the extra samples
                "reconcile_seconds": reconcile_seconds,
                "reconciled": report.ok and hashed.ok,
                "proven": report.proven_by(Proof.ROW_VERSIONS),
                "ranges": len(report.ranges),
                "hash_seconds": hash_seconds,
                "plan_seconds": plan_seconds,
                # The ledger's extra samples run where the receipt is written: in the copy
                # phase, which ends just before the COMMIT.
                "phases": {**phases.seconds, "copy": phases.seconds["copy"] - ledger.sampling},
                "content_hash_seconds": content_hash_seconds,
                "checkpoints": {
                    str(k): statistics.median(v[WARMUP:]) * 1000 for k, v in ledger.timings.items()
                },
                "rss_mb": own_peak_mb(),
            }
        )
    )


def one_partition_asset(source: str, target: str, rows: int) -> tuple[Any, dict[str, Any]]:
    """The backfill asset of one ``0..rows`` partition with its defaults, and its resources."""
    from dpone_dagster import (
        LedgerResource,
        PostgresSourceResource,
        PostgresTargetResource,
        backfill_asset,
        cursor_range_partitions,
    )

    asset = backfill_asset(
        "public.mixed", cursor="id", partitions_def=cursor_range_partitions(0, rows, rows)
    )
    resources = {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }
    return asset, resources


def row_count(result: Any) -> int:
    """The ``dagster/row_count`` of the run's one materialization."""
    [event] = result.get_asset_materialization_events()
    return int(event.materialization.metadata["dagster/row_count"].value)


def child_dagster(source: str, target: str, rows: int) -> None:
    """Materializes the backfill asset's one partition with its defaults; prints its figures."""
    from bench.materialize import timed_materialize

    asset, resources = one_partition_asset(source, target, rows)
    seconds, result = timed_materialize([asset], resources, partition_key=f"0..{rows}")
    print(json.dumps({"seconds": seconds, "rows": row_count(result), "rss_mb": own_peak_mb()}))


def child_cold(source: str, target: str, rows: int) -> None:
    """A run worker's run of the asset's one partition: imports Dagster and the package, builds
    the Definitions and materializes (the parent times this whole process)."""
    from bench.materialize import materialize_definitions

    asset, resources = one_partition_asset(source, target, rows)
    result = materialize_definitions([asset], resources, partition_key=f"0..{rows}")
    print(json.dumps({"rows": row_count(result), "rss_mb": own_peak_mb()}))


def raw_pipe(source: str, target: str) -> float:
    """Seconds of the raw pipe into a fresh, empty target with the same primary key."""
    fresh_target(target)
    return pipe.psql_pipe(source, target, "public.mixed")


def seed_row_by_row(source: str, target: str, rows: int, batch: int = 1000) -> float:
    """The seed's data path: rows fetched as JSON, looked up and inserted one by one."""
    started = time.perf_counter()
    after = ""
    with psycopg.connect(source) as src, psycopg.connect(target) as dst:
        while True:
            fetched = src.execute(
                "SELECT id::text, to_jsonb(source_row) FROM public.mixed source_row WHERE"
                " (%(after)s = '' OR id > nullif(%(after)s, '')::bigint) AND id <= %(hwm)s"
                " ORDER BY id LIMIT %(limit)s",
                {"after": after, "hwm": rows, "limit": batch},
            ).fetchall()
            src.commit()
            for stable_id, value in fetched:
                existing = dst.execute(
                    "SELECT to_jsonb(d) FROM public.mixed d WHERE id::text = %s", (stable_id,)
                ).fetchone()
                if existing is None:
                    dst.execute(
                        "INSERT INTO public.mixed SELECT * FROM"
                        " jsonb_populate_record(null::public.mixed, %s)",
                        (psycopg.types.json.Jsonb(value),),
                    )
            dst.commit()
            if len(fetched) < batch:
                break
            after = str(fetched[-1][0])
    return time.perf_counter() - started


LEDGER_TABLES = "dpone_ledger.backfill_runs, dpone_ledger.backfill_batch_receipts, " + (
    "dpone_ledger.backfill_range_checks"
)


def fresh_target(dsn: str, *, table: bool = True) -> None:
    """A ledger that holds no run (its tables exist, as every run but a target database's
    first finds them) and an empty target table with its key; with ``table=False`` no target
    table: the asset's step creates it, as a first backfill of the table does (its key then
    built once the rows are in, ``dpone_dagster.backfill.deferred_key``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        RunLedger().ensure(conn)
    pg.execute(dsn, f"TRUNCATE {LEDGER_TABLES}")
    pg.execute(dsn, "DROP TABLE IF EXISTS public.mixed")
    if table:
        pg.create_mixed_table(dsn, rows=0)
    pg.execute(dsn, "CHECKPOINT")


def run_child(
    source: str, target: str, batch: int, rows: int, mode: str = "--child"
) -> tuple[float, dict[str, Any], float]:
    """The backfill (``--child``), its asset after a warm-up (``--dagster``) or its asset in a
    cold process (``--cold``), in a process of its own from an empty target: (the process's
    seconds from start to exit, its figures, its peak RSS in MB)."""
    fresh_target(target, table=mode == "--child")  # the engine alone creates no table
    return pipe.cold_process(
        [sys.executable, __file__, mode, source, target, str(batch), str(rows)]
    )


PATHS = ("backfill", "dagster", "cold")
"""The measured paths of a round, in order, each between two raw-pipe runs."""


def measure_round(
    source: str, target: str, batch: int, rows: int, first: bool, pipes: list[float]
) -> dict[str, Any]:
    """One round: each path of :data:`PATHS`, each followed by a raw-pipe run (appended to
    ``pipes``, whose last run precedes the round); the round's figures."""
    _, stats, rss = run_child(source, target, batch, rows)
    assert stats["reconciled"], "the reconciliation found differences"
    if first:
        src_print = pg.table_fingerprint(source, "public", "mixed")
        assert src_print == pg.table_fingerprint(target, "public", "mixed")
    pipes.append(raw_pipe(source, target))
    _, dagster, dagster_rss = run_child(source, target, batch, rows, "--dagster")
    pipes.append(raw_pipe(source, target))
    cold, _, cold_rss = run_child(source, target, batch, rows, "--cold")
    pipes.append(raw_pipe(source, target))
    around = dict(zip(PATHS, (pipes[-4:-2], pipes[-3:-1], pipes[-2:]), strict=True))
    raw = {k: statistics.mean(v) for k, v in around.items()}
    copy, rec = stats["copy_seconds"], stats["reconcile_seconds"]
    cp = list(stats["checkpoints"].items())
    return {
        "raw": raw["backfill"], "copy": copy, "reconcile": rec, "hash_all": stats["hash_seconds"],
        "batches_ratio": raw["backfill"] / copy, "done_ratio": raw["backfill"] / (copy + rec),
        "dagster": dagster["seconds"], "dagster_ratio": raw["dagster"] / dagster["seconds"],
        "dagster_rss": dagster_rss, "cold": cold, "cold_ratio": raw["cold"] / cold,
        "cold_rss": cold_rss, "cp_at": [int(cp[0][0]), int(cp[-1][0])], "cp_early": cp[0][1],
        "cp_late": cp[-1][1], "cp_ratio": cp[-1][1] / cp[0][1], "rss": rss,
        "pipes": around, "stats": stats,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--batch", type=int, default=0,
        help="rows per batch of the engine's run (0: chosen from the table's width, the default)",
    )  # fmt: skip
    parser.add_argument("--seed-rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=1, help="alternating rounds")
    parser.add_argument(
        "--max-spread", type=float, default=pipe.MAX_SPREAD,
        help="largest spread of the pipe runs around a path for which its ratio is printed",
    )  # fmt: skip
    for mode in ("--child", "--dagster", "--cold"):
        parser.add_argument(mode, nargs=4, metavar=("SOURCE", "TARGET", "BATCH", "ROWS"))
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), int(args.child[3]))
        return
    if args.dagster:
        child_dagster(args.dagster[0], args.dagster[1], int(args.dagster[3]))
        return
    if args.cold:
        child_cold(args.cold[0], args.cold[1], int(args.cold[3]))
        return
    rows = args.rows
    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_dst")
    began = result_file.machine(target)
    rounds: list[dict[str, Any]] = []
    try:
        pg.create_mixed_table(source, rows=rows)
        pg.execute(source, "VACUUM ANALYZE public.mixed")
        # raw pipe, backfill, raw pipe, Dagster path, raw pipe, cold process, raw pipe...: each
        # path is compared with the raw pipe right before and right after it (the machine's
        # speed drifts).
        pipes = [raw_pipe(source, target)]
        for n in range(args.repeat):
            rounds.append(measure_round(source, target, args.batch, rows, n == 0, pipes))
            print_round(n + 1, rounds[-1], rows)
        seed_rows = min(args.seed_rows, rows)
        fresh_target(target)
        seed = seed_row_by_row(source, target, seed_rows)
    finally:
        pg.drop_database(source)
        pg.drop_database(target)
    summary = Summary(rounds, rows, args.max_spread)
    batch = rounds[0]["stats"]["batch_rows"]
    print(f"\nrows {rows:,}, batch {batch:,} ({'given' if args.batch else 'from the width'}), "
          f"{args.repeat} round(s); ratios are of the raw")  # fmt: skip
    print("pipe's time right before and after each path (best = highest ratio); beside each: the")
    print(f"pipe's median seconds and spread over those runs (its {len(pipes)} runs spread "
          f"{pipe.spread(pipes):.0%}):")  # fmt: skip
    print("\n".join(summary.lines(seed_rows / seed)))
    print("\n".join(phase_lines(rounds)))
    for path in PATHS:
        why = pipe.refusal(path, summary.pipes(path), args.max_spread)
        if why is not None:
            print(why)
    if args.json:
        result_file.write(
            args.json, "backfill", began, summary.table(seed_rows / seed), table_rows=rows,
            batch=batch, repeat=args.repeat, raw_pipe_spread=f"{pipe.spread(pipes):.0%}",
            max_spread=f"{args.max_spread:.0%}", batch_phases_ms=phase_ms(rounds),
        )  # fmt: skip


if __name__ == "__main__":
    main()
