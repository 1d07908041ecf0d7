"""Where a snapshot copy's time and WAL go, statement by statement, beside the raw pipe's.

Builds the benchmark's mixed-type table (1,000,000 rows by default) in a fresh source database
and an indexed empty copy of its shape in a fresh target database, sets
``log_min_duration_statement = 0`` on both databases (``ALTER DATABASE``: every session there
logs each statement with its duration), then runs, one after the other:

- the raw binary ``psql | psql`` pipe (``bench/pipe.py``) into the emptied target table;
- ``copy_tables(..., strategy=..., sink="replace")``, in this process;
- with ``--dagster``, ``dagster.materialize`` of ``snapshot_copy_assets`` and its check;
- with ``--backfill``, ``Backfill(..., cursor="id").run()`` (its default batches, then its
  reconciliation) into the emptied target table, its ledger in the target.

For each it prints its seconds, the WAL the server wrote meanwhile (``pg_current_wal_lsn()``
before and after: the whole server's, so run it where nothing else writes) and, from the
server's log (``--log``, the Debian cluster's by default), the statements' durations grouped by
their text (digits folded), largest first, for each database. A ``COPY`` relayed from one
session into another logs on both sides over the same wall time: the phases overlap.

    .venv/bin/python bench/copy_phases.py
    .venv/bin/python bench/copy_phases.py --rows 3000000 --dagster
    .venv/bin/python bench/copy_phases.py --backfill
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psycopg import conninfo, sql  # noqa: E402

from bench import pipe  # noqa: E402
from dpone_dagster.snapshot_copy import Strategy, copy_tables  # noqa: E402
from tests.helpers import pg  # noqa: E402

LOG = "/var/log/postgresql/postgresql-15-main.log"
_DURATION = re.compile(
    r"@(\S+) LOG:  duration: ([\d.]+) ms  (?:statement|execute [^:]*|parse [^:]*|bind [^:]*): (.*)"
)
_DIGITS = re.compile(r"\d+")


def dbname(dsn: str) -> str:
    """The DSN's database name."""
    return str(conninfo.conninfo_to_dict(dsn)["dbname"])


def wal_lsn(dsn: str) -> int:
    """The server's current WAL position, in bytes."""
    return int(str(pg.fetch_one(dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")))


def measured(name: str, target: str, log: Path, run: Callable[[], object]) -> None:
    """Runs ``run`` after a checkpoint; prints its seconds (what it returns, if a float: its own
    timing), the server's WAL meanwhile and the statements the log shows for the bench's
    databases."""
    pg.execute(target, "CHECKPOINT")
    offset = log.stat().st_size if log.exists() else 0
    lsn = wal_lsn(target)
    started = time.perf_counter()
    own = run()
    seconds = own if isinstance(own, float) else time.perf_counter() - started
    wal = wal_lsn(target) - lsn
    print(f"\n== {name}: {seconds:.2f} s, WAL written by the server {wal / 1e6:.0f} MB")
    if not log.exists():
        print(f"   (no server log at {log}: no statement durations)")
        return
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    totals: dict[tuple[str, str], list[float]] = defaultdict(list)
    for match in _DURATION.finditer(text):
        database, ms, statement = match.groups()
        key = _DIGITS.sub("N", statement.strip())[:90]
        totals[(database, key)].append(float(ms))
    for (database, key), values in sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:14]:
        side = "source" if "src" in database else "target"
        print(f"   {side} {sum(values) / 1000:7.3f} s  x{len(values):<5} {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--strategy", default="batched_copy", choices=[s.value for s in Strategy])
    parser.add_argument("--dagster", action="store_true", help="also the Dagster asset + check")
    parser.add_argument("--backfill", action="store_true", help="also the backfill, to done")
    parser.add_argument("--log", default=LOG, help="the server's log file")
    args = parser.parse_args()
    source, target = pg.create_database("dpone_bench_src"), pg.create_database("dpone_bench_tgt")
    log = Path(args.log)
    try:
        for start in range(1, args.rows + 1, 500_000):
            pg.create_mixed_table(source, rows=min(500_000, args.rows - start + 1), start=start)
        pg.execute(source, "VACUUM (FREEZE, ANALYZE) public.mixed")
        pg.create_mixed_table(target, rows=0)
        for dsn in (source, target):
            pg.execute(
                dsn,
                sql.SQL("ALTER DATABASE {} SET log_min_duration_statement = 0").format(
                    sql.Identifier(dbname(dsn))
                ),
            )
        pg.execute(target, "TRUNCATE public.mixed")
        measured("raw psql pipe", target, log,
                 lambda: pipe.psql_pipe(source, target, "public.mixed"))  # fmt: skip
        measured(f"copy_tables {args.strategy}", target, log, lambda: copy_tables(
            source, target, ["public.mixed"], strategy=args.strategy, sink="replace"))  # fmt: skip
        if args.dagster:
            from bench.materialize import timed_materialize
            from dpone_dagster import (
                PostgresSourceResource,
                PostgresTargetResource,
                snapshot_copy_assets,
            )

            assets = snapshot_copy_assets(["public.mixed"], strategy=args.strategy)
            resources = {
                "source": PostgresSourceResource(dsn=source),
                "target": PostgresTargetResource(dsn=target),
            }
            measured("dagster.materialize + check", target, log,
                     lambda: timed_materialize([assets], resources)[0])  # fmt: skip
        if args.backfill:
            from dpone_dagster.backfill import Backfill

            pg.execute(target, "DROP TABLE public.mixed")
            pg.create_mixed_table(target, rows=0)
            measured("backfill to done", target, log, lambda: Backfill(
                source, target, "public.mixed", cursor="id").run())  # fmt: skip
    finally:
        pg.drop_database(source)
        pg.drop_database(target)


if __name__ == "__main__":
    main()
