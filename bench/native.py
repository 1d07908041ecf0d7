"""PostgreSQL's own logical-replication subscriber as the replication apply's yardstick.

    .venv/bin/python bench/native.py                        # OLTP and bulk, 1M rows, medians of 3
    .venv/bin/python bench/native.py --shape oltp --repeat 1
    .venv/bin/python bench/native.py --json bench/results/replication_native.json

The source is a database on the replication tests' server (``wal_level = logical``: the embedded
PostgreSQL 18 of ``.dpone_pg/`` unless ``DPONE_TEST_LOGICAL_DSN`` names one); the targets are
databases on ``DPONE_TEST_PG_DSN`` (default: the local postgres), one per contender, all equal to
the source before the backlog. The table is ``public.items`` (``id bigint`` primary key, an int,
a text, a timestamptz), ``--rows`` rows. Three slots hold the **same** backlog:

* the native subscriber's (``CREATE SUBSCRIPTION ... WITH (create_slot = false, copy_data =
  false, enabled = false)`` on the targets' server, over a slot created on the source beside a
  copy of the table taken at that moment), timed from ``ALTER SUBSCRIPTION ... ENABLE`` until
  the backlog's last transaction is visible in its target;
* the engine's (``Replication(...).run()`` with its defaults, in this process);
* ``dagster.materialize`` of ``replication_assets`` with its defaults (its ``dpone_reconciled``
  check and ``dpone_slot_healthy`` included), timed around ``materialize`` after a warm-up.

Two backlog shapes, each written by one server-side procedure: ``oltp`` (``--rows``/10
transactions, each updating 7 random live rows, inserting 2 and deleting the oldest:
10 changes a transaction) and ``bulk`` (10 transactions of ``--rows``/10 changes each, in the same
proportions). Each round writes a new backlog and times the three contenders on it, in turn;
every target must end equal to the source (count and an order-free hash). The ratios are each
contender's changes/s over the native subscriber's in the same round; medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import result_file  # noqa: E402
from bench.materialize import timed_materialize  # noqa: E402
from dpone_dagster.postgres.identifiers import TableName  # noqa: E402
from dpone_dagster.replication.engine import Replication  # noqa: E402
from dpone_dagster.replication.plan import ReplicationGroup  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.logical import drop_logical_database, logical_admin_dsn  # noqa: E402
from tests.helpers.memory import own_peak_mb  # noqa: E402

TABLE = """
CREATE TABLE public.items (
    id bigint PRIMARY KEY,
    n integer NOT NULL,
    s text NOT NULL,
    at timestamptz NOT NULL
)
"""
FILL = """
INSERT INTO public.items (id, n, s, at)
SELECT g, g %% 100000, md5(g::text), now() - g * interval '1 second'
FROM generate_series(1, %s::bigint) g
"""
WRITER = """
CREATE PROCEDURE public.dpone_backlog(transactions int, per int)
LANGUAGE plpgsql AS $$
DECLARE
    low bigint;
    high bigint;
    updates int := per * 7 / 10;
    inserts int := per * 2 / 10;
    deletes int := per - per * 7 / 10 - per * 2 / 10;
BEGIN
    SELECT min(id), max(id) INTO low, high FROM public.items;
    FOR i IN 1..transactions LOOP
        -- distinct live ids, above the ones this transaction deletes
        UPDATE public.items SET n = n + 1, at = clock_timestamp()
        WHERE id = ANY (ARRAY(
            SELECT DISTINCT low + deletes + floor(random() * (high - low - deletes))::bigint
            FROM generate_series(1, updates * 2) LIMIT updates
        ));
        INSERT INTO public.items (id, n, s, at)
        SELECT high + g, g, md5((high + g)::text), clock_timestamp()
        FROM generate_series(1, inserts) g;
        DELETE FROM public.items WHERE id >= low AND id < low + deletes;
        low := low + deletes;
        high := high + inserts;
        COMMIT;
    END LOOP;
END $$
"""
SHAPES = {"oltp": (10, "many small transactions"), "bulk": (0, "a few large transactions")}


def shape_size(shape: str, rows: int) -> tuple[int, int]:
    """``(transactions, changes per transaction)`` of a backlog of about ``rows`` changes."""
    if shape == "oltp":
        return rows // 10, 10
    return 10, rows // 10


def fingerprint(dsn: str) -> tuple[Any, ...]:
    [row] = pg.fetch_all(dsn, "SELECT count(*), sum(hashtext(i::text)::int8) FROM public.items i")
    return tuple(row)


def group(slot: str) -> ReplicationGroup:
    return ReplicationGroup(tables=(TableName.parse("public.items"),), slot=slot,
                            publication=slot)  # fmt: skip


def resources(source: str, target: str) -> dict[str, Any]:
    from dpone_dagster import LedgerResource, PostgresSourceResource, PostgresTargetResource

    return {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }


class Native:
    """A subscription on the targets' server over a slot of its own on the source."""

    def __init__(self, source: str, target: str, name: str) -> None:
        self.source, self.target, self.name = source, target, name
        pg.execute(source, sql.SQL("CREATE PUBLICATION {} FOR TABLE public.items").format(
            sql.Identifier(name)))  # fmt: skip
        pg.execute(source, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        # the slot is created with nothing being written: a copy taken now starts where it does
        pg.execute(target, TABLE)
        with psycopg.connect(source) as src, psycopg.connect(target) as tgt:
            with (
                src.cursor().copy("COPY public.items TO STDOUT (FORMAT binary)") as out,
                tgt.cursor().copy("COPY public.items FROM STDIN (FORMAT binary)") as into,
            ):
                for data in out:
                    into.write(data)
        pg.execute(target, "VACUUM ANALYZE public.items")
        with psycopg.connect(target, autocommit=True) as tgt:
            tgt.execute(
                sql.SQL(
                    "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (create_slot ="
                    " false, slot_name = {}, copy_data = false, enabled = false)"
                ).format(
                    sql.Identifier(name),
                    sql.Literal(source),
                    sql.Identifier(name),
                    sql.Literal(name),
                )  # fmt: skip
            )

    def apply(self, last_id: int) -> float:
        """Enables the subscription until ``last_id`` (the backlog's last insert) arrives."""
        with psycopg.connect(self.target, autocommit=True) as tgt:
            started = time.perf_counter()
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(sql.Identifier(self.name)))
            arrived = "SELECT EXISTS (SELECT FROM public.items WHERE id = %s)"
            while not tgt.execute(arrived, (last_id,)).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.005)
            seconds = time.perf_counter() - started
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(self.name)))
        return seconds

    def drop(self) -> None:
        with psycopg.connect(self.target, autocommit=True) as tgt:
            name = sql.Identifier(self.name)
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(name))
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(name))
            tgt.execute(sql.SQL("DROP SUBSCRIPTION {}").format(name))
        pg.execute(self.source, "SELECT pg_drop_replication_slot(%s)", (self.name,))


def write_backlog(source: str, shape: str, rows: int) -> tuple[int, int, float]:
    """Writes a backlog: ``(changes, last id inserted, seconds)``."""
    transactions, per = shape_size(shape, rows)
    with psycopg.connect(source, autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM public.items").fetchone()[0]  # type: ignore[index]
        started = time.perf_counter()
        conn.execute("CALL public.dpone_backlog(%s, %s)", (transactions, per))
        seconds = time.perf_counter() - started
        last = conn.execute("SELECT max(id) FROM public.items").fetchone()[0]  # type: ignore[index]
        after = conn.execute("SELECT count(*) FROM public.items").fetchone()[0]  # type: ignore[index]
    inserts = transactions * (per * 2 // 10)
    deletes = transactions * (per - per * 7 // 10 - per * 2 // 10)
    assert after - before == inserts - deletes, (before, after)
    return transactions * per, int(last), seconds


def pending(source: str, slot: str) -> int:
    """Row changes the slot holds (the server's decode of them, into a count)."""
    return int(str(pg.fetch_one(
        source,
        "SELECT count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68)) FROM"
        " pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
        " 'publication_names', %s)", (slot, slot))))  # fmt: skip


def one_round(source: str, contenders: dict[str, Any], shape: str, rows: int) -> dict[str, Any]:
    changes, last, wrote = write_backlog(source, shape, rows)
    engine_slot, dagster_slot = contenders["engine"][1], contenders["dagster"][1]
    held = pending(source, engine_slot)
    figures: dict[str, Any] = {"changes": held, "written_seconds": wrote}
    native: Native = contenders["native"]
    pg.execute(native.target, "CHECKPOINT")
    figures["native"] = native.apply(last)
    target, slot = contenders["engine"]
    pg.execute(target, "CHECKPOINT")
    started = time.perf_counter()
    report = Replication(group(slot), source=source, target=target).run()
    figures["engine"] = time.perf_counter() - started
    applied = sum(t.inserted + t.updated + t.deleted for t in report.tables)
    assert applied == held, (applied, held)
    from dpone_dagster import replication_assets

    target_d = contenders["dagster"][0]
    asset = replication_assets(["public.items"], slot=dagster_slot)
    pg.execute(target_d, "CHECKPOINT")
    figures["dagster"], _ = timed_materialize([asset], resources(source, target_d))
    truth = fingerprint(source)
    for name in ("engine", "dagster"):
        assert fingerprint(contenders[name][0]) == truth, f"{name}'s target differs"
    assert fingerprint(native.target) == truth, "the native subscriber's target differs"
    return figures


def measure(shape: str, rows: int, repeat: int, made: list[str]) -> list[dict[str, Any]]:
    source = pg.create_database("dpone_bench_native_src", logical_admin_dsn())
    made.append(source)
    pg.execute(source, TABLE)
    pg.execute(source, FILL, (rows,))
    pg.execute(source, "VACUUM ANALYZE public.items")
    pg.execute(source, WRITER)
    contenders: dict[str, Any] = {}
    for name in ("engine", "dagster"):
        target = pg.create_database(f"dpone_bench_native_{name}")
        made.append(target)
        slot = f"dpone_bench_{name}_{uuid.uuid4().hex[:6]}"
        Replication(group(slot), source=source, target=target).run()  # the initial copy
        contenders[name] = (target, slot)
    native_target = pg.create_database("dpone_bench_native_sub")
    made.append(native_target)
    contenders["native"] = Native(source, native_target, f"dpone_native_{uuid.uuid4().hex[:6]}")
    try:
        rounds = []
        for _ in range(repeat):
            figures = one_round(source, contenders, shape, rows)
            print(f"  {shape}: {figures}", flush=True)
            rounds.append(figures)
        return rounds
    finally:
        contenders["native"].drop()


def summary(shape: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    changes = rounds[0]["changes"]
    out: dict[str, Any] = {"shape": shape, "changes": changes}
    for name in ("native", "engine", "dagster"):
        seconds = statistics.median(r[name] for r in rounds)
        out[name] = seconds
        ratio = statistics.median(r["native"] / r[name] for r in rounds)
        out[f"{name}_ratio"] = ratio
        print(f"{shape:5} {name:8} {seconds:7.2f} s  {changes / seconds:10,.0f} changes/s"
              f"  {ratio:5.2f} x native")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--json")
    args = parser.parse_args()
    began = result_file.machine(pg.admin_dsn())
    shapes = list(SHAPES) if args.shape == "both" else [args.shape]
    results = []
    for shape in shapes:
        made: list[str] = []
        try:
            results.append(summary(shape, measure(shape, args.rows, args.repeat, made)))
        finally:
            for dsn in made:
                (drop_logical_database if dsn == made[0] else pg.drop_database)(dsn)
    print(f"peak RSS of this process {own_peak_mb():.0f} MB")
    if args.json:
        result_file.write(args.json, "replication_native", began, results, table_rows=args.rows)


if __name__ == "__main__":
    main()
