"""Backfill benchmark: the raw binary COPY pipe against the backfill, in one run.

    .venv/bin/python bench/backfill.py                 # 1,000,000 rows, 50,000-row batches
    .venv/bin/python bench/backfill.py --rows 3000000  # the memory check at 3M rows

It creates its own databases on ``DPONE_TEST_PG_DSN`` (default: local postgres) and drops them.
Printed, for the same mixed-type table:

* raw pipe: ``psql COPY ... TO STDOUT (FORMAT binary) | psql COPY ... FROM STDIN (FORMAT binary)``
  into an empty target with the same primary key;
* backfill: ``Backfill.batches()`` from an empty target to the mark (every batch under its own
  snapshot, hashed, counted, committed with its receipt), then the final reconciliation;
* the checkpoint cost (the ledger's receipt INSERT and run UPDATE, timed around the real
  ``Ledger.record_batch`` call) at 100,000 and at 1,000,000 rows already copied;
* the backfill client's peak RSS (its own process, from ``wait4``);
* the seed's row-by-row approach (select as JSON, look up, ``jsonb_populate_record`` insert) on
  20,000 rows.
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

from dpone_dagster.backfill import Backfill, BackfillRun, BatchReceipt, Ledger  # noqa: E402
from tests.helpers import pg  # noqa: E402


class TimedLedger(Ledger):
    """The real ledger, timing each checkpoint write (receipt INSERT + run compare-and-swap)."""

    def __init__(self, schema: str) -> None:
        super().__init__(schema)
        self.timings: list[tuple[int, float]] = []

    def record_batch(
        self, conn: Any, before: BackfillRun, after: BackfillRun, receipt: BatchReceipt
    ) -> None:
        started = time.perf_counter()
        super().record_batch(conn, before, after, receipt)
        self.timings.append((before.progress.copied_count, time.perf_counter() - started))


def child(source: str, target: str, batch: int) -> None:
    """Runs the backfill in this process and prints its timings as JSON."""
    backfill = Backfill(source, target, "public.mixed", cursor="id", batch_size=batch)
    ledger = TimedLedger(backfill.ledger.schema)
    backfill.ledger = ledger
    started = time.perf_counter()
    batches = sum(1 for _ in backfill.batches())
    copy_seconds = time.perf_counter() - started
    started = time.perf_counter()
    report = backfill.reconcile()
    reconcile_seconds = time.perf_counter() - started
    backfill.close()
    print(
        json.dumps(
            {
                "batches": batches,
                "copy_seconds": copy_seconds,
                "reconcile_seconds": reconcile_seconds,
                "reconciled": report.ok,
                "checkpoints": ledger.timings,
            }
        )
    )


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


def run_child(source: str, target: str, batch: int) -> tuple[dict[str, Any], float]:
    """The backfill in its own process: (its timings, its peak RSS in MB)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", source, target, str(batch)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"backfill child failed: {output}")
    return json.loads(output), usage.ru_maxrss / 1024


def checkpoint_at(timings: list[tuple[int, float]], copied: int) -> float:
    """Median milliseconds of the 5 checkpoints written nearest ``copied`` rows already copied
    (the very first checkpoint, which warms the ledger's caches, left out)."""
    nearest = sorted(timings[1:], key=lambda t: abs(t[0] - copied))[:5]
    return statistics.median(t[1] for t in nearest) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--seed-rows", type=int, default=20_000)
    parser.add_argument("--child", nargs=3, metavar=("SOURCE", "TARGET", "BATCH"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_dst")
    try:
        pg.create_mixed_table(source, rows=args.rows)
        pg.execute(source, "VACUUM ANALYZE public.mixed")
        fresh_target(target)
        raw = raw_pipe(source, target)
        fresh_target(target)
        stats, rss = run_child(source, target, args.batch)
        assert pg.table_fingerprint(source, "public", "mixed") == pg.table_fingerprint(
            target, "public", "mixed"
        ), "the backfill's target differs from the source"
        fresh_target(target)
        seed_rows = min(args.seed_rows, args.rows)
        seed = seed_row_by_row(source, target, seed_rows)
    finally:
        pg.drop_database(source)
        pg.drop_database(target)
    raw_rate = args.rows / raw
    rate = args.rows / stats["copy_seconds"]
    total_rate = args.rows / (stats["copy_seconds"] + stats["reconcile_seconds"])
    seed_rate = seed_rows / seed
    at_100k = checkpoint_at(stats["checkpoints"], 100_000)
    at_end = checkpoint_at(stats["checkpoints"], args.rows)
    print(f"rows {args.rows:,}, batch {args.batch:,}, {stats['batches']} batches")
    print(f"raw binary COPY pipe      {raw:7.2f} s  {raw_rate:12,.0f} rows/s  1.00")
    print(
        f"backfill (batches)        {stats['copy_seconds']:7.2f} s  {rate:12,.0f} rows/s  "
        f"{rate / raw_rate:.2f}"
    )
    print(
        f"backfill + reconciliation {stats['copy_seconds'] + stats['reconcile_seconds']:7.2f} s"
        f"  {total_rate:12,.0f} rows/s  {total_rate / raw_rate:.2f}  "
        f"(reconciled: {stats['reconciled']})"
    )
    print(
        f"seed row-by-row ({seed_rows:,})  {seed:7.2f} s  {seed_rate:12,.0f} rows/s  "
        f"{seed_rate / raw_rate:.3f}"
    )
    print(
        f"checkpoint write (median of 5) near 100k copied {at_100k:.2f} ms, near "
        f"{args.rows:,} copied {at_end:.2f} ms (ratio {at_end / at_100k:.2f})"
    )
    print(f"backfill client peak RSS  {rss:.1f} MB")


if __name__ == "__main__":
    main()
