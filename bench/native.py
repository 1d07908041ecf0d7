"""PostgreSQL's own logical-replication subscriber as the replication apply's yardstick.

    .venv/bin/python bench/native.py          # OLTP and bulk, 1M changes, medians of 3
    .venv/bin/python bench/native.py --shape oltp --repeat 1 --rows 100000
    .venv/bin/python bench/native.py --json bench/results/replication_native.json

``bench/replication.py`` runs the same measurement as its yardstick section; this script runs it
alone. The source is a database on the replication tests' server (``wal_level = logical``: the
embedded PostgreSQL 18 of ``.dpone_pg/`` unless ``DPONE_TEST_LOGICAL_DSN`` names one); every
target is a database on ``DPONE_TEST_PG_DSN`` (default: the local postgres), the same server for
every contender. The table is ``public.items`` (``id bigint`` primary key, an int, a text, a
timestamptz), ``--rows`` rows. Three slots hold the **same** backlog:

* the native subscriber's: ``CREATE SUBSCRIPTION ... WITH (create_slot = false, copy_data =
  false, enabled = false)`` on the targets' server, over a slot created on the source while
  nothing was written, beside a copy of the table taken then; timed from ``ALTER SUBSCRIPTION
  ... ENABLE`` until the backlog's last inserted row is visible in its target (its apply
  worker applies in commit order);
* the engine's: ``Replication(...).run()`` with its defaults but no check (``reconcile=False``),
  in a child process (its own peak RSS);
* ``dagster.materialize`` of ``replication_assets`` with its defaults (``dpone_reconciled``
  and ``dpone_slot_healthy`` included), timed around ``materialize`` after a warm-up.

Two backlog shapes, each written by one server-side procedure in the same proportions (per
10 changes: 7 updates of random live rows, 2 inserts, 1 delete of the oldest): ``oltp``,
``--rows``/10 transactions of 10 changes, and ``bulk``, 10 transactions of ``--rows``/10
changes. Each round writes a new backlog and times the three in turn on it; every target must
end equal to the source (count and an order-free hash). A contender's ratio is the native
subscriber's seconds over its own, in the same round; the figures are medians over the rounds.
Beside the seconds, where they go: the CPU seconds of the source's backend (the native
subscriber's walsender; the engine's peek), of the target's backend (the apply worker; the
engine's session) and of the client (the engine's process), read from ``/proc`` while each
runs (both servers run on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import result_file  # noqa: E402
from bench.materialize import timed_materialize  # noqa: E402
from dpone_dagster.postgres.identifiers import TableName  # noqa: E402
from dpone_dagster.replication import ReplicationOptions  # noqa: E402
from dpone_dagster.replication.engine import Replication  # noqa: E402
from dpone_dagster.replication.group_plan import ReplicationGroup  # noqa: E402
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
SHAPES = ("oltp", "bulk")
CONTENDERS = ("native", "engine", "dagster")
TICK = os.sysconf("SC_CLK_TCK")


def shape_size(shape: str, rows: int) -> tuple[int, int]:
    """``(transactions, changes per transaction)`` of a backlog of about ``rows`` changes."""
    return (rows // 10, 10) if shape == "oltp" else (10, rows // 10)


def group(slot: str) -> ReplicationGroup:
    unchecked = ReplicationOptions(reconcile=False)
    return ReplicationGroup(tables=(TableName.parse("public.items"),), slot=slot,
                            publication=slot, options=unchecked)  # fmt: skip


def fingerprint(dsn: str) -> tuple[Any, ...]:
    [row] = pg.fetch_all(dsn, "SELECT count(*), sum(hashtext(i::text)::int8) FROM public.items i")
    return tuple(row)


# -- CPU seconds by process, from /proc ---------------------------------------------------------


def _cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


@contextmanager
def cpu_of(roles: dict[str, Callable[[], list[int]]]) -> Iterator[dict[str, float]]:
    """The CPU seconds each role's processes spent while the block runs (``roles``: how to
    find their pids, polled every 50 ms; a process's last reading counts)."""
    first: dict[int, float] = {}
    last: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        while True:
            for role, pids in roles.items():
                for pid in pids():
                    used = _cpu(pid)
                    if used is not None:
                        first.setdefault(pid, used)
                        last[pid] = (role, used)
            if done.wait(0.05):
                return

    for pids in roles.values():  # a process that exists already counts from now
        for pid in pids():
            used = _cpu(pid)
            if used is not None:
                first[pid] = used
    sampler = threading.Thread(target=sample, daemon=True)
    totals: dict[str, float] = dict.fromkeys(roles, 0.0)
    sampler.start()
    try:
        yield totals
    finally:
        done.set()
        sampler.join()
        for pid, (role, used) in last.items():
            totals[role] += used - first.get(pid, 0.0)


def backends(dsn: str, where: str, params: tuple[object, ...] = ()) -> Callable[[], list[int]]:
    """A finder of the pids of ``dsn``'s server's backends that ``where`` selects from
    ``pg_stat_activity`` (a session of its own, kept open)."""
    conn = psycopg.connect(dsn, autocommit=True)
    query = "SELECT pid FROM pg_stat_activity WHERE " + where + " AND pid <> pg_backend_pid()"
    return lambda: [int(r[0]) for r in conn.execute(query, params)]  # type: ignore[arg-type]


def dbname(dsn: str) -> str:
    return str(conninfo.conninfo_to_dict(dsn)["dbname"])


# -- the contenders ----------------------------------------------------------------------------


class Native:
    """A subscription on the targets' server over a slot of its own on the source."""

    def __init__(self, source: str, target: str, name: str) -> None:
        self.source, self.target, self.name = source, target, name
        ident = sql.Identifier(name)
        pg.execute(source, sql.SQL("CREATE PUBLICATION {} FOR TABLE public.items").format(ident))
        pg.execute(source, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        # The slot is created while nothing is written: a copy taken now starts where it does.
        pg.execute(target, TABLE)
        with (
            psycopg.connect(source) as src,
            psycopg.connect(target) as tgt,
            src.cursor().copy("COPY public.items TO STDOUT (FORMAT binary)") as out,
            tgt.cursor().copy("COPY public.items FROM STDIN (FORMAT binary)") as into,
        ):
            for data in out:
                into.write(data)
        pg.execute(target, "VACUUM ANALYZE public.items")
        statement = sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (create_slot = false,"
            " slot_name = {}, copy_data = false, enabled = false)"
        ).format(ident, sql.Literal(source), ident, sql.Literal(name))
        with psycopg.connect(target, autocommit=True) as tgt:
            tgt.execute(statement)

    def apply(self, last_id: int) -> tuple[float, dict[str, float]]:
        """Enables the subscription until ``last_id`` (the backlog's last insert) arrives: the
        seconds, and the CPU seconds of its walsender and apply worker."""
        roles = {
            "source": backends(
                self.source, "backend_type = 'walsender' AND application_name = %s", (self.name,)
            ),
            "target": backends(
                self.target,
                "backend_type = 'logical replication worker' AND datname = %s",
                (dbname(self.target),),
            ),
        }
        arrived = "SELECT EXISTS (SELECT FROM public.items WHERE id = %s)"
        ident = sql.Identifier(self.name)
        with psycopg.connect(self.target, autocommit=True) as tgt, cpu_of(roles) as cpu:
            started = time.perf_counter()
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(ident))
            while not tgt.execute(arrived, (last_id,)).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.005)
            seconds = time.perf_counter() - started
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
        return seconds, {**cpu, "client": 0.0}

    def drop(self) -> None:
        with psycopg.connect(self.target, autocommit=True) as tgt:
            ident = sql.Identifier(self.name)
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
            tgt.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
            tgt.execute(sql.SQL("DROP SUBSCRIPTION {}").format(ident))
        pg.execute(self.source, "SELECT pg_drop_replication_slot(%s)", (self.name,))


def engine_child(source: str, target: str, slot: str) -> dict[str, Any]:
    """One engine run in a child process: its seconds, changes, peak RSS and CPU seconds."""
    roles = {
        "source": backends(
            source, "datname = %s AND backend_type = 'client backend'", (dbname(source),)
        ),
        "target": backends(
            target, "datname = %s AND backend_type = 'client backend'", (dbname(target),)
        ),
    }
    with cpu_of(roles) as cpu:
        out = subprocess.run(
            [sys.executable, __file__, "--child", source, target, slot],
            check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    figures["cpu"] = {**cpu, "client": figures.pop("client_cpu")}
    return figures


def run_child(source: str, target: str, slot: str) -> None:
    """The child's run (``--child``): prints its figures as JSON."""
    started = time.perf_counter()
    report = Replication(group(slot), source=source, target=target).run()
    seconds = time.perf_counter() - started
    usage = os.times()
    print(json.dumps({
        "seconds": seconds, "changes": report.changes, "rss_mb": own_peak_mb(),
        "client_cpu": usage.user + usage.system,
    }))  # fmt: skip


def resources(source: str, target: str) -> dict[str, Any]:
    from dpone_dagster import LedgerResource, PostgresSourceResource, PostgresTargetResource

    return {
        "source": PostgresSourceResource(dsn=source),
        "target": PostgresTargetResource(dsn=target),
        "ledger": LedgerResource(),
    }


def materialized(source: str, target: str, slot: str) -> float:
    """Seconds of one ``dagster.materialize`` of the group with its defaults."""
    from dpone_dagster import replication_assets

    asset = replication_assets(["public.items"], slot=slot)
    seconds, _ = timed_materialize([asset], resources(source, target))
    return seconds


# -- a round --------------------------------------------------------------------------------------


def write_backlog(source: str, shape: str, rows: int) -> int:
    """Writes a backlog; the id of its last insert."""
    transactions, per = shape_size(shape, rows)
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("CALL public.dpone_backlog(%s, %s)", (transactions, per))
        return int(conn.execute("SELECT max(id) FROM public.items").fetchone()[0])  # type: ignore[index]


def pending(source: str, slot: str) -> int:
    """Row changes the slot holds (the server's decode of them, into a count)."""
    return int(str(pg.fetch_one(
        source,
        "SELECT count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68)) FROM"
        " pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
        " 'publication_names', %s)", (slot, slot))))  # fmt: skip


@contextmanager
def contenders(source: str, made: list[str]) -> Iterator[dict[str, Any]]:
    """The three contenders, their targets equal to the source and their slots at one point."""
    found: dict[str, Any] = {}
    for name in ("engine", "dagster"):
        target = pg.create_database(f"dpone_bench_native_{name}")
        made.append(target)
        slot = f"dpone_bench_{name}_{uuid.uuid4().hex[:6]}"
        Replication(group(slot), source=source, target=target).run()  # the initial copy
        found[name] = (target, slot)
    target = pg.create_database("dpone_bench_native_sub")
    made.append(target)
    found["native"] = Native(source, target, f"dpone_native_{uuid.uuid4().hex[:6]}")
    try:
        yield found
    finally:
        found["native"].drop()


def one_round(source: str, found: dict[str, Any], shape: str, rows: int) -> dict[str, Any]:
    """Writes a backlog and times the three contenders on it, in turn."""
    last = write_backlog(source, shape, rows)
    figures: dict[str, Any] = {"changes": pending(source, found["engine"][1])}
    native: Native = found["native"]
    pg.execute(native.target, "CHECKPOINT")
    figures["native"], figures["native_cpu"] = native.apply(last)
    target, slot = found["engine"]
    pg.execute(target, "CHECKPOINT")
    child = engine_child(source, target, slot)
    assert child["changes"] == figures["changes"], (child, figures)
    figures["engine"], figures["engine_cpu"] = child["seconds"], child["cpu"]
    figures["engine_rss_mb"] = child["rss_mb"]
    target, slot = found["dagster"]
    pg.execute(target, "CHECKPOINT")
    figures["dagster"] = materialized(source, target, slot)
    truth = fingerprint(source)
    for name in ("engine", "dagster"):
        assert fingerprint(found[name][0]) == truth, f"the {name}'s target differs from the source"
    assert fingerprint(native.target) == truth, "the native subscriber's target differs"
    return figures


def measure(shape: str, rows: int, repeat: int) -> dict[str, Any]:
    """``repeat`` rounds of one shape on a source of ``rows`` rows: the medians and rounds."""
    made: list[str] = []
    source = pg.create_database("dpone_bench_native_src", logical_admin_dsn())
    made.append(source)
    try:
        pg.execute(source, TABLE)
        pg.execute(source, FILL, (rows,))
        pg.execute(source, "VACUUM ANALYZE public.items")
        pg.execute(source, WRITER)
        with contenders(source, made) as found:
            rounds = []
            for _ in range(repeat):
                rounds.append(one_round(source, found, shape, rows))
                print(f"  {shape}: {_brief(rounds[-1])}", flush=True)
        return summary(shape, rows, rounds)
    finally:
        for dsn in made:
            (drop_logical_database if dsn == made[0] else pg.drop_database)(dsn)


def _brief(figures: dict[str, Any]) -> str:
    return ", ".join(f"{name} {figures[name]:.2f} s" for name in CONTENDERS)


def summary(shape: str, rows: int, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of the rounds: seconds, changes/s and the ratio to native of each
    contender, the CPU seconds by process of the native subscriber and the engine, and the
    engine's peak RSS."""
    out: dict[str, Any] = {"shape": shape, "rows": rows, "changes": rounds[0]["changes"],
                           "rounds": rounds}  # fmt: skip
    for name in CONTENDERS:
        out[name] = statistics.median(r[name] for r in rounds)
        out[f"{name}_ratio"] = statistics.median(r["native"] / r[name] for r in rounds)
    for name in ("native", "engine"):
        out[f"{name}_cpu"] = {
            role: statistics.median(r[f"{name}_cpu"][role] for r in rounds)
            for role in ("source", "target", "client")
        }
    out["engine_rss_mb"] = max(r["engine_rss_mb"] for r in rounds)
    return out


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The printed table's rows of one shape (also the result file's)."""
    shape, changes = result["shape"], result["changes"]
    what = {"oltp": "OLTP (transactions of 10 changes)",
            "bulk": f"bulk (10 transactions of {changes // 10:,} changes)"}[shape]  # fmt: skip
    rows = []
    for name, label in (("native", "native subscriber"), ("engine", "engine alone"),
                        ("dagster", "dagster.materialize, defaults, check included")):  # fmt: skip
        cpu = result.get(f"{name}_cpu")
        rows.append({
            "backlog": f"{what}, {changes:,} changes", "run": label,
            "seconds": round(result[name], 2), "changes_per_s": round(changes / result[name]),
            "ratio_to_native": round(result[f"{name}_ratio"], 2),
            "cpu_source_target_client": None if cpu is None else
            "/".join(f"{cpu[r]:.2f}" for r in ("source", "target", "client")),
            "peak_rss_mb": result["engine_rss_mb"] if name == "engine" else None,
        })  # fmt: skip
    return rows


def report(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prints the medians; returns the result table's rows."""
    rows = [row for result in results for row in table_rows(result)]
    print(f"{'backlog':<46} {'run':<48} {'s':>7} {'changes/s':>10} {'x native':>8}"
          f"  CPU s (source/target/client)  RSS")  # fmt: skip
    for row in rows:
        rss = "" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']} MB"
        print(f"{row['backlog']:<46} {row['run']:<48} {row['seconds']:7.2f} "
              f"{row['changes_per_s']:10,} {row['ratio_to_native']:8.2f}  "
              f"{row['cpu_source_target_client'] or '':<29} {rss}")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument("--child", nargs=3, metavar=("SRC", "TGT", "SLOT"))
    args = parser.parse_args()
    if args.child:
        run_child(*args.child)
        return
    began = result_file.machine(pg.admin_dsn())
    shapes = list(SHAPES) if args.shape == "both" else [args.shape]
    results = [measure(shape, args.rows, args.repeat) for shape in shapes]
    rows = report(results)
    if args.json:
        source_version = str(pg.fetch_one(logical_admin_dsn(), "SHOW server_version"))
        result_file.write(args.json, "replication_native", began, rows, table_rows=args.rows,
                          repeat=args.repeat, source_postgresql=source_version)  # fmt: skip


if __name__ == "__main__":
    main()
