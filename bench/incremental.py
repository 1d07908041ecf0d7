"""Incremental sync benchmark: what a run costs against a full ``batched_copy`` of the table.

    .venv/bin/python bench/incremental.py                  # 1,000,000 rows
    .venv/bin/python bench/incremental.py --repeat 3       # three rounds of each run: medians
    .venv/bin/python bench/incremental.py --rss-rows 3000000   # the flat-memory check
    .venv/bin/python bench/incremental.py --check --repeat 1   # the check's added cost, 1M, 3M
    .venv/bin/python bench/incremental.py --idle --repeat 3    # nothing changed, 1M and 10M
    .venv/bin/python bench/incremental.py --rows 100000 --rss-rows 0 \
        --json bench/results/incremental.json   # the docs page's table, small

It creates its own databases on ``DPONE_TEST_PG_DSN`` (default: local postgres) and drops them.
On ``shop.orders`` (id bigint key, ``updated_at`` indexed, six columns, about 90 bytes a row):

* the baseline: ``copy_tables(..., strategy="batched_copy", sink="replace")`` of the whole table
  into a separate target database, timed before and after the incremental runs (the ratio's
  denominator is the mean of the two, since this machine's speed drifts), and the raw binary
  ``psql COPY | psql COPY`` pipe for scale (rows/s, and the full copy's speed as a share of it);
* the stream's initial load (``IncrementalSync.run()`` on an empty state, ``deletes="hard"``);
* a run after 1% of the rows changed (0.5% updated, 0.5% inserted, spread across the table) and
  a run with nothing changed, each with ``deletes="ignore"`` (the changes, then an index probe)
  and with ``deletes="hard"`` (plus one ``count(*)`` per side: the delete detection);
* a run (``deletes="hard"``) that finds 100 deletes spread at random, printing the keys that
  crossed the wire;
* what a Dagster user runs: ``dagster.materialize`` of ``incremental_asset`` with its defaults
  (its ``dpone_reconciled`` check: the run's keys and a slice of the sweep) after 1% changed
  and with nothing changed, and with ``reconcile=False`` after 1% changed, each in a child
  process and timed around ``materialize`` after a warm-up materialization of a trivial asset;
* peak RSS of the initial load in a child process at ``--rows`` and at ``--rss-rows`` rows;
* with ``--check``, only the ``dpone_reconciled`` check's added cost: the materialization with
  the default check (``sweep=Sweep(rows=--sweep-rows)``, 3,500 by default: a 1M-row table's
  full sweep in 288 runs) minus the same with ``reconcile=False``, after the same kind of change
  (1% changed, nothing changed), as a share of a full ``batched_copy``, at ``--rows`` and at
  ``--check-rows`` rows with the same budget, and the full-sweep period that budget gives.
  Beside each, the check's own time (``dpone/check_seconds``, its comparisons timed inside the
  run): the 3M/1M scale is judged on it, since a difference of two whole materializations is
  within this machine's noise when the check adds a few milliseconds;
* with ``--idle``, only the run with nothing changed, at ``--rows`` and at ``--idle-rows`` rows
  (10M by default), after the engine's initial load: the engine's run (``deletes="ignore"``),
  ``dagster.materialize`` of the asset with ``reconcile=False`` and with its default check at a
  fixed budget (``Sweep(rows=--sweep-rows)``), medians of ``--repeat``; the scans of the target
  table the server counted during one materialization (``pg_stat_user_tables``: none, since
  ``dagster/row_count`` comes from the ledger); and each figure at the large size over the same
  at the small one: a run with nothing to do must not grow with the table.

The floor. Beside each 1% run, the same changes are applied to a second target (a copy of the
first one after the initial load) with the least PostgreSQL work that can apply them: over
sessions kept open, with no catalog read and no ledger (its mark kept in memory), the rows
between its mark and the source's newest cursor are relayed into an unlogged staging table and
merged by one ``MERGE`` (a nested loop over the key), then committed. It runs after the engine's
run in even rounds and before it in odd ones: the first reader of the changed rows prunes the
source pages the writers left. The 1% runs also print the WAL the server wrote during them
(``pg_stat_wal``: bytes and full-page images), since those images are most of the merge's cost.

Each incremental figure is the engine call (``IncrementalSync.run()``), without Dagster's
process start.

Checkpoints. Both databases share this one server, so a CHECKPOINT is the source's as well as
the target's. Each round takes one before the source's writers change rows, then times the run:
the run pays a full-page image for every target page it writes (as a run after each checkpoint
does) and the writers pay theirs for the source pages they wrote, as they would on a source
server of their own, where a checkpoint between their writes and the run's read is rare.
``changed_1pct_cold`` is the strict case, printed beside it without a limit: the checkpoint
falls between the writes and the run, which then also pays the source's full-page images for
pruning the pages the writers left (a run's first read of a page after a checkpoint).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import result_file  # noqa: E402
from bench.pipe import psql_pipe  # noqa: E402
from dpone_dagster.incremental import (  # noqa: E402
    IncrementalOptions,
    IncrementalResult,
    IncrementalSync,
)
from dpone_dagster.postgres.copy import relay  # noqa: E402
from dpone_dagster.snapshot_copy import copy_tables  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.memory import own_peak_mb as peak_rss_mb  # noqa: E402

ORDERS = """
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    updated_at timestamptz NOT NULL DEFAULT now(),
    customer integer NOT NULL,
    status text NOT NULL,
    amount numeric(12, 2),
    note text
);
"""
FILL = """
INSERT INTO shop.orders (id, updated_at, customer, status, amount, note)
SELECT g, now() - interval '1 day' + g * interval '1 millisecond' / 20, g %% 9973,
       (ARRAY['new', 'paid', 'shipped', 'done'])[1 + g %% 4], g * 0.37,
       'order note ' || md5(g::text)
FROM generate_series(%s::bigint, %s::bigint) g
"""
LIMITS = {"changed_1pct": 0.10, "nothing_changed": 0.02, "deletes_100_hard": 0.25}


def make_source(rows: int) -> str:
    source = pg.create_database("dpone_bench_src")
    pg.execute(source, ORDERS)
    step = 1_000_000
    for start in range(1, rows + 1, step):
        pg.execute(source, FILL, (start, min(rows, start + step - 1)))
    pg.execute(source, "CREATE INDEX orders_updated_at ON shop.orders (updated_at)")
    pg.execute(source, "VACUUM ANALYZE shop.orders")
    return source


def sync(
    source: str, target: str, deletes: str = "hard", on_phase: Callable[[str], None] | None = None
) -> IncrementalSync:
    options = IncrementalOptions(deletes=deletes, batch_size=50_000, reconcile=False)
    return IncrementalSync(source, target, "shop.orders", cursor="updated_at", options=options,
                           on_phase=on_phase)  # fmt: skip


def checkpoint(dsn: str) -> None:
    """A CHECKPOINT of the server: every page written after it needs a full-page image."""
    pg.execute(dsn, "CHECKPOINT")


PHASES = ("plan", "read", "merge", "commit")
"""A one-batch run's parts, between the engine's phase calls: from the start to ``copy`` (the
sessions, catalogs, mark, state and staging table), ``copy`` to ``apply`` (the changed rows read
and relayed into staging), ``apply`` to ``commit`` (the merge, receipt and state), and ``commit``
to the end (the COMMIT and the run's report)."""

Timed = tuple[float, IncrementalResult, dict[str, float]]


def timed_run(source: str, target: str, deletes: str = "hard", *, cold: bool = True) -> Timed:
    """One engine call, timed (``cold``: after a CHECKPOINT, else after the caller's), with the
    seconds of its :data:`PHASES` when it ran one batch."""
    if cold:
        checkpoint(target)
    moments: dict[str, list[float]] = {}

    def note(phase: str) -> None:
        moments.setdefault(phase, []).append(time.perf_counter())

    started = time.perf_counter()
    result = sync(source, target, deletes, note).run()
    ended = time.perf_counter()
    phases: dict[str, float] = {}
    if all(len(moments.get(p, ())) == 1 for p in ("copy", "apply", "commit")):
        edges = [started, moments["copy"][0], moments["apply"][0], moments["commit"][0], ended]
        phases = {name: b - a for name, a, b in zip(PHASES, edges, edges[1:], strict=False)}
    return ended - started, result, phases


def full_batched_copy(source: str, target: str) -> float:
    pg.execute(target, "DROP SCHEMA IF EXISTS shop CASCADE")
    pg.execute(target, "CHECKPOINT")
    started = time.perf_counter()
    copy_tables(source, target, "shop.orders", strategy="batched_copy", sink="replace")
    return time.perf_counter() - started


def raw_pipe(source: str, target: str) -> float:
    """Seconds for ``psql COPY TO STDOUT binary | psql COPY FROM STDIN binary`` of the table
    into an empty one of the same definition: the floor a copy through COPY can reach."""
    pg.execute(target, "DROP SCHEMA IF EXISTS shop CASCADE")
    pg.execute(target, ORDERS)
    checkpoint(target)
    return psql_pipe(source, target, "shop.orders")


class Floor:
    """The same changes applied to a second target with the least work (see the docstring)."""

    COLUMNS = "id, updated_at, customer, status, amount, note"
    MERGE = """
        MERGE INTO shop.orders t USING shop.floor_staging s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET updated_at = s.updated_at, customer = s.customer,
            status = s.status, amount = s.amount, note = s.note
        WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.updated_at, s.customer, s.status, s.amount,
            s.note)"""

    def __init__(self, source: str, target: str) -> None:
        self.src = psycopg.connect(source)
        self.tgt = psycopg.connect(target)
        row = self.tgt.execute("SELECT max(updated_at) FROM shop.orders").fetchone()
        self.tgt.commit()
        assert row is not None
        self.mark = row[0]
        """The newest cursor value copied (the ledger's mark, kept in memory)."""

    def run(self) -> tuple[float, dict[str, float]]:
        """Applies what changed since the last call; its seconds, and those of its parts (to
        read and relay, to merge, to commit)."""
        started = time.perf_counter()
        self.src.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        row = self.src.execute("SELECT max(updated_at) FROM shop.orders").fetchone()
        assert row is not None
        self.tgt.execute("CREATE UNLOGGED TABLE shop.floor_staging (LIKE shop.orders)")
        read = sql.SQL(
            "COPY (SELECT " + self.COLUMNS + " FROM shop.orders WHERE updated_at > %s"
            " AND updated_at <= %s ORDER BY updated_at, id) TO STDOUT (FORMAT binary)"
        ).format()
        write = sql.SQL("COPY shop.floor_staging FROM STDIN (FORMAT binary)").format()
        relay(self.src, read, self.tgt, write, params=[self.mark, row[0]])
        relayed = time.perf_counter()
        self.tgt.execute("SET LOCAL enable_hashjoin = off")
        self.tgt.execute("SET LOCAL enable_mergejoin = off")
        self.tgt.execute(self.MERGE)
        self.tgt.execute("DROP TABLE shop.floor_staging")
        merged = time.perf_counter()
        self.tgt.commit()
        self.src.commit()
        self.mark = row[0]
        # Its statistics (pg_stat_wal) reach the server now, not during the engine's next run.
        self.tgt.execute("SELECT pg_stat_force_next_flush()")
        self.tgt.commit()
        ended = time.perf_counter()
        return ended - started, {"read": relayed - started, "merge": merged - relayed,
                                 "commit": ended - merged}  # fmt: skip

    def close(self) -> None:
        self.src.close()
        self.tgt.close()


LSN = "SELECT pg_current_wal_insert_lsn()::text"
IMAGES = "SELECT wal_fpi FROM pg_stat_wal"
ENGINE_SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dpone-dagster'"


def wal_written(dsn: str, run: Callable[[], Timed]) -> tuple[Timed, tuple[float, int]]:
    """``run()`` and the WAL the server wrote meanwhile: (MB, full-page images).

    The bytes are the distance the server's WAL insert position moved. The images come from
    ``pg_stat_wal``, to which a session reports when it ends: they are read once the engine's
    sessions are gone.
    """
    images = int(str(pg.fetch_one(dsn, IMAGES)))
    start = str(pg.fetch_one(dsn, LSN))
    timed = run()
    end = str(pg.fetch_one(dsn, LSN))
    pg.wait_until(lambda: pg.fetch_one(dsn, ENGINE_SESSIONS) == 0, timeout=30,
                  what="the engine's sessions end")  # fmt: skip
    moved = pg.fetch_one(dsn, "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start))
    written = int(str(pg.fetch_one(dsn, IMAGES))) - images
    return timed, (float(str(moved)) / 1e6, written)


def child(source: str, target: str) -> None:
    """The initial load in this process: its time and peak RSS as JSON."""
    seconds, result, _ = timed_run(source, target)
    print(json.dumps({"seconds": seconds, "rows": result.rows, "rss_mb": peak_rss_mb()}))


def child_dagster(source: str, target: str, reconcile: str) -> None:
    """One materialization of ``incremental_asset("shop.orders", cursor="updated_at")`` with
    its defaults (its ``dpone_reconciled`` check included unless ``reconcile`` is ``"no"``; a
    number is the check with ``sweep=Sweep(rows=<it>)``; ``"full"`` the check with
    ``check="full"``), in this process: its seconds as JSON (and the check's metadata). The
    stream is the engine's (same tables and cursor), so it continues it."""
    from bench.materialize import timed_materialize
    from dpone_dagster import (
        LedgerResource,
        PostgresSourceResource,
        PostgresTargetResource,
        incremental_asset,
    )
    from dpone_dagster.incremental import Sweep

    options = IncrementalOptions(reconcile=reconcile != "no")
    if reconcile.isdigit():
        options = options.replace(sweep=Sweep(rows=int(reconcile)))
    if reconcile == "full":
        options = options.replace(check="full")
    asset = incremental_asset("shop.orders", cursor="updated_at", options=options)
    resources = {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }
    seconds, result = timed_materialize([asset], resources)
    checks = result.get_asset_check_evaluations()
    metadata = {k: getattr(v, "value", None) for c in checks for k, v in c.metadata.items()}
    print(json.dumps({"seconds": seconds, "check": metadata}, default=str))


def dagster_child(source: str, target: str, reconcile: str) -> dict[str, Any]:
    """:func:`child_dagster`'s figures from a child process (Dagster's imports not counted)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child-dagster", source, target, reconcile],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def dagster_run(source: str, target: str, reconcile: bool = True) -> float:
    """Seconds of :func:`child_dagster` in a child process (Dagster's imports not counted)."""
    return float(dagster_child(source, target, "yes" if reconcile else "no")["seconds"])


def initial_load_child(source: str, target: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", source, target],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def change_one_percent(source: str, rows: int, round_: int) -> None:
    pg.execute(source, "UPDATE shop.orders SET status = 'changed' || %s, updated_at = now()"
                       " WHERE id %% 200 = %s", (round_, round_ % 200))  # fmt: skip
    start = rows * 10 + round_ * rows
    fresh = FILL.replace("now() - interval '1 day' + g * interval '1 millisecond' / 20", "now()")
    pg.execute(source, fresh, (start, start + rows // 200 - 1))


def delete_random(source: str, rows: int, rng: random.Random) -> None:
    ids = rng.sample(range(1, rows + 1), 100)
    pg.execute(source, "DELETE FROM shop.orders WHERE id = ANY(%s)", (ids,))


def scenario(name: str, runs: list[Timed]) -> dict[str, Any]:
    seconds = [s for s, _, _ in runs]
    last = runs[-1][1]
    timed = [p for _, _, p in runs if p]
    phases = {n: statistics.median(p[n] for p in timed) for n in PHASES} if timed else {}
    return {"name": name, "seconds": statistics.median(seconds), "rows": last.rows,
            "deleted": last.deleted, "keys_compared": last.keys_compared,
            "phases": phases}  # fmt: skip


def copy_database(dsn: str, suffix: str = "floor") -> str:
    """A new database ``<name>_<suffix>`` made from ``dsn``'s.

    ``CREATE DATABASE ... TEMPLATE`` fails while any session is connected to the template, and a
    session closed by its client may still be ending on the server: it waits until
    ``pg_stat_activity`` shows none (the caller closes its own first).
    """
    template = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    name = f"{template}_{suffix}"
    with psycopg.connect(pg.admin_dsn(), autocommit=True) as conn:
        sessions = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        pg.wait_until(lambda: conn.execute(sessions, (template,)).fetchone() == (0,),
                      timeout=30, what=f"no session connected to {template}")  # fmt: skip
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return pg.with_db(pg.admin_dsn(), name)


@dataclass
class Beside:
    """What the benchmark measures beside the 1% runs: the floor's seconds and the WAL."""

    floor: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    wal: list[tuple[float, int]] = field(default_factory=list)
    dagster: list[float] = field(default_factory=list)
    """``dagster.materialize`` of the asset with its check, after 1% changed."""
    dagster_idle: list[float] = field(default_factory=list)
    """The same right after, with nothing changed."""
    dagster_unchecked: list[float] = field(default_factory=list)
    """``reconcile=False``, after 1% changed."""


def measure(
    source: str, target: str, rows: int, repeat: int, made: list[str], beside: Beside
) -> list[dict[str, Any]]:
    rng = random.Random(11)
    results = [scenario("initial_load", [timed_run(source, target)])]
    pg.execute(target, "VACUUM ANALYZE shop.orders")  # as autovacuum does after a bulk load
    floor_target = copy_database(target)
    made.append(floor_target)
    floor = Floor(source, floor_target)
    runs: dict[str, list[Timed]] = {}
    try:
        for round_ in range(repeat):
            # The writers' changes land after a checkpoint and the run follows them (see above).
            checkpoint(target)
            change_one_percent(source, rows, 3 * round_)
            if round_ % 2:  # the first reader of the changed rows prunes the source's pages
                beside.floor.append(floor.run())
            timed, wal = wal_written(
                target, lambda: timed_run(source, target, "ignore", cold=False)
            )
            runs.setdefault("changed_1pct", []).append(timed)
            beside.wal.append(wal)
            if not round_ % 2:
                beside.floor.append(floor.run())
            _other_scenarios(source, target, rows, round_, rng, runs, floor)
        for round_ in range(repeat, repeat + max(1, repeat // 2)):
            checkpoint(target)
            change_one_percent(source, rows, 3 * round_)
            beside.dagster.append(dagster_run(source, target))
            beside.dagster_idle.append(dagster_run(source, target))
            checkpoint(target)
            change_one_percent(source, rows, 3 * round_ + 1)
            beside.dagster_unchecked.append(dagster_run(source, target, reconcile=False))
    finally:
        floor.close()
    return results + [scenario(name, timings) for name, timings in runs.items()]


def _other_scenarios(
    source: str, target: str, rows: int, round_: int, rng: random.Random,
    runs: dict[str, list[Timed]], floor: Floor,
) -> None:  # fmt: skip
    """The round's runs after the 1% one. The floor's target follows each change untimed, so
    that both targets have the same history when the next 1% run is timed (but for the 100
    deletes, which only the engine applies)."""
    runs.setdefault("nothing_changed", []).append(timed_run(source, target, "ignore"))
    checkpoint(target)
    change_one_percent(source, rows, 3 * round_ + 1)
    runs.setdefault("changed_1pct_hard", []).append(timed_run(source, target, cold=False))
    floor.run()
    runs.setdefault("nothing_changed_hard", []).append(timed_run(source, target))
    change_one_percent(source, rows, 3 * round_ + 2)  # the strict case: then a checkpoint
    runs.setdefault("changed_1pct_cold", []).append(timed_run(source, target, "ignore"))
    floor.run()
    checkpoint(target)
    delete_random(source, rows, rng)
    runs.setdefault("deletes_100_hard", []).append(timed_run(source, target, cold=False))


def _row(name: str, seconds: float, full: float, limit: float | None = None) -> dict[str, Any]:
    """One row of the result table (``--json``): a run's median and its ratio to the full copy."""
    ratio = seconds / full
    verdict = "" if limit is None else f"{limit:.2f}: {'met' if ratio <= limit else 'missed'}"
    return {"run": name, "seconds": round(seconds, 3), "of_full_copy": round(ratio, 3),
            "limit": verdict}  # fmt: skip


def report(
    results: list[dict[str, Any]], full: float, raw: float, rows: int, beside: Beside
) -> list[dict[str, Any]]:
    """Prints the runs' figures; returns them as the result table's rows."""
    table = [_row("full batched_copy", full, full)]
    print(f"raw psql COPY pipe of {rows:,} rows: {raw:.2f} s ({rows / raw:,.0f} rows/s)")
    share = raw / full
    print(f"full batched_copy of {rows:,} rows: {full:.2f} s ({rows / full:,.0f} rows/s, "
          f"{share:.2f} of the raw pipe's speed; mean of the runs before and after)")  # fmt: skip
    for r in results:
        ratio = r["seconds"] / full
        limit = LIMITS.get(r["name"])
        verdict = (
            "" if limit is None else f"  (limit {limit:.2f}: {'ok' if ratio <= limit else 'OVER'})"
        )
        extra = ""
        if r["name"] == "deletes_100_hard":
            extra = (f"; {r['deleted']} deleted, {r['keys_compared']} keys crossed the wire"
                     f" ({100 * r['keys_compared'] / rows:.3f}% of the table)")  # fmt: skip
        speed = f"{r['rows'] / r['seconds']:>9,.0f} rows/s" if r["rows"] else " " * 16
        table.append(_row(r["name"], r["seconds"], full, limit))
        print(f"  {r['name']:<24} {r['seconds']:7.3f} s  ratio {ratio:6.3f}  "
              f"rows {r['rows']:>9,} {speed}{extra}{verdict}")  # fmt: skip
        if r["name"] == "changed_1pct" and r["phases"]:
            parts = ", ".join(f"{n} {1000 * t:.0f} ms" for n, t in r["phases"].items())
            print(f"  {'':<24} its parts (medians): {parts}")
            mb = statistics.median(w[0] for w in beside.wal)
            images = statistics.median(w[1] for w in beside.wal)
            print(f"  {'':<24} WAL the server wrote meanwhile (medians): {mb:.0f} MB, "
                  f"{images:,.0f} full-page images")  # fmt: skip
            floor = statistics.median(f[0] for f in beside.floor)
            floor_parts = ", ".join(
                f"{n} {1000 * statistics.median(f[1][n] for f in beside.floor):.0f} ms"
                for n in ("read", "merge", "commit")
            )
            table.append(_row("floor (one MERGE)", floor, full))
            print(f"  {'floor (one MERGE)':<24} {floor:7.3f} s  ratio {floor / full:6.3f}  "
                  f"the same changes by one relay and one MERGE over open sessions, no ledger "
                  f"(the engine takes {r['seconds'] / floor:.2f} of it)")  # fmt: skip
            print(f"  {'':<24} its parts (medians): {floor_parts}")
    dagster = (
        ("dagster_1pct", beside.dagster, "with its defaults and its dpone_reconciled check "
         "(the run's keys and a slice of the sweep), 1% changed"),
        ("dagster_nothing", beside.dagster_idle, "the same, nothing changed"),
        ("dagster_1pct_unchecked", beside.dagster_unchecked, "reconcile=False, 1% changed"),
    )  # fmt: skip
    for name, runs, what in dagster:
        seconds = statistics.median(runs)
        table.append(_row(name, seconds, full))
        print(f"  {name:<24} {seconds:7.3f} s  ratio {seconds / full:6.3f}  dagster.materialize "
              f"of incremental_asset {what}")  # fmt: skip
    return table


def rss_check(source: str, rows: int, rss_rows: int, made: list[str]) -> None:
    """Peak RSS of the initial load at ``rows`` and at ``rss_rows`` rows (child processes)."""
    figures = []
    for count in (rows, rss_rows):
        src = source
        if count != rows:
            src = make_source(count)
            made.append(src)
        target = pg.create_database("dpone_bench_rss")
        made.append(target)
        figures.append((count, initial_load_child(src, target)))
    for count, figure in figures:
        print(f"  initial load of {count:>9,} rows in a child: {figure['seconds']:7.2f} s, "
              f"peak RSS {figure['rss_mb']:.0f} MB")  # fmt: skip


CHECK_LIMITS = {"nothing": 0.05, "1pct": 0.10}
"""The check's added cost, as a share of a full ``batched_copy`` (issue #24)."""
SWEEP_DELETES_LIMIT = 0.03
"""A ``deletes="sweep"`` run with nothing changed, as a share of a full ``batched_copy``."""
CHECK_SCALE_LIMIT = 1.3
"""The added cost at 3M rows over that at 1M rows, with the same per-run budget."""
SCHEDULE_MINUTES = 5


def _added(source: str, target: str, rows: int, round_: int, budget: str) -> dict[str, float]:
    """The check's added seconds, nothing changed and 1% changed: the materialization with the
    check minus the same without it (each after the same kind of change; an untimed
    materialization after each 1% one, so that neither idle run pays for pruning the pages the
    last merge wrote)."""

    def settle() -> None:  # untimed: the next reader prunes the pages the last merge wrote
        dagster_child(source, target, "no")

    changed_with = change_then(
        source, rows, 3 * round_, lambda: dagster_child(source, target, budget)
    )
    settle()
    changed_without = change_then(
        source, rows, 3 * round_ + 1, lambda: dagster_child(source, target, "no")
    )
    settle()
    idle_without = dagster_child(source, target, "no")
    idle_with = dagster_child(source, target, budget)
    return {
        "1pct": changed_with["seconds"] - changed_without["seconds"],
        "nothing": idle_with["seconds"] - idle_without["seconds"],
        "with_1pct": changed_with["seconds"], "without_1pct": changed_without["seconds"],
        "with_nothing": idle_with["seconds"], "without_nothing": idle_without["seconds"],
        "ranges_total": float(idle_with["check"].get("dpone/ranges_total") or 0),
        "keys_checked": float(changed_with["check"].get("dpone/keys_checked") or 0),
        "own_1pct": float(changed_with["check"].get("dpone/check_seconds") or 0),
        "own_nothing": float(idle_with["check"].get("dpone/check_seconds") or 0),
    }  # fmt: skip


def sweep_deletes_idle(source: str, target: str, budget: int | None) -> float:
    """Seconds of an engine run with ``deletes="sweep"`` and nothing changed (its slice)."""
    from dpone_dagster.incremental import Sweep

    sweep = Sweep(rows=budget) if budget else Sweep()
    options = IncrementalOptions(deletes="sweep", batch_size=50_000, sweep=sweep, reconcile=False)
    run = IncrementalSync(source, target, "shop.orders", cursor="updated_at", options=options)
    started = time.perf_counter()
    run.run()
    return time.perf_counter() - started


def change_then(source: str, rows: int, round_: int, run: Callable[[], dict[str, Any]]) -> Any:
    """``run()`` after 1% of the rows changed (and a checkpoint before the writers)."""
    checkpoint(source)
    change_one_percent(source, rows, round_)
    return run()


def check_cost(sizes: list[int], budget: int | None, repeat: int, made: list[str]) -> None:
    """The stream check's added cost (``--check``) at each size, with the same budget."""
    figures: list[tuple[int, float, dict[str, float]]] = []
    for rows in sizes:
        source = make_source(rows)
        full_target = pg.create_database("dpone_bench_full")
        target = pg.create_database("dpone_bench_tgt")
        made += [source, full_target, target]
        before = full_batched_copy(source, full_target)
        pg.execute(full_target, "DROP SCHEMA shop CASCADE")
        timed_run(source, target, "ignore")  # the initial load, by the engine
        pg.execute(target, "VACUUM ANALYZE shop.orders")
        dagster_child(source, target, str(budget or "yes"))  # warm: the ledger's migration
        each = [_added(source, target, rows, r, str(budget or "yes")) for r in range(repeat)]
        sweep_deletes_idle(source, target, budget)  # warm
        swept = [sweep_deletes_idle(source, target, budget) for _ in range(max(3, repeat))]
        full = (before + full_batched_copy(source, full_target)) / 2
        median = {k: statistics.median(e[k] for e in each) for k in each[0]}
        median["sweep_deletes"] = statistics.median(swept)
        figures.append((rows, full, median))
        for dsn in (source, full_target, target):
            pg.drop_database(dsn)
            made.remove(dsn)
    spelled = f"Sweep(rows={budget:,})" if budget else "the default Sweep(runs=288)"
    print(f"the dpone_reconciled check's added cost (materialize with it minus reconcile=False; "
          f"{spelled}; median of {repeat}):")  # fmt: skip
    for rows, full, m in figures:
        print(f"  {rows:>9,} rows: full batched_copy {full:.2f} s")
        for case in ("nothing", "1pct"):
            ratio, limit = m[case] / full, CHECK_LIMITS[case]
            print(f"    {case + ' changed':<16} added {1000 * m[case]:7.0f} ms  ratio {ratio:6.3f}"
                  f"  (limit {limit:.2f}: {'ok' if ratio <= limit else 'OVER'}; with "
                  f"{m['with_' + case]:.3f} s, without {m['without_' + case]:.3f} s; the "
                  f"check's own dpone/check_seconds {1000 * m['own_' + case]:.0f} ms)")  # fmt: skip
        ratio = m["sweep_deletes"] / full
        ok = "ok" if ratio <= SWEEP_DELETES_LIMIT else "OVER"
        print(f"    deletes=\"sweep\", nothing changed (engine): {1000 * m['sweep_deletes']:.0f} ms"
              f"  ratio {ratio:6.3f}  (limit {SWEEP_DELETES_LIMIT:.2f}: {ok})")  # fmt: skip
        period = m["ranges_total"]
        print(f"    full sweep every {period:,.0f} runs ({period * SCHEDULE_MINUTES / 60:.1f} h at "
              f"a {SCHEDULE_MINUTES}-minute schedule); 1% run's keys checked "
              f"{m['keys_checked']:,.0f}")  # fmt: skip
    if len(figures) == 2:
        flat = figures[1][2]["sweep_deletes"] / figures[0][2]["sweep_deletes"]
        print(f'  deletes="sweep" run {figures[1][0]:,} / {figures[0][0]:,} rows: {flat:.2f}')
        for case in ("nothing", "1pct"):
            small, large = figures[0][2][case], figures[1][2][case]
            scale = large / small if small > 0 else float("inf")
            own_small, own_large = figures[0][2]["own_" + case], figures[1][2]["own_" + case]
            own = own_large / own_small if own_small > 0 else float("inf")
            ok = "ok" if own <= CHECK_SCALE_LIMIT else "OVER"
            verdict = f"  (limit {CHECK_SCALE_LIMIT}: {ok})" if case == "nothing" else ""
            print(f"  {case} changed, {figures[1][0]:,} / {figures[0][0]:,} rows: the check's own "
                  f"seconds {own:.2f}{verdict}; the difference of the two materializations "
                  f"{scale:.2f} (a ratio of two differences of whole runs: noise when both are "
                  "a few milliseconds)")  # fmt: skip


IDLE_SCALE_LIMIT = 1.2
"""A run with nothing changed at ``--idle-rows`` over the same at ``--rows``: flat, within the
noise of a run of a few tens of milliseconds."""
SCANS = ("SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
         " WHERE relid = 'shop.orders'::regclass")  # fmt: skip
CLIENTS = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
           " AND backend_type = 'client backend' AND pid <> pg_backend_pid()")  # fmt: skip


def target_scans(target: str) -> int:
    """The scans of the target table the server counted, once every other session of its
    database has ended (a session reports its statistics before it leaves pg_stat_activity)."""
    pg.wait_until(lambda: pg.fetch_one(target, CLIENTS) == 0, timeout=60,
                  what="the target's sessions end")  # fmt: skip
    return int(str(pg.fetch_one(target, SCANS)))


def idle_figures(rows: int, repeat: int, budget: int, made: list[str]) -> dict[str, float]:
    """The runs with nothing changed on a fresh table of ``rows`` rows (``--idle``)."""
    source = make_source(rows)
    target = pg.create_database("dpone_bench_tgt")
    made += [source, target]
    timed_run(source, target, "ignore")  # the initial load, by the engine
    pg.execute(target, "VACUUM ANALYZE shop.orders")
    dagster_child(source, target, "no")  # warm: the ledger's state and the catalogs' caches
    before = target_scans(target)
    dagster_child(source, target, "no")
    scans = target_scans(target) - before
    engine, plain, checked = [], [], []
    for _ in range(repeat):
        engine.append(timed_run(source, target, "ignore", cold=False)[0])
        plain.append(float(dagster_child(source, target, "no")["seconds"]))
        checked.append(float(dagster_child(source, target, str(budget))["seconds"]))
    for dsn in (source, target):
        pg.drop_database(dsn)
        made.remove(dsn)
    return {"engine": statistics.median(engine), "dagster": statistics.median(plain),
            "dagster_checked": statistics.median(checked), "scans": scans}  # fmt: skip


def idle_cost(sizes: list[int], repeat: int, budget: int, made: list[str]) -> None:
    """Prints the runs with nothing changed at each size, and the large size over the small."""
    figures = [(rows, idle_figures(rows, repeat, budget, made)) for rows in sizes]
    what = {
        "engine": 'the engine\'s run (deletes="ignore")',
        "dagster": "dagster.materialize, reconcile=False",
        "dagster_checked": f"dagster.materialize, its check at Sweep(rows={budget:,})",
    }
    print(f"a run with nothing changed (median of {repeat}):")
    for rows, f in figures:
        print(f"  {rows:>11,} rows: target scans during a materialization {f['scans']:.0f}")
        for name, words in what.items():
            print(f"    {name:<16} {1000 * f[name]:8.1f} ms  {words}")
    if len(figures) == 2:
        (small, a), (large, b) = figures
        for name in what:
            scale = b[name] / a[name]
            ok = "ok" if scale <= IDLE_SCALE_LIMIT else "OVER"
            print(f"  {name:<16} {large:,} / {small:,} rows: {scale:.2f}"
                  f"  (limit {IDLE_SCALE_LIMIT}: {ok})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rss-rows", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", nargs=2)
    parser.add_argument("--child-dagster", nargs=3)
    parser.add_argument(
        "--check",
        action="store_true",
        help="only the stream check's added cost, at --rows and --check-rows",
    )
    parser.add_argument("--check-rows", type=int, default=3_000_000)
    parser.add_argument(
        "--idle",
        action="store_true",
        help="only the run with nothing changed, at --rows and --idle-rows",
    )
    parser.add_argument("--idle-rows", type=int, default=10_000_000)
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument(
        "--sweep-rows",
        type=int,
        default=3_500,
        help="the per-run budget of --check (0: the default Sweep(runs=288))",
    )
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.child_dagster:
        child_dagster(*args.child_dagster)
        return
    made: list[str] = []
    if args.idle:
        try:
            sizes = [args.rows] + ([args.idle_rows] if args.idle_rows else [])
            idle_cost(sizes, args.repeat, args.sweep_rows or 3_500, made)
        finally:
            for dsn in made:
                pg.drop_database(dsn)
        return
    if args.check:
        try:
            sizes = [args.rows] + ([args.check_rows] if args.check_rows else [])
            check_cost(sizes, args.sweep_rows or None, args.repeat, made)
        finally:
            for dsn in made:
                pg.drop_database(dsn)
        return
    try:
        source = make_source(args.rows)
        made.append(source)
        full_target = pg.create_database("dpone_bench_full")
        target = pg.create_database("dpone_bench_tgt")
        made += [full_target, target]
        began = result_file.machine(target)
        raw = raw_pipe(source, full_target)
        before = full_batched_copy(source, full_target)
        # The full copy's table is the denominator's output: it must not take the buffers the
        # incremental runs read while they are timed.
        pg.execute(full_target, "DROP SCHEMA shop CASCADE")
        beside = Beside()
        results = measure(source, target, args.rows, args.repeat, made, beside)
        full = (before + full_batched_copy(source, full_target)) / 2
        table = report(results, full, raw, args.rows, beside)
        if args.json:
            result_file.write(
                args.json, "incremental", began, table, table_rows=args.rows,
                repeat=args.repeat, raw_pipe_seconds=round(raw, 2),
            )  # fmt: skip
        if args.rss_rows:
            rss_check(source, args.rows, args.rss_rows, made)
    finally:
        for dsn in made:
            pg.drop_database(dsn)


if __name__ == "__main__":
    main()
