"""How the demo tells its story: one line per step, what happened and why it matters.

Every step of ``demo/run`` materializes assets of ``definitions.py`` with the dagster CLI, quietly
(:func:`materialize`: the run's console logger at ``WARNING``, Python's warnings off, the CLI's
output kept and shown only when the step fails), then :func:`say` prints one line from what the
databases hold. ``python -m demo.story copy`` and ``python -m demo.story backfill`` are the
snapshot copy's and the backfill's steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

import psycopg

from demo.seed import choose

QUIET = json.dumps({"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
"""The run config of every demo run: Dagster's console shows warnings and errors only."""


def say(step: str, what: str, why: str) -> None:
    """One line of the story: the step, what happened, and why it matters."""
    print(f"{step:<15} {what} -- {why}")


def materialize(
    select: str, *more: str, env: Mapping[str, str] | None = None, where: str = "definitions.py"
) -> None:
    """Materializes ``select`` of the code location ``where`` with the dagster CLI, quietly; on
    failure, prints what the CLI said and exits with its status."""
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    done = subprocess.run(
        [dagster, "asset", "materialize", "-f", where, "--select", select,
         "--config-json", QUIET, *more],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )  # fmt: skip
    if done.returncode != 0:
        print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
        print(f"demo: materializing {select} failed (exit {done.returncode})", file=sys.stderr)
        raise SystemExit(done.returncode)


def count(dsn: str, table: str) -> int:
    """Rows of ``table`` (a fixed demo name)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608
    return int(found[0]) if found else 0


def copy() -> None:
    """The shop's three related tables, copied under one source snapshot."""
    materialize("group:shop")
    target = choose("target").dsn
    rows = [count(target, t) for t in ("shop.customers", "shop.orders", 'shop."Order Items"')]
    say(
        "snapshot copy",
        "customers, orders, order items: {:,} / {:,} / {:,} rows under ONE source snapshot".format(
            *rows
        ),
        "the three tables agree with each other, as in the source",
    )


def backfill() -> None:
    """A month of page views, one daily partition after another, in one run."""
    materialize("events/page_views", "--partition-range", "2026-01-01...2026-01-31")
    target = choose("target").dsn
    with psycopg.connect(target) as conn:
        runs = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded') "
            "FROM dpone_ledger.backfill_runs"
        ).fetchone()
    assert runs is not None
    say(
        "backfill",
        f"events.page_views: {count(target, 'events.page_views'):,} rows in 31 daily "
        f"partitions, one run; backfill ledger: {runs[0]} runs, {runs[1]} succeeded",
        "each batch is checkpointed, so a crash resumes where it stopped",
    )


def main(argv: list[str]) -> int:
    """Runs the step named by ``argv[0]``: ``copy`` or ``backfill``."""
    steps = {"copy": copy, "backfill": backfill}
    if len(argv) != 1 or argv[0] not in steps:
        print(f"usage: python -m demo.story {{{'|'.join(steps)}}}", file=sys.stderr)
        return 2
    steps[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
