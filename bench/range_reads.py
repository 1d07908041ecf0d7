"""Benchmark: a snapshot copy's key-range batches read by an index scan or by a bitmap heap scan.

``batched_copy`` reads each batch with ``COPY (SELECT ... WHERE key > lower AND key <= upper)`` and
runs that statement with index scans off (``snapshot_copy/batched_copy.py``), so the planner reads
the range's heap blocks in file order instead of fetching a heap row per key. This script times the
batches' reads both ways, and nothing else: it builds the benchmark's mixed-type table, takes the
batch bounds the engine would (every ``--batch``-th key), and relays every batch into a fresh
staging table in one target transaction (``postgres.copy.relay``, the engine's relay), under one
``REPEATABLE READ`` source transaction with ``enable_indexscan`` on or off. The two ways alternate
``--repeat`` times, each after a checkpoint, with the plan each way chose printed once.

    .venv/bin/python bench/range_reads.py --rows 3000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from dpone_dagster.postgres.copy import relay  # noqa: E402
from tests.helpers import pg  # noqa: E402

RANGE = "SELECT * FROM public.mixed WHERE id > %s AND id <= %s"


def bounds(dsn: str, batch: int) -> list[int]:
    """The upper key of every batch: each ``batch``-th key, then the last."""
    rows = pg.fetch_all(
        dsn,
        "SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM public.mixed) k"
        " WHERE n %% %s = 0 UNION SELECT max(id) FROM public.mixed ORDER BY 1",
        (batch,),
    )
    return [int(r[0]) for r in rows]  # type: ignore[call-overload]


def read_batches(source: str, target: str, uppers: list[int], index_scans: bool) -> float:
    """Seconds to relay every batch into a staging table, range reads as ``index_scans`` says."""
    with psycopg.connect(source) as src, psycopg.connect(target) as tgt:
        src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        src.execute(
            "SELECT set_config('enable_indexscan', %s, true)", ("on" if index_scans else "off",)
        )
        tgt.execute("CREATE TABLE staged (LIKE public.mixed)")
        started = time.perf_counter()
        lower = 0
        for upper in uppers:
            relay(
                src,
                psycopg.sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(
                    psycopg.sql.SQL(RANGE)
                ),
                tgt,
                psycopg.sql.SQL("COPY staged FROM STDIN (FORMAT binary, FREEZE)"),
                params=[lower, upper],
            )
            lower = upper
        tgt.commit()
        seconds = time.perf_counter() - started
        tgt.execute("DROP TABLE staged")
        tgt.commit()
        return seconds


def plan(dsn: str, index_scans: bool, lower: int, upper: int) -> str:
    """The plan's first line for one range, read as ``index_scans`` says."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "SELECT set_config('enable_indexscan', %s, true)", ("on" if index_scans else "off",)
        )
        return str(conn.execute("EXPLAIN " + RANGE, (lower, upper)).fetchone()[0])  # type: ignore[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--batch", type=int, default=250_000, help="rows per batch (the default's)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_tgt")
    try:
        for start in range(1, args.rows + 1, 500_000):
            pg.create_mixed_table(source, rows=min(500_000, args.rows - start + 1), start=start)
        pg.execute(source, "VACUUM (FREEZE, ANALYZE) public.mixed")
        pg.create_mixed_table(target, rows=0)
        uppers = bounds(source, args.batch)
        print(f"{args.rows:,} rows in {len(uppers)} batches of {args.batch:,}")
        for index_scans in (True, False):
            print(
                f"  enable_indexscan {'on ' if index_scans else 'off'}: "
                f"{plan(source, index_scans, 0, uppers[0])}"  # the first batch's range
            )
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeat):
            for index_scans in (True, False):
                pg.execute(target, "CHECKPOINT")
                times[index_scans].append(read_batches(source, target, uppers, index_scans))
        for index_scans, seconds in times.items():
            print(
                f"{'index scans' if index_scans else 'bitmap heap scans'}: median "
                f"{statistics.median(seconds):.2f} s, runs {[round(s, 2) for s in seconds]}"
            )
        print(
            f"index scans over bitmap heap scans (medians): "
            f"{statistics.median(times[True]) / statistics.median(times[False]):.2f}"
        )
    finally:
        pg.drop_database(source)
        pg.drop_database(target)


if __name__ == "__main__":
    main()
