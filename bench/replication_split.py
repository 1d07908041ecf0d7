"""Where a replication backlog's time goes: the engine's runs of one backlog, run by run, with
the client's own CPU beside each run's wall time, and optionally a profile.

    .venv/bin/python bench/replication_split.py                           # 1M rows, 300k changes
    .venv/bin/python bench/replication_split.py --changes 1000000 --budget 250000
    .venv/bin/python bench/replication_split.py --profile                 # cProfile, by cumulative
    PGOPTIONS="-c work_mem=64MB" .venv/bin/python bench/replication_split.py   # a session setting

The source, the backlog (60% updates, 30% inserts, 10% deletes on live keys) and the server's
decode rate are ``bench/replication.py``'s; the group is copied first, then drained in this
process by runs of ``--budget`` changes (0: one run). For each run it prints its changes, its
wall seconds, the client's CPU seconds (``time.process_time``: decoding and staging; the rest
of the wall time is the servers' work and the waits for it) and the slot's restart and confirmed
positions after it; then the backlog's changes per second. ``PGOPTIONS`` reaches every session
the engine opens (libpq reads it), so a server setting can be tried without a code change.
Everything it creates is dropped at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.replication import backlog, changes_of, checkpoint, decode_rate, make_source, run  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.logical import drop_logical_database  # noqa: E402


def drain(source: str, target: str, slot: str, budget: int | None) -> tuple[int, float]:
    """Runs until the slot is drained, printing each run; the changes and the wall seconds."""
    started, total = time.perf_counter(), 0
    while True:
        wall, cpu = time.perf_counter(), time.process_time()
        report = run(source, target, slot, budget)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        total += changes_of(report)
        restart, confirmed = pg.fetch_all(
            source,
            "SELECT restart_lsn::text, confirmed_flush_lsn::text FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        )[0]
        print(f"run: {changes_of(report):>9,} changes  {wall:6.2f} s  client CPU {cpu:5.2f} s"
              f"  slot restart {restart} confirmed {confirmed}")  # fmt: skip
        if not report.budget_reached:
            return total, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=300_000)
    parser.add_argument("--budget", type=int, default=0, help="changes per run (0: one run)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the drain")
    args = parser.parse_args()
    source = make_source(args.rows)
    target = pg.create_database("dpone_bench_split_tgt")
    slot = f"dpone_split_{uuid.uuid4().hex[:8]}"
    try:
        run(source, target, slot)  # the initial copy
        written = backlog(source, args.changes, random.Random(23))
        seconds, decoded = decode_rate(source, slot)
        print(f"backlog {written.written:,} changes; server decode {decoded / seconds:,.0f}/s")
        checkpoint(target)
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            profile.enable()
        total, wall = drain(source, target, slot, args.budget or None)
        if profile is not None:
            profile.disable()
        print(f"applied {total:,} changes in {wall:.2f} s = {total / wall:,.0f} changes/s")
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    finally:
        drop_logical_database(source)  # its slot with it
        pg.drop_database(target)


if __name__ == "__main__":
    main()
