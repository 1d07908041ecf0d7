"""Replication benchmark: what a run of a replication group costs, against the server's own
decode rate, a full ``batched_copy`` and the incremental stream's floor, in one run.

    .venv/bin/python bench/replication.py                   # 1,000,000 rows, 1,000,000 changes
    .venv/bin/python bench/replication.py --rows 100000     # small
    .venv/bin/python bench/replication.py --rows 100000 --json bench/results/replication.json
    .venv/bin/python bench/replication.py --rss-changes 3000000   # peak RSS at 1M and at 3M
    .venv/bin/python bench/replication.py --native-only      # the native subscriber's yardstick

The source is a database on the replication tests' server (``wal_level = logical``: the
embedded PostgreSQL 18 of ``.dpone_pg/`` unless ``DPONE_TEST_LOGICAL_DSN`` names one), the
targets databases on ``DPONE_TEST_PG_DSN`` (default: the local postgres); all are dropped at the
end. The table is ``bench/incremental.py``'s ``shop.orders`` (id bigint key, six columns, about
90 bytes a row), replicated by one group (one slot, one publication). It measures:

* the baseline: ``copy_tables(..., strategy="batched_copy", sink="replace")`` of the whole
  table into another target database, before and after the runs (the ratios' denominator is
  the mean of the two);
* the first run (the initial copy under the slot's snapshot);
* a run with nothing changed, and a run that applies 100 deletes spread at random (each the
  median of three runs): each as a share of the full copy (goal: at most 0.02, no scan of
  either side);
* a run after 1% of the table changed (0.5% updated, 0.5% inserted), beside the floor of
  ``bench/incremental.py`` (the same rows relayed into staging and merged by one ``MERGE`` over
  open sessions, into a copy of the target): the run over the floor (goal: at most 1.3);
* a backlog of ``--changes`` changes (60% updates, 30% inserts, 10% deletes, in transactions of
  1 to 1,000 rows, on keys drawn from the live ids; each statement's row count checked), first
  read by the server alone (``pg_logical_slot_peek_binary_changes`` into ``count(*)``: its
  decode rate), then applied by repeated runs of ``--budget`` changes each in a child process
  (changes per second, the ratio to the decode rate: the issue's goal at least 0.5 and 50,000
  changes/s; its peak RSS); the changes the runs report must be the changes written, and both
  sides must be equal;
* beside it, the merge floor: the target's own rate for that backlog's net effect, applied to a
  copy of the target taken before the backlog by one ``MERGE`` of the final rows of the keys it
  left (relayed into an unlogged staging table beforehand, untimed), one ``DELETE`` of the keys
  it deleted and the COMMIT, over an open session after a CHECKPOINT; the backlog's changes
  over those seconds. The apply's rate over it has a proposed goal of at least 0.5: the server
  decodes into nothing, while any apply writes the rows into an indexed, logged table, which
  on this machine runs far below the decode rate. The floor's own share of the decode rate is
  printed as the ceiling of any apply that writes the rows (the issue's 0.5 is out of reach
  where the ceiling is under it);
* with ``--rss-changes``, a second backlog of that size drained the same way: both peaks RSS
  on one row (flat: the second at most 1.1 times the first);
* one source transaction that updates every row, applied in a child process (its peak RSS:
  goal under 200 MB);
* what a Dagster user runs: ``dagster.materialize`` of ``replication_assets`` (its
  ``dpone_slot_healthy`` check included) with nothing changed and after 1% changed, timed around
  ``materialize`` after a warm-up materialization; and a backlog of a quarter of ``--changes``
  applied by repeated materializations;
* the yardstick (``bench/native.py``, ``--native-repeat`` rounds, 0 to leave it out): the same
  slot backlog of ``--changes`` changes, OLTP and bulk, applied by PostgreSQL's own
  logical-replication subscriber, by the engine alone and by ``dagster.materialize`` with its
  defaults (check included), in turn on the same cluster: each one's ratio to the native
  subscriber, CPU seconds by process, and the engine's peak RSS (``--native-only`` runs this
  section alone; with ``--json NAME.json``, its rows go to ``NAME_native.json``, or with
  ``--native-only`` to ``NAME.json`` itself).

Each engine figure is the engine call (``Replication(...).run()``, without its check:
``reconcile=False``), without Dagster's process start. A CHECKPOINT precedes each timed run and
each engine drain (both targets share one server).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import native, result_file  # noqa: E402
from bench.incremental import (  # noqa: E402
    FILL,
    ORDERS,
    Floor,
    change_one_percent,
    checkpoint,
    copy_database,
    full_batched_copy,
)
from bench.materialize import timed_materialize  # noqa: E402
from dpone_dagster.postgres.copy import relay  # noqa: E402
from dpone_dagster.postgres.identifiers import TableName  # noqa: E402
from dpone_dagster.replication import ReplicationOptions  # noqa: E402
from dpone_dagster.replication.engine import Replication  # noqa: E402
from dpone_dagster.replication.group_plan import ReplicationGroup  # noqa: E402
from dpone_dagster.replication.replication_report import ReplicationReport  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.logical import drop_logical_database, logical_admin_dsn  # noqa: E402
from tests.helpers.memory import own_peak_mb as peak_rss_mb  # noqa: E402

LIMITS = {"nothing_changed": 0.02, "deletes_100": 0.02}
"""The goals as shares of a full ``batched_copy``."""
FLOOR_LIMIT = 1.3
"""The 1% run's goal, as a multiple of the floor."""
DECODE_SHARE, CHANGES_PER_SECOND = 0.5, 50_000
"""The issue's backlog goals: a share of the server's decode rate, and changes per second."""
MERGE_SHARE = 0.5
"""The proposed backlog goal: a share of the merge floor's rate."""
RSS_GROWTH = 1.1
"""Flat: the larger backlog's peak RSS at most this multiple of the first one's."""
SINGLE_TRANSACTION_MB = 200


def make_source(rows: int) -> str:
    """``shop.orders`` with ``rows`` rows on the logical server."""
    source = pg.create_database("dpone_bench_repl_src", logical_admin_dsn())
    pg.execute(source, ORDERS)
    for start in range(1, rows + 1, 1_000_000):
        pg.execute(source, FILL, (start, min(rows, start + 999_999)))
    pg.execute(source, "VACUUM ANALYZE shop.orders")
    return source


def group(slot: str, budget: int | None = None) -> ReplicationGroup:
    return ReplicationGroup(
        tables=(TableName.parse("shop.orders"),),
        slot=slot,
        publication=slot,
        options=ReplicationOptions(max_changes_per_run=budget, reconcile=False),
    )


def run(source: str, target: str, slot: str, budget: int | None = None) -> ReplicationReport:
    return Replication(group(slot, budget), source=source, target=target).run()


def timed(source: str, target: str, slot: str) -> tuple[float, ReplicationReport]:
    """One engine call after a CHECKPOINT: its seconds and report."""
    checkpoint(target)
    started = time.perf_counter()
    report = run(source, target, slot)
    return time.perf_counter() - started, report


def changes_of(report: ReplicationReport) -> int:
    return sum(t.inserted + t.updated + t.deleted for t in report.tables)


def drain(source: str, target: str, slot: str, budget: int | None) -> dict[str, Any]:
    """Runs until the slot is drained (in this process): seconds, runs, changes, peak RSS."""
    started, runs, changes = time.perf_counter(), 0, 0
    while True:
        report = run(source, target, slot, budget)
        runs, changes = runs + 1, changes + changes_of(report)
        if not report.budget_reached:
            break
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "runs": runs, "changes": changes, "rss_mb": peak_rss_mb()}


def drain_child(source: str, target: str, slot: str, budget: int | None) -> dict[str, Any]:
    """:func:`drain` in a child process (its peak RSS is the engine's alone)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", source, target, slot, str(budget or 0)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@dataclass
class Backlog:
    """What :func:`backlog` wrote: its row changes, and their net effect on the keys."""

    written: int = 0
    """Row changes, each checked against its statement's row count."""
    upserted: set[int] = field(default_factory=set)
    """Keys updated or inserted and still live at the end: their final rows are the net effect."""
    deleted: set[int] = field(default_factory=set)
    """Keys that were live before the backlog and were deleted by it."""


def backlog(source: str, changes: int, rng: random.Random) -> Backlog:
    """Writes about ``changes`` row changes (60% updates, 30% inserts, 10% deletes) in
    transactions of 1 to 1,000 rows.

    The keys come from the live ids, read once and kept current: the earlier scenarios insert
    far above the table, so a range of ids between the smallest and the largest is mostly holes,
    and an UPDATE of a hole changes nothing. Each transaction updates distinct random live rows,
    inserts new ids above the largest and deletes the smallest live rows, and each statement's
    row count must be what it was asked to change.
    """
    done = Backlog()
    with psycopg.connect(source) as conn:
        live = [int(r[0]) for r in conn.execute("SELECT id FROM shop.orders ORDER BY id")]
        conn.commit()
        first, before = 0, live[-1]  # live[first:] are the live ids, ascending
        while done.written < changes:
            size = rng.randint(1, 1000)
            updates, inserts = size * 6 // 10, size * 3 // 10
            deletes = min(size - updates - inserts, len(live) - first)
            gone = live[first : first + deletes]
            kept = range(first + deletes, len(live))
            ids = [live[i] for i in rng.sample(kept, min(updates, len(kept)))]
            fresh = range(live[-1] + 1, live[-1] + inserts + 1)
            with conn.cursor() as cur:
                cur.execute(
                    "UPDATE shop.orders SET status = 'b', updated_at = now() WHERE id = ANY(%s)",
                    (ids,),
                )
                assert cur.rowcount == len(ids), (cur.rowcount, len(ids))
                cur.execute(FILL, (fresh.start, fresh.stop - 1))
                assert cur.rowcount == inserts, (cur.rowcount, inserts)
                cur.execute("DELETE FROM shop.orders WHERE id = ANY(%s)", (gone,))
                assert cur.rowcount == deletes, (cur.rowcount, deletes)
            conn.commit()
            live.extend(fresh)
            first += deletes
            done.upserted.update(ids, fresh)
            done.upserted.difference_update(gone)
            done.deleted.update(k for k in gone if k <= before)
            done.written += len(ids) + inserts + deletes
    return done


def merge_floor(source: str, target: str, net: Backlog) -> dict[str, Any]:
    """The target's own apply of a backlog's net effect, into ``target`` (a copy of the
    replica taken before the backlog): its seconds and rows.

    The final source rows of ``net.upserted`` are relayed into an unlogged staging table and
    analyzed, untimed; then, after a CHECKPOINT and over the session already open, one ``MERGE``
    of them (``Floor``'s), one ``DELETE`` of ``net.deleted`` by key, and the COMMIT are timed.
    """
    upserted, deleted = sorted(net.upserted), sorted(net.deleted)
    with psycopg.connect(source) as src, psycopg.connect(target) as tgt:
        started = time.perf_counter()
        tgt.execute("CREATE UNLOGGED TABLE shop.floor_staging (LIKE shop.orders)")
        read = sql.SQL(
            "COPY (SELECT " + Floor.COLUMNS + " FROM shop.orders WHERE id = ANY(%s))"
            " TO STDOUT (FORMAT binary)"
        ).format()
        write = sql.SQL("COPY shop.floor_staging FROM STDIN (FORMAT binary)").format()
        relay(src, read, tgt, write, params=[upserted])
        tgt.execute("ANALYZE shop.floor_staging")
        tgt.commit()
        staged = time.perf_counter() - started
        checkpoint(target)
        started = time.perf_counter()
        with tgt.cursor() as cur:
            cur.execute(Floor.MERGE)
            assert cur.rowcount == len(upserted), (cur.rowcount, len(upserted))
            merged = time.perf_counter()
            cur.execute("DELETE FROM shop.orders WHERE id = ANY(%s)", (deleted,))
            assert cur.rowcount == len(deleted), (cur.rowcount, len(deleted))
        tgt.commit()
        seconds = time.perf_counter() - started
        tgt.execute("DROP TABLE shop.floor_staging")
        tgt.commit()
    return {"seconds": seconds, "merge": merged - started, "staging": staged,
            "rows": len(upserted), "deleted": len(deleted)}  # fmt: skip


def applied(drained: dict[str, Any], written: Backlog) -> dict[str, Any]:
    """``drained`` (a drain's figures), once the changes its runs applied (the sum of their
    reports' counts) are the changes the backlog wrote."""
    assert drained["changes"] == written.written, (drained["changes"], written.written)
    return drained


def delete_live(source: str, rows: int, rng: random.Random) -> None:
    """Deletes 100 live rows of the first ``rows`` ids, spread at random, in one transaction."""
    candidates = rng.sample(range(1, rows + 1), 200)
    live = [r[0] for r in pg.fetch_all(
        source, "SELECT id FROM shop.orders WHERE id = ANY(%s)", (candidates,))]  # fmt: skip
    assert len(live) >= 100, "fewer than 100 live rows among 200 drawn"
    pg.execute(source, "DELETE FROM shop.orders WHERE id = ANY(%s)", (rng.sample(live, 100),))


def decode_rate(source: str, slot: str) -> tuple[float, int]:
    """Seconds for the server to decode the slot's pending changes into nothing
    (``count(*)`` of ``pg_logical_slot_peek_binary_changes``), and the row changes among them."""
    started = time.perf_counter()
    row = pg.fetch_all(
        source,
        "SELECT count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68)) FROM"
        " pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
        " 'publication_names', %s)",
        (slot, slot),
    )
    return time.perf_counter() - started, int(str(row[0][0]))


def fingerprint(dsn: str) -> tuple[Any, ...]:
    """Count and an order-free hash of ``shop.orders`` (both sides must agree)."""
    [row] = pg.fetch_all(dsn, "SELECT count(*), sum(hashtext(o::text)::int8) FROM shop.orders o")
    return tuple(row)


def dagster_resources(source: str, target: str) -> dict[str, Any]:
    from dpone_dagster import LedgerResource, PostgresSourceResource, PostgresTargetResource

    return {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }


def materialized(source: str, target: str, slot: str, budget: int | None = None) -> float:
    """Seconds of one ``dagster.materialize`` of the group (its check included)."""
    from dpone_dagster import replication_assets

    asset = replication_assets(["shop.orders"], slot=slot, max_changes_per_run=budget)
    checkpoint(target)
    seconds, _ = timed_materialize([asset], dagster_resources(source, target))
    return seconds


def dagster_backlog(source: str, target: str, slot: str, budget: int) -> dict[str, Any]:
    """A backlog applied by repeated materializations: seconds, runs and changes applied."""
    from dpone_dagster import replication_assets

    asset = replication_assets(["shop.orders"], slot=slot, max_changes_per_run=budget)
    resources = dagster_resources(source, target)
    total, runs, changes = 0.0, 0, 0
    while True:
        seconds, result = timed_materialize([asset], resources)
        total, runs = total + seconds, runs + 1
        [event] = result.get_asset_materialization_events()
        metadata = event.step_materialization_data.materialization.metadata
        changes += sum(metadata[f"dpone/rows_{kind}"].value
                       for kind in ("inserted", "updated", "deleted"))  # fmt: skip
        if not metadata["dpone/budget_reached"].value:
            return {"seconds": total, "runs": runs, "changes": changes}


def measure(args: argparse.Namespace, made: list[str]) -> dict[str, Any]:
    rng = random.Random(23)
    source = make_source(args.rows)
    made.append(source)
    target, full_target = (
        pg.create_database("dpone_bench_repl_tgt"),
        pg.create_database("dpone_bench_repl_full"),
    )
    made += [target, full_target]
    slot = f"dpone_bench_{uuid.uuid4().hex[:8]}"
    figures: dict[str, Any] = {"rows": args.rows}
    before = full_batched_copy(source, full_target)
    pg.execute(full_target, "DROP SCHEMA shop CASCADE")
    figures["initial_copy"], _ = timed(source, target, slot)
    figures["nothing_changed"] = statistics.median(timed(source, target, slot)[0] for _ in range(3))
    floor_target = copy_database(target)
    made.append(floor_target)
    floor = Floor(source, floor_target)
    change_one_percent(source, args.rows, 1)
    figures["changed_1pct"], report = timed(source, target, slot)
    figures["changed_1pct_changes"] = changes_of(report)
    checkpoint(floor_target)
    figures["floor_1pct"], _ = floor.run()
    floor.close()
    deleting = []
    for _ in range(3):  # the median of three, as for the run with nothing changed
        delete_live(source, args.rows, rng)
        seconds, report = timed(source, target, slot)
        assert changes_of(report) == 100, report
        deleting.append(seconds)
    figures["deletes_100"] = statistics.median(deleting)
    figures["dagster_nothing_changed"] = materialized(source, target, slot)
    change_one_percent(source, args.rows, 2)
    figures["dagster_changed_1pct"] = materialized(source, target, slot)

    merge_target = copy_database(target, "merge")  # the replica before the backlog
    made.append(merge_target)
    written = backlog(source, args.changes, rng)
    figures["backlog_changes"] = written.written
    figures["decode_seconds"], figures["decode_changes"] = decode_rate(source, slot)
    assert figures["decode_changes"] == written.written, "the slot holds other changes"
    checkpoint(target)
    figures["backlog"] = applied(drain_child(source, target, slot, args.budget), written)
    assert fingerprint(source) == fingerprint(target), "target differs from source"
    figures["merge_floor"] = merge_floor(source, merge_target, written)
    assert fingerprint(source) == fingerprint(merge_target), "the merge floor differs from source"
    pg.drop_database(merge_target)
    quarter = backlog(source, args.changes // 4, rng)
    figures["dagster_backlog_changes"] = quarter.written
    figures["dagster_backlog"] = applied(
        dagster_backlog(source, target, slot, args.budget), quarter
    )
    pg.execute(source, "UPDATE shop.orders SET note = note || 'x'")  # one transaction, every row
    figures["single_transaction"] = drain_child(source, target, slot, None)
    if args.rss_changes:
        big = backlog(source, args.rss_changes, rng)
        figures["backlog_rss_changes"] = big.written
        checkpoint(target)
        figures["backlog_rss"] = applied(drain_child(source, target, slot, args.budget), big)
    assert fingerprint(source) == fingerprint(target), "target differs from source"
    figures["full_copy"] = (before + full_batched_copy(source, full_target)) / 2
    return figures


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def report(f: dict[str, Any]) -> list[dict[str, Any]]:
    """Prints the figures; returns them as the result table's rows (``--json``)."""
    full = f["full_copy"]
    table: list[dict[str, Any]] = []

    def row(run: str, figure: str, ratio: str = "", goal: str = "") -> None:
        table.append({"run": run, "figure": figure, "ratio": ratio, "goal": goal})

    print(f"shop.orders, {f['rows']:,} rows; full batched_copy {full:.2f} s (mean of two)")
    row("full batched_copy (mean of two)", f"{full:.2f} s")
    first = f["initial_copy"]
    print(f"initial copy (first run)          {first:8.2f} s  {first / full:6.3f} x full")
    row("initial copy (the first run)", f"{first:.2f} s", f"{first / full:.3f} of the full copy")
    for name in ("nothing_changed", "deletes_100"):
        ratio = f[name] / full
        mark = "ok" if ratio <= LIMITS[name] else "OVER"
        print(f"{name:<34}{f[name]:8.3f} s  {ratio:6.3f} x full  (goal <= {LIMITS[name]}: {mark})")
        row(name, f"{f[name]:.3f} s", f"{ratio:.3f} of the full copy",
            f"{LIMITS[name]}: {_met(ratio <= LIMITS[name])}")  # fmt: skip
    over = f["changed_1pct"] / f["floor_1pct"]
    print(
        f"changed_1pct ({f['changed_1pct_changes']:,} changes)      {f['changed_1pct']:8.3f} s  "
        f"{f['changed_1pct'] / full:6.3f} x full  {over:5.2f} x floor {f['floor_1pct']:.3f} s "
        f"(goal <= {FLOOR_LIMIT}: {'ok' if over <= FLOOR_LIMIT else 'OVER'})"
    )
    row(f"changed_1pct ({f['changed_1pct_changes']:,} changes)", f"{f['changed_1pct']:.3f} s",
        f"{over:.2f} of the floor ({f['floor_1pct']:.3f} s)",
        f"{FLOOR_LIMIT}: {_met(over <= FLOOR_LIMIT)}")  # fmt: skip
    decode = f["decode_changes"] / f["decode_seconds"]
    applied = f["backlog"]["changes"] / f["backlog"]["seconds"]
    mf = f["merge_floor"]
    floor = f["backlog_changes"] / mf["seconds"]  # the same changes' net effect, one MERGE
    decode_met = applied / decode >= DECODE_SHARE and applied >= CHANGES_PER_SECOND
    print(
        f"backlog {f['backlog_changes']:,} changes (all applied): server decode "
        f"{decode:,.0f} changes/s; applied {applied:,.0f} changes/s in {f['backlog']['runs']} "
        f"runs = {applied / decode:.2f} of decode (the issue's goals >= {DECODE_SHARE}, >= "
        f"{CHANGES_PER_SECOND:,}/s: {'ok' if decode_met else 'MISSED'}); peak RSS "
        f"{f['backlog']['rss_mb']:.0f} MB"
    )
    print(
        f"  merge floor {mf['seconds']:.2f} s (MERGE of {mf['rows']:,} rows {mf['merge']:.2f} s, "
        f"DELETE of {mf['deleted']:,}, COMMIT; staged untimed in {mf['staging']:.2f} s) = "
        f"{floor:,.0f} changes/s, {(mf['rows'] + mf['deleted']) / mf['seconds']:,.0f} rows/s; "
        f"applied = {applied / floor:.2f} of the merge floor (proposed goal >= {MERGE_SHARE}: "
        f"{'ok' if applied / floor >= MERGE_SHARE else 'MISSED'})"
    )
    row(f"backlog of {f['backlog_changes']:,} changes, {f['backlog']['runs']} runs",
        f"{applied:,.0f} changes/s, peak RSS {f['backlog']['rss_mb']:.0f} MB",
        f"{applied / decode:.2f} of the server's decode ({decode:,.0f}/s)",
        f"the issue's >= {DECODE_SHARE} and {CHANGES_PER_SECOND:,}/s: "
        f"{_met(decode_met)}")  # fmt: skip
    row(f"merge floor of that backlog ({mf['rows']:,} rows merged, {mf['deleted']:,} deleted)",
        f"{mf['seconds']:.2f} s, {floor:,.0f} changes/s",
        f"{applied / floor:.2f} of the merge floor",
        f"proposed >= {MERGE_SHARE}: {_met(applied / floor >= MERGE_SHARE)}")  # fmt: skip
    # The floor writes the backlog's net effect and nothing else: no apply that writes the rows
    # into the indexed, logged target runs faster, so its share of the decode rate is a ceiling.
    reach = "within reach" if floor / decode >= DECODE_SHARE else "out of reach on this machine"
    print(
        f"  ceiling: the merge floor is {floor / decode:.2f} of the server's decode rate "
        f"(the issue's >= {DECODE_SHARE} of decode: {reach})"
    )
    row("ceiling: the merge floor's share of the decode rate", f"{floor / decode:.2f}",
        "an apply that writes the rows reaches at most this share",
        f"the issue's >= {DECODE_SHARE}: {reach}")  # fmt: skip
    if "backlog_rss" in f:
        small, big = f["backlog"], f["backlog_rss"]
        flat = big["rss_mb"] <= RSS_GROWTH * small["rss_mb"]
        print(
            f"peak RSS: backlog {f['backlog_changes']:,} changes {small['rss_mb']:.0f} MB, "
            f"{f['backlog_rss_changes']:,} changes {big['rss_mb']:.0f} MB "
            f"({big['changes'] / big['seconds']:,.0f} changes/s; "
            f"flat, <= {RSS_GROWTH} x: {'ok' if flat else 'OVER'})"
        )
        row(f"peak RSS, backlogs of {f['backlog_changes']:,} / {f['backlog_rss_changes']:,} "
            "changes", f"{small['rss_mb']:.0f} MB / {big['rss_mb']:.0f} MB",
            f"{big['rss_mb'] / small['rss_mb']:.2f}",
            f"flat (<= {RSS_GROWTH}): {_met(flat)}")  # fmt: skip
    single = f["single_transaction"]
    print(
        f"one transaction of {single['changes']:,} rows: {single['seconds']:.2f} s, peak RSS "
        f"{single['rss_mb']:.0f} MB (goal < {SINGLE_TRANSACTION_MB})"
    )
    small = single["rss_mb"] < SINGLE_TRANSACTION_MB
    row(f"one transaction of {single['changes']:,} rows",
        f"{single['seconds']:.2f} s, peak RSS {single['rss_mb']:.0f} MB", "",
        f"< {SINGLE_TRANSACTION_MB} MB: {_met(small)}")  # fmt: skip
    for name, what in (("dagster_nothing_changed", "nothing changed"),
                       ("dagster_changed_1pct", "1% changed")):  # fmt: skip
        print(f"dagster.materialize, {what:<16}{f[name]:8.3f} s  {f[name] / full:6.3f} x full")
        row(f"dagster.materialize, {what}", f"{f[name]:.3f} s",
            f"{f[name] / full:.3f} of the full copy")  # fmt: skip
    db = f["dagster_backlog"]
    rate = f["dagster_backlog_changes"] / db["seconds"]
    print(
        f"dagster.materialize, backlog of {f['dagster_backlog_changes']:,}: "
        f"{rate:,.0f} changes/s in {db['runs']} runs"
    )
    row(f"dagster.materialize, backlog of {f['dagster_backlog_changes']:,} changes",
        f"{rate:,.0f} changes/s in {db['runs']} runs")  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=None, help="backlog size (--rows)")
    parser.add_argument("--budget", type=int, default=250_000, help="changes per run")
    parser.add_argument("--rss-changes", type=int, default=0, help="a second backlog, RSS only")
    parser.add_argument("--child", nargs=4, metavar=("SRC", "TGT", "SLOT", "BUDGET"))
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument(
        "--native-repeat",
        type=int,
        default=3,
        help="rounds of the native subscriber's yardstick (0: leave it out)",
    )
    parser.add_argument("--native-only", action="store_true", help="the yardstick alone")
    args = parser.parse_args()
    if args.child:
        source, target, slot, budget = args.child
        print(json.dumps(drain(source, target, slot, int(budget) or None)))
        return
    args.changes = args.changes or args.rows
    began = result_file.machine(pg.admin_dsn())  # the targets' server
    source_version = str(pg.fetch_one(logical_admin_dsn(), "SHOW server_version"))
    made: list[str] = []
    try:
        if not args.native_only:
            table = report(measure(args, made))
            if args.json:
                result_file.write(
                    args.json, "replication", began, table, table_rows=args.rows,
                    budget=args.budget, source_postgresql=source_version,
                )  # fmt: skip
        if args.native_repeat:
            yardstick = native.report([native.measure(shape, args.changes, args.native_repeat)
                                       for shape in native.SHAPES])  # fmt: skip
            if args.json:  # alone: the file named; else its own file beside, <name>_native.json
                beside = args.json.removesuffix(".json") + "_native.json"
                result_file.write(
                    args.json if args.native_only else beside, "replication_native",
                    began, yardstick, table_rows=args.changes, repeat=args.native_repeat,
                    source_postgresql=source_version,
                )  # fmt: skip
    finally:
        for dsn in made:
            if dsn == made[0]:
                drop_logical_database(dsn)
            else:
                pg.drop_database(dsn)


if __name__ == "__main__":
    main()
