"""Backfill benchmark: the raw binary COPY pipe against the backfill, from an empty target to done.

    .venv/bin/python bench/backfill.py                   # 1,000,000 rows, 50,000-row batches
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
* the backfill, in a child process (its peak RSS comes from ``wait4``), from an empty target:
  ``Backfill.batches()`` to the mark (each batch under its own snapshot, counted, hashed,
  committed with its receipt), then ``Backfill.reconcile()`` (every batch range on both servers,
  under one snapshot each: proven by row versions where nobody wrote it since its batch, else
  by count and exact content hash). "To done" is the two together. For contrast, the same
  reconciliation with every range hashed (``row_versions=False``) is timed after it;
* the checkpoint cost: the real ``RunLedger.record_batch`` (receipt INSERT and run compare-and-swap)
  timed 400 times inside the real batch transaction at ~100,000 and at ~1,000,000 rows already
  copied, each time rolled back to a savepoint so the ledger is left as it was; medians;
* what a Dagster user runs, in another child process, from an empty target: ``dagster.materialize``
  of ``backfill_asset("public.mixed", cursor="id", partitions_def=cursor_range_partitions(0,
  rows, rows))`` for its one partition, with the factory's default options
  (``BACKFILL_BATCH_SIZE`` rows per batch) and its default ``dpone_reconciled`` check, timed
  around ``materialize`` after a warm-up materialization of a trivial asset (the process has
  loaded Dagster, as a run worker has).

Then, once, the seed's row-by-row approach (select as JSON, look up, ``jsonb_populate_record``
insert) on 20,000 rows.
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

import psycopg  # noqa: E402

from bench import result_file  # noqa: E402
from dpone_dagster.backfill import (  # noqa: E402
    Backfill,
    BackfillRun,
    BatchReceipt,
    RunLedger,
)
from dpone_dagster.postgres import BACKFILL_BATCH_SIZE  # noqa: E402
from dpone_dagster.reconcile import Proof  # noqa: E402
from tests.helpers import pg  # noqa: E402

SAMPLES = 400
WARMUP = 20


class TimedLedger(RunLedger):
    """The real ledger; at two points of the run it times many checkpoint writes in place."""

    def __init__(self, schema: str, points: list[int]) -> None:
        super().__init__(schema)
        self.points = points
        self.timings: dict[int, list[float]] = {}
        self.sampling = 0.0

    def record_batch(
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
                    super().record_batch(conn, before, after, receipt)
                    samples.append(time.perf_counter() - started)
            self.sampling += time.perf_counter() - began
        super().record_batch(conn, before, after, receipt)


def child(source: str, target: str, batch: int, rows: int) -> None:
    """Runs the backfill in this process and prints its timings as JSON."""
    backfill = Backfill(source, target, "public.mixed", cursor="id", batch_size=batch)
    ledger = TimedLedger(backfill.ledger.schema, [100_000, rows])
    backfill.ledger = ledger
    started = time.perf_counter()
    batches = sum(1 for _ in backfill.batches())
    copy_seconds = time.perf_counter() - started
    started = time.perf_counter()
    report = backfill.reconcile()
    reconcile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    hashed = backfill.reconcile(row_versions=False)
    hash_seconds = time.perf_counter() - started
    backfill.close()
    print(
        json.dumps(
            {
                "batches": batches,
                "copy_seconds": copy_seconds - ledger.sampling,  # without the extra samples
                "reconcile_seconds": reconcile_seconds,
                "reconciled": report.ok and hashed.ok,
                "proven": report.proven_by(Proof.ROW_VERSIONS),
                "ranges": len(report.ranges),
                "hash_seconds": hash_seconds,
                "checkpoints": {
                    str(k): statistics.median(v[WARMUP:]) * 1000 for k, v in ledger.timings.items()
                },
            }
        )
    )


def child_dagster(source: str, target: str, rows: int) -> None:
    """Materializes the backfill asset's one partition with its defaults; prints its figures."""
    from bench.materialize import timed_materialize
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
    seconds, _ = timed_materialize([asset], resources, partition_key=f"0..{rows}")
    print(json.dumps({"seconds": seconds}))


def raw_pipe(source: str, target: str) -> float:
    """Seconds for psql COPY TO STDOUT binary | psql COPY FROM STDIN binary."""
    out = "COPY public.mixed TO STDOUT (FORMAT binary)"
    inp = "COPY public.mixed FROM STDIN (FORMAT binary)"
    started = time.perf_counter()
    subprocess.run(
        f"psql -X -q -d '{source}' -c '{out}' | psql -X -q -d '{target}' -c '{inp}'",
        shell=True,
        check=True,  # our own DSNs; the shell pipe is the point
    )
    return time.perf_counter() - started


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


def fresh_target(dsn: str) -> None:
    pg.execute(dsn, "DROP SCHEMA IF EXISTS dpone_ledger CASCADE")
    pg.execute(dsn, "DROP TABLE IF EXISTS public.mixed")
    pg.create_mixed_table(dsn, rows=0)
    pg.execute(dsn, "CHECKPOINT")


def run_child(
    source: str, target: str, batch: int, rows: int, mode: str = "--child"
) -> tuple[dict[str, Any], float]:
    """The backfill (or, with ``--dagster``, its asset) in its own process: (its timings, its
    peak RSS in MB)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, mode, source, target, str(batch), str(rows)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"backfill child failed: {output}")
    return json.loads(output), usage.ru_maxrss / 1024


def spread(values: list[float], fmt: str) -> str:
    """``best / median`` of a measurement over the rounds (best is the highest)."""
    return f"best {max(values):{fmt}}  median {statistics.median(values):{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--seed-rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=1, help="alternating rounds")
    parser.add_argument("--child", nargs=4, metavar=("SOURCE", "TARGET", "BATCH", "ROWS"))
    parser.add_argument("--dagster", nargs=4, metavar=("SOURCE", "TARGET", "BATCH", "ROWS"))
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), int(args.child[3]))
        return
    if args.dagster:
        child_dagster(args.dagster[0], args.dagster[1], int(args.dagster[3]))
        return
    rows = args.rows
    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_dst")
    began = result_file.machine(target)
    rounds: list[dict[str, float]] = []
    try:
        pg.create_mixed_table(source, rows=rows)
        pg.execute(source, "VACUUM ANALYZE public.mixed")
        fresh_target(target)
        after = raw_pipe(source, target)
        for n in range(args.repeat):
            # raw pipe, backfill, raw pipe, Dagster path, raw pipe...: each path is compared
            # with the raw pipe right before and right after it (the machine's speed drifts).
            before = after
            fresh_target(target)
            stats, rss = run_child(source, target, args.batch, rows)
            assert stats["reconciled"], "the reconciliation found differences"
            if n == 0:
                src_print = pg.table_fingerprint(source, "public", "mixed")
                assert src_print == pg.table_fingerprint(target, "public", "mixed")
            fresh_target(target)
            between = raw_pipe(source, target)
            fresh_target(target)
            dagster, dagster_rss = run_child(source, target, args.batch, rows, "--dagster")
            fresh_target(target)
            after = raw_pipe(source, target)
            raw, raw_dagster = (before + between) / 2, (between + after) / 2
            copy, rec = stats["copy_seconds"], stats["reconcile_seconds"]
            cp = list(stats["checkpoints"].items())
            rounds.append(
                {
                    "raw": raw,
                    "copy": copy,
                    "reconcile": rec,
                    "hash_all": stats["hash_seconds"],
                    "batches_ratio": raw / copy,
                    "done_ratio": raw / (copy + rec),
                    "dagster": dagster["seconds"],
                    "dagster_ratio": raw_dagster / dagster["seconds"],
                    "dagster_rss": dagster_rss,
                    "cp_early": cp[0][1],
                    "cp_late": cp[-1][1],
                    "cp_ratio": cp[-1][1] / cp[0][1],
                    "rss": rss,
                }
            )
            r = rounds[-1]
            print(
                f"round {n + 1}: raw pipe {raw:5.2f} s {rows / raw:9,.0f} rows/s | batches "
                f"{copy:5.2f} s {r['batches_ratio']:.2f} | reconciliation {rec:5.2f} s ("
                f"{stats['proven']}/{stats['ranges']} ranges by row versions; all hashed "
                f"{stats['hash_seconds']:.2f} s) | to done "
                f"{copy + rec:5.2f} s {r['done_ratio']:.2f} | dagster.materialize + check "
                f"{r['dagster']:5.2f} s {r['dagster_ratio']:.2f} | checkpoint at {int(cp[0][0]):,} "
                f"{cp[0][1]:.3f} ms, at {int(cp[-1][0]):,} {cp[-1][1]:.3f} ms "
                f"({r['cp_ratio']:.2f}) | RSS {rss:.0f} MB",
                flush=True,
            )
        fresh_target(target)
        seed_rows = min(args.seed_rows, rows)
        seed = seed_row_by_row(source, target, seed_rows)
    finally:
        pg.drop_database(source)
        pg.drop_database(target)

    def col(key: str) -> list[float]:
        return [r[key] for r in rounds]

    raw_rates = [rows / r for r in col("raw")]
    print(f"\nrows {rows:,}, batch {args.batch:,}, {args.repeat} round(s); ratios are of the raw")
    print("pipe's rows/s measured right before and after each path (best = highest ratio):")
    print(f"raw binary COPY pipe        rows/s  {spread(raw_rates, '12,.0f')}")
    print(f"backfill, batches only      ratio   {spread(col('batches_ratio'), '.2f')}")
    rec = col("reconcile")
    print(
        f"reconciliation alone        s       best {min(rec):.2f}  median "
        f"{statistics.median(rec):.2f}  ({rows / statistics.median(rec):,.0f} rows/s)"
    )
    hashed = col("hash_all")
    print(
        f"  every range hashed        s       best {min(hashed):.2f}  median "
        f"{statistics.median(hashed):.2f}  (reconcile(row_versions=False), for contrast)"
    )
    print(f"backfill to done            ratio   {spread(col('done_ratio'), '.2f')}  (target 0.70)")
    print(
        f"dagster.materialize + check ratio   {spread(col('dagster_ratio'), '.2f')}  (target 0.75;"
        f" the asset's one partition, defaults: {BACKFILL_BATCH_SIZE:,}-row batches;"
        f" peak RSS {max(col('dagster_rss')):.0f} MB)"
    )
    print(
        f"checkpoint write (median of {SAMPLES - WARMUP}) near 100k copied "
        f"{statistics.median(col('cp_early')):.3f} ms, near {rows:,} "
        f"{statistics.median(col('cp_late')):.3f} ms; ratio per round "
        + ", ".join(f"{v:.2f}" for v in col("cp_ratio"))
    )
    print(f"backfill client peak RSS    MB      max {max(col('rss')):.0f}")
    seed_rate = seed_rows / seed
    print(
        f"seed row-by-row ({seed_rows:,} rows) {seed:.2f} s, {seed_rate:,.0f} rows/s, "
        f"{seed_rate / statistics.median(raw_rates):.3f} of the raw pipe"
    )
    if args.json:
        result_file.write(
            args.json, "backfill", began, _table(rounds, rows, seed_rate / statistics.median(
                raw_rates)), table_rows=rows, batch=args.batch, repeat=args.repeat,
        )  # fmt: skip


def _table(rounds: list[dict[str, float]], rows: int, seed_share: float) -> list[dict[str, Any]]:
    """The printed figures as the result table's rows (``--json``): best and median over the
    rounds (best: the highest ratio, the lowest time)."""

    def col(key: str) -> list[float]:
        return [r[key] for r in rounds]

    def ratio(key: str, target: str = "") -> dict[str, Any]:
        values = col(key)
        return {"best": f"{max(values):.2f}", "median": f"{statistics.median(values):.2f}",
                "target": target}  # fmt: skip

    def seconds(key: str) -> dict[str, Any]:
        values = col(key)
        return {"best": f"{min(values):.2f} s", "median": f"{statistics.median(values):.2f} s",
                "target": ""}  # fmt: skip

    rates = [rows / r for r in col("raw")]
    return [
        {"measure": "raw binary COPY pipe (rows/s)", "best": f"{max(rates):,.0f}",
         "median": f"{statistics.median(rates):,.0f}", "target": ""},
        {"measure": "backfill batches, of the raw pipe's rows/s", **ratio("batches_ratio")},
        {"measure": "final reconciliation", **seconds("reconcile")},
        {"measure": "the same, every range hashed", **seconds("hash_all")},
        {"measure": "to done (batches + reconciliation)", **ratio("done_ratio", "0.70")},
        {"measure": "dagster.materialize of the asset, with its check",
         **ratio("dagster_ratio", "0.75")},
        {"measure": "one checkpoint early / late (ms)",
         "best": f"{statistics.median(col('cp_early')):.3f} / "
                 f"{statistics.median(col('cp_late')):.3f}",
         "median": f"ratio {statistics.median(col('cp_ratio')):.2f}", "target": ""},
        {"measure": "client peak RSS; the Dagster process (MB)",
         "best": f"{max(col('rss')):.0f}; {max(col('dagster_rss')):.0f}", "median": "",
         "target": ""},
        {"measure": "seed row-by-row, of the raw pipe", "best": f"{seed_share:.3f}",
         "median": "", "target": ""},
    ]  # fmt: skip


if __name__ == "__main__":
    main()
