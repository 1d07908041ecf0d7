"""Lock-wait benchmark: how long new readers of a target wait while a ``replace`` swap waits for a
reader that holds the table, against a plain ``DROP TABLE`` waiting the same way.

    .venv/bin/python bench/lock_wait.py                # 10 s of sampling each
    .venv/bin/python bench/lock_wait.py --seconds 30

It creates its own databases on ``DPONE_TEST_PG_DSN`` (default: local postgres) and drops them.
A 300-row ``public.mixed`` is copied once; then a session reads the target in a transaction it
keeps open (its ``ACCESS SHARE`` lock stays), and, one after the other for ``--seconds``, new
sessions run ``SELECT count(*)`` on the target and time it:

* while ``copy_tables(..., sink="replace")`` waits for its swap (``lock_wait`` = 120 s): each
  attempt queues readers for at most one ``lock_timeout`` (1 s), then lets them through;
* while a plain session's ``DROP TABLE`` waits (no ``lock_timeout``): every reader after it
  queues behind it (each reader gives up at its 5 s ``statement_timeout``; counted as 5 s).

It prints readers sampled, the longest, the 99th percentile and the median wait of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import result_file  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.postgres import test_lock_wait as lock_test  # noqa: E402

READER_TIMEOUT = 5.0


def sample(dsn: str, seconds: float) -> list[float]:
    """New readers one after the other for ``seconds``: each one's wait (capped at 5 s)."""
    took: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with psycopg.connect(dsn, autocommit=True, application_name="dpone-bench-reader") as conn:
            conn.execute(f"SET statement_timeout = '{int(READER_TIMEOUT * 1000)}ms'")
            started = time.monotonic()
            try:
                conn.execute("SELECT count(*) FROM public.mixed").fetchone()
                took.append(time.monotonic() - started)
            except psycopg.errors.QueryCanceled:
                took.append(READER_TIMEOUT)
    return took


def report(name: str, took: list[float]) -> dict[str, object]:
    """One line: readers, the longest, p99 and median waits; returns it as the JSON row."""
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"{name:<28} readers {len(took):>5}  longest {max(took):6.3f} s  p99 {p99:6.3f} s  "
        f"median {statistics.median(took):6.3f} s"
    )
    return {
        "writer": name,
        "readers": len(took),
        "longest_s": round(max(took), 3),
        "p99_s": round(p99, 3),
        "median_s": round(statistics.median(took), 3),
    }


def with_swap(source: str, target: str, seconds: float) -> list[float]:
    with lock_test.reader_holding(target, lock_test.MIXED) as holder:
        copy = lock_test.CopyThread(source, target, lock_wait=120, sink="replace")
        lock_test.wait_until_the_copy_waits_for_the_lock(target)
        took = sample(target, seconds)
        holder.commit()
        copy.join(120)
    assert copy.error is None, copy.error
    return took


def with_plain_drop(target: str, seconds: float) -> list[float]:
    with lock_test.reader_holding(target, lock_test.MIXED) as holder:
        dropper = psycopg.connect(target, application_name=lock_test.COPY_APP)
        thread = threading.Thread(target=lambda: dropper.execute("DROP TABLE public.mixed"))
        thread.start()
        lock_test.wait_until_the_copy_waits_for_the_lock(target)
        took = sample(target, seconds)
        holder.commit()
        thread.join(60)
        dropper.rollback()
        dropper.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    args = parser.parse_args()
    source, target = pg.create_database("dpone_bsrc"), pg.create_database("dpone_btgt")
    began = result_file.machine(target)
    try:
        lock_test.seed(source, target)
        rows = [
            report("replace swap (lock_wait)", with_swap(source, target, args.seconds)),
            report("plain DROP TABLE", with_plain_drop(target, args.seconds)),
        ]
        if args.json:
            result_file.write(args.json, "lock_wait", began, rows, seconds=args.seconds)
    finally:
        pg.drop_database(source)
        pg.drop_database(target)


if __name__ == "__main__":
    main()
