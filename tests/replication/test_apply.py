"""The apply path against real servers: the initial copy meets the stream, the changes of a
run are applied by key in commit order, whole source transactions in one target transaction."""

from __future__ import annotations

from tests.helpers import pg
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
    pg.execute(logical_source_dsn, "INSERT INTO shop.orders SELECT g, 'n' || g, g FROM generate_series(1, 1000) g")
    group = Group(logical_source_dsn, target_dsn, ("shop.orders", "shop.lines"))
    first = group.run()
    assert first.initial_copy is not None and first.initial_copy.rows_loaded == 1000
    group.assert_equal()
    pg.execute(logical_source_dsn, "UPDATE shop.orders SET note = 'u' WHERE id <= 10")
    pg.execute(logical_source_dsn, "DELETE FROM shop.orders WHERE id BETWEEN 11 AND 20")
    pg.execute(logical_source_dsn, "INSERT INTO shop.lines SELECT g, g, 1 FROM generate_series(1, 50) g")
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
