"""Every job at scale: the time per million rows and the peak RSS of a snapshot copy, a backfill
of the whole table as partitions in one run and a replication group's initial copy, from 1M to
100M rows of a narrow table.

    .venv/bin/python bench/scale.py --rows 1000000 10000000                  # the smoke test
    .venv/bin/python bench/scale.py --rows 1000000 10000000 100000000 \\
        --json bench/results/scale.json                                      # a quiet machine

The table is narrow (``id bigint`` primary key, an ``integer`` and a short ``text``: about
:data:`ROW_BYTES` bytes a row with its key, 7-8 GB at 100M rows), so a size the machine's disk
holds is reached. It lives on the replication tests' server (``wal_level = logical``: the
embedded PostgreSQL 18 of ``.dpone_pg/`` unless ``DPONE_TEST_LOGICAL_DSN`` names one), the one
source of all three jobs; the targets are databases on ``DPONE_TEST_PG_DSN`` (default: the local
PostgreSQL). Before anything is built, it prints what the largest size needs on disk, by server
(the source table and its key; the target table and its key, the staging table a snapshot copy
swaps in, the key build's sort files; the WAL each server keeps between checkpoints, twice its
``max_wal_size``) and checks it against the free space of each server's file system; short of
it, it refuses and says how much is missing.

For each size, in a fresh pair of databases (dropped before the next size), each in a child
process of its own (its peak RSS is its own ``VmHWM``), timed around ``dagster.materialize``
after a warm-up materialization (Dagster's own start is left out, as a run worker has paid it):

- the raw binary ``psql | psql`` pipe into an empty target table with its key (the yardstick);
- ``snapshot``: ``snapshot_copy_assets(["public.narrow"])`` with its defaults and its check;
- ``backfill``: ``backfill_asset("public.narrow", cursor="id")`` over partitions of
  ``--partition-rows`` rows, every partition in one run (its ``BackfillPolicy.single_run``
  default), its default batches and check, without a target table (its step creates it and
  builds its key once the rows are in, as a first backfill does);
- ``replication``: the first materialization of ``replication_assets(["public.narrow"])`` (the
  publication, the slot and the initial copy under its snapshot, its check), into an empty
  target.

Each job's row: seconds, seconds per million rows and its multiple of the smallest size's,
peak RSS and its multiple, the WAL the target's server wrote meanwhile and the target table's
size after it (what the disk really took, beside the estimate printed first). Last, the hours a
billion rows would take each job on this machine at the rate of the largest size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import pipe, result_file  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.logical import drop_logical_database, logical_admin_dsn  # noqa: E402
from tests.helpers.memory import own_peak_mb  # noqa: E402

NARROW = "CREATE TABLE public.narrow (id bigint PRIMARY KEY, qty integer NOT NULL, code text)"
FILL = """INSERT INTO public.narrow SELECT g, (g * 7919) %% 100000, 'c' || (g %% 1000003)::text
FROM generate_series(%s::bigint, %s::bigint) AS g"""
ROW_BYTES = 80
"""Disk a narrow row takes with its primary key, with room to spare (52 bytes of heap tuple and
line pointer, about 23 of key entry: the 1M smoke run measures about 73)."""
SORT_BYTES = 30
"""Disk a row's key takes in the sort files of a snapshot copy's key build."""
JOBS = ("snapshot", "backfill", "replication")
CHUNK = 5_000_000


@dataclass(frozen=True)
class Need:
    """Bytes one server needs for the largest size, and where its data lives."""

    server: str
    directory: str
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def setting(dsn: str, name: str) -> str:
    return str(pg.fetch_one(dsn, f"SHOW {name}"))


def wal_keep(dsn: str) -> int:
    """Twice the server's ``max_wal_size``: the WAL it keeps between checkpoints, at most."""
    value = pg.fetch_one(
        dsn, "SELECT setting::bigint * 1024 * 1024 FROM pg_settings WHERE name = 'max_wal_size'"
    )
    return 2 * int(str(value))


def needs(source: str, target: str, rows: int) -> list[Need]:
    """What the largest size needs on each server's disk (see the module's docstring)."""
    table = rows * ROW_BYTES
    return [
        Need("source", setting(source, "data_directory"),
             {"source table and key": table, "WAL": wal_keep(source)}),
        Need("target", setting(target, "data_directory"),
             {"target table and key (the snapshot copy's staging table swapped in)": table,
              "key build's sort files": rows * SORT_BYTES, "WAL": wal_keep(target)}),
    ]  # fmt: skip


def check_disk(found: list[Need]) -> list[str]:
    """Prints the needs and returns them as lines; refuses when a file system has less free
    space than its servers need.

    Raises:
        SystemExit: a data directory is not visible here, or the space is short.
    """
    by_device: dict[int, tuple[str, int]] = {}
    rows: list[str] = []
    for need in found:
        if not Path(need.directory).is_dir():
            raise SystemExit(
                f"The {need.server} server's data directory {need.directory} is not visible "
                "here, so its free space cannot be checked: run the benchmark on the servers' "
                "machine."
            )
        device = os.stat(need.directory).st_dev
        path, total = by_device.get(device, (need.directory, 0))
        by_device[device] = (path, total + need.total)
        for part, size in need.parts.items():
            print(f"  {need.server:<7} {part:<70} {size / 1e9:8.1f} GB")
            rows.append(f"{need.server}: {part} {size / 1e9:.1f} GB")
    for path, total in by_device.values():
        free = shutil.disk_usage(path).free
        print(f"  file system of {path}: needs {total / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
        if free < total:
            raise SystemExit(
                f"Not enough disk: the file system of {path} has {free / 1e9:.1f} GB free and "
                f"this run needs {total / 1e9:.1f} GB ({(total - free) / 1e9:.1f} GB more). Free "
                "space there, or run a smaller --rows."
            )
    return rows


def build_source(rows: int) -> str:
    """A database on the logical server holding ``public.narrow`` with ``rows`` rows."""
    source = pg.create_database("dpone_bench_scale_src", logical_admin_dsn())
    pg.execute(source, NARROW)
    for start in range(1, rows + 1, CHUNK):
        pg.execute(source, FILL, (start, min(rows, start + CHUNK - 1)))
    pg.execute(source, "VACUUM ANALYZE public.narrow")
    return source


def fresh_target(target: str) -> None:
    """An empty target table with its key and no ledger, after a checkpoint."""
    pg.execute(target, "DROP SCHEMA IF EXISTS dpone_ledger CASCADE")
    pg.execute(target, "DROP TABLE IF EXISTS public.narrow")
    pg.execute(target, NARROW)
    pg.execute(target, "CHECKPOINT")


def resources(source: str, target: str) -> dict[str, Any]:
    from dpone_dagster import LedgerResource, PostgresSourceResource, PostgresTargetResource

    return {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }


def child(job: str, source: str, target: str, rows: int, partition_rows: int) -> None:
    """Materializes ``job`` in this process after a warm-up; prints seconds and peak RSS."""
    from bench.materialize import timed_materialize
    from dpone_dagster import (
        backfill_asset,
        cursor_range_partitions,
        replication_assets,
        snapshot_copy_assets,
    )

    kwargs: dict[str, Any] = {}
    if job == "snapshot":
        asset = snapshot_copy_assets(["public.narrow"])
    elif job == "replication":
        asset = replication_assets(["public.narrow"], slot="dpone_bench_scale")
    else:
        parts = cursor_range_partitions(0, rows, min(rows, partition_rows))
        asset = backfill_asset("public.narrow", cursor="id", partitions_def=parts)
        keys = parts.get_partition_keys()
        kwargs["tags"] = {"dagster/asset_partition_range_start": keys[0],
                          "dagster/asset_partition_range_end": keys[-1]}  # fmt: skip
    seconds, _ = timed_materialize([asset], resources(source, target), **kwargs)
    print(json.dumps({"seconds": seconds, "rss_mb": own_peak_mb()}))


def wal_bytes(dsn: str) -> int:
    return int(str(pg.fetch_one(dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")))


def measure(job: str, source: str, target: str, rows: int, partition_rows: int) -> dict[str, Any]:
    """One job in a child process into a fresh target: its figures, the target's rows checked."""
    fresh_target(target)
    if job == "backfill":  # its step creates the table, as a first backfill does
        pg.execute(target, "DROP TABLE public.narrow")
    wal = wal_bytes(target)
    load = os.getloadavg()[0]
    if job == "pipe":
        seconds, rss = pipe.psql_pipe(source, target, "public.narrow"), 0.0
    else:
        argv = [sys.executable, __file__, "--child", job, source, target, str(rows),
                str(partition_rows)]  # fmt: skip
        _, figures, rss = pipe.cold_process(argv)
        seconds = float(figures["seconds"])
    copied = pg.fetch_one(target, "SELECT count(*) FROM public.narrow")
    if copied != rows:
        raise SystemExit(f"{job} left {copied} rows in the target, not {rows}")
    size = pg.fetch_one(target, "SELECT pg_total_relation_size('public.narrow')")
    return {"job": job, "rows": rows, "seconds": seconds, "rss_mb": rss, "load": load,
            "wal_bytes": wal_bytes(target) - wal, "target_bytes": int(str(size))}  # fmt: skip


def one_size(
    rows: int, jobs: list[str], target_admin: str, partition_rows: int
) -> list[dict[str, Any]]:
    """Builds the source of ``rows`` rows and runs the raw pipe and each job against it."""
    started = time.perf_counter()
    source = build_source(rows)
    target = pg.create_database("dpone_bench_scale_tgt", target_admin)
    try:
        size = int(str(pg.fetch_one(source, "SELECT pg_total_relation_size('public.narrow')")))
        built = time.perf_counter() - started
        print(f"\n{rows:,} rows: source table {size / 1e9:.2f} GB ({size / rows:.0f} bytes a "
              f"row with its key), built in {built:.0f} s", flush=True)  # fmt: skip
        found = []
        for job in ("pipe", *jobs):
            found.append(measure(job, source, target, rows, partition_rows))
            print_row(found[-1], None)
        return found
    finally:
        drop_logical_database(source)
        pg.drop_database(target)


def per_million(row: dict[str, Any]) -> float:
    return float(row["seconds"]) / (int(row["rows"]) / 1e6)


def print_row(row: dict[str, Any], first: dict[str, Any] | None) -> dict[str, Any]:
    """Prints a job's line (beside the smallest size's same job when given); its result row."""
    growth = "" if first is None else f"{per_million(row) / per_million(first):.2f}"
    rss_growth = (
        "" if first is None or not first["rss_mb"] else f"{row['rss_mb'] / first['rss_mb']:.2f}"
    )
    out = {
        "rows": f"{row['rows']:,}", "job": row["job"], "seconds": round(row["seconds"], 1),
        "s_per_million_rows": round(per_million(row), 2), "of_smallest": growth,
        "peak_rss_mb": round(row["rss_mb"]) or "", "rss_of_smallest": rss_growth,
        "target_gb": round(row["target_bytes"] / 1e9, 2),
        "target_wal_gb": round(row["wal_bytes"] / 1e9, 2), "load": round(row["load"], 2),
    }  # fmt: skip
    print("  " + "  ".join(f"{k} {v}" for k, v in out.items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    parser.add_argument("--partition-rows", type=int, default=10_000_000,
                        help="rows of a backfill partition (the run holds them all)")  # fmt: skip
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job, source, target, rows, partition_rows = args.child
        child(job, source, target, int(rows), int(partition_rows))
        return
    sizes = sorted(args.rows)
    source_admin, target_admin = logical_admin_dsn(), pg.admin_dsn()
    print(f"What {sizes[-1]:,} rows need on disk:")
    disk = check_disk(needs(source_admin, target_admin, sizes[-1]))
    began = result_file.machine(target_admin)
    found = [row for rows in sizes for row in one_size(rows, args.jobs, target_admin,
                                                         args.partition_rows)]  # fmt: skip
    print("\nper million rows, each job beside its smallest size:")
    first = {r["job"]: r for r in found if r["rows"] == sizes[0]}
    table = [print_row(r, first[r["job"]]) for r in found]
    billion = ", ".join(f"{r['job']} {per_million(r) * 1000 / 3600:.1f} h" for r in found
                        if r["rows"] == sizes[-1])  # fmt: skip
    print(f"1,000,000,000 rows at the rate of {sizes[-1]:,}: {billion}")
    if args.json:
        result_file.write(
            args.json, "scale", began, table, sizes=", ".join(f"{n:,}" for n in sizes),
            partition_rows=f"{args.partition_rows:,}",
            source_postgresql=setting(source_admin, "server_version"),
            disk_needed_by_the_largest="; ".join(disk), one_billion_rows_at_its_rate=billion,
        )  # fmt: skip


if __name__ == "__main__":
    main()
