"""The apply path against real servers: the initial copy meets the stream, the changes of a
run are applied by key in commit order, whole source transactions in one target transaction."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import crash, pg
from tests.replication.group import Group

ORDERS = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text, amount numeric(12,2));
CREATE TABLE shop.lines (id bigint PRIMARY KEY, order_id bigint, qty int);
"""


def test_first_run_copies_then_later_runs_apply_changes(
    logical_source_dsn: str, target_dsn: str
) -> None:
    pg.execute(logical_source_dsn, ORDERS)
    pg.execute(
        logical_source_dsn,
        "INSERT INTO shop.orders SELECT g, 'n' || g, g FROM generate_series(1, 1000) g",
    )
    group = Group(logical_source_dsn, target_dsn, ("shop.orders", "shop.lines"))
    first = group.run()
    assert first.initial_copy is not None and first.initial_copy.rows_loaded == 1000
    group.assert_equal()
    pg.execute(logical_source_dsn, "UPDATE shop.orders SET note = 'u' WHERE id <= 10")
    pg.execute(logical_source_dsn, "DELETE FROM shop.orders WHERE id BETWEEN 11 AND 20")
    pg.execute(
        logical_source_dsn, "INSERT INTO shop.lines SELECT g, g, 1 FROM generate_series(1, 50) g"
    )
    second = group.run()
    assert second.initial_copy is None
    assert second.transactions == 3
    orders, lines = second.tables
    assert (orders.updated, orders.deleted, lines.inserted) == (10, 10, 50)
    group.assert_equal()
    assert second.slot.confirmed_flush_lsn >= second.upto_lsn or second.lag_bytes >= 0
    third = group.run()
    assert third.transactions == 0
    group.assert_equal()


RUN_CHILD = """
import resource, sys
from dpone_dagster.replication.engine import Replication
from dpone_dagster.replication.plan import ReplicationGroup
group = ReplicationGroup(("public.big",), slot="dpone_big", publication="dpone_big")
report = Replication(group, source=sys.argv[1], target=sys.argv[2]).run()
print(report.transactions, report.tables[0].inserted,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_a_one_million_row_transaction_is_applied_whole_under_200_mb(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.big (id bigint PRIMARY KEY, note text, amount numeric)")
    command = [sys.executable, "-c", RUN_CHILD, src, target_dsn]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=crash.ROOT)
    assert first.returncode == 0, first.stderr
    pg.execute(
        src,
        "INSERT INTO public.big SELECT g, md5(g::text), g * 1.5 FROM generate_series(1, 1000000) g",
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=crash.ROOT)
    assert done.returncode == 0, done.stderr
    transactions, inserted, peak_mb = map(int, done.stdout.split())
    assert (transactions, inserted) == (1, 1_000_000)
    assert peak_mb < 200, f"peak RSS {peak_mb} MB"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.big") == 1_000_000
    Group(
        src, target_dsn, ("public.big",), slot="dpone_big", publication="dpone_big"
    ).assert_equal()
