"""Repair by range for the stream (``repair=True``): a check that finds the target changed behind
the stream's back names the ranges and keys and fails; with the option the run rewrites exactly
those keys through the stream's own apply path, and the next check passes."""

from __future__ import annotations

import psycopg
import pytest

from dpone_dagster.core.errors import EngineError
from dpone_dagster.incremental import Sweep
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import table_catalog
from dpone_dagster.reconcile.digest import digest_query, pin_settings, row_hash, run_digest
from tests.helpers import pg
from tests.incremental.conftest import Stream

SLICE = Sweep(rows=500)
"""2,500 source rows in slices of 500: (-inf, 500], (500, 1000], ... (2000, +inf)."""
ORDERS = TableName("shop", "orders")


def _digest(dsn: str) -> tuple[int, str | None]:
    """The one reconciliation digest of every row of ``shop.orders`` (the source's columns)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pin_settings(conn, local=False)
        columns = [c for c in table_catalog(conn, ORDERS).columns if not c.generated]
        found = run_digest(conn, *digest_query(ORDERS, row_hash(conn, columns)))
    return found.count, found.hash


def _versions(dsn: str) -> dict[int, str]:
    """Each target row's ``xmin``: a row anything rewrote has a new one."""
    return {int(r[0]): str(r[1]) for r in pg.fetch_all(dsn, "SELECT id, xmin FROM shop.orders")}  # type: ignore[call-overload]


def _corrupt(target: str) -> None:
    """Behind the stream's back, in the key range (500, 1000]: one row updated, one deleted, one
    deleted and inserted again with other values."""
    pg.execute(target, "UPDATE shop.orders SET amount = -1 WHERE id = 600")
    pg.execute(target, "DELETE FROM shop.orders WHERE id = 700")
    pg.execute(target, "DELETE FROM shop.orders WHERE id = 800")
    pg.execute(
        target,
        "INSERT INTO shop.orders (id, updated_at, note, amount)"
        " VALUES (800, '2000-01-01', 'forged', 0)",
    )


def test_a_check_names_the_ranges_and_keys_that_differ_and_fails(stream: Stream) -> None:
    stream.run(reconcile=True, sweep=SLICE)  # the initial load; the sweep's slice (-inf, 500]
    _corrupt(stream.target)
    check = stream.run(reconcile=True, sweep=SLICE).verification  # the slice (500, 1000]
    assert check is not None and not check.ok and check.unexplained == 3
    assert check.examples == (("600",), ("700",), ("800",))
    assert check.differing_ranges == ((("500",), ("1000",)),)
    assert check.repaired_keys == 0 and check.proved_at is not None
    again = stream.run(reconcile=True, sweep=SLICE).verification  # checked again until repaired
    assert again is not None and not again.ok and again.differing_ranges[0] == (("500",), ("1000",))


def test_repair_rewrites_only_the_keys_that_differ_and_the_next_check_passes(
    stream: Stream,
) -> None:
    stream.run(reconcile=True, sweep=SLICE)
    _corrupt(stream.target)
    failed = stream.run(reconcile=True, sweep=SLICE).verification
    assert failed is not None and not failed.ok
    before = _versions(stream.target)
    repaired = stream.run(reconcile=True, sweep=SLICE, repair=True)
    check = repaired.verification
    assert check is not None and check.ok and check.unexplained == 0
    assert (check.repaired_keys, check.repaired_rows) == (3, 3)
    assert check.repaired_ranges == ((("500",), ("1000",)),)
    after = _versions(stream.target)
    rewritten = {k for k, v in after.items() if before.get(k) != v}
    assert rewritten == {600, 700, 800}  # nothing else was written
    assert _digest(stream.target) == _digest(stream.source)
    stream.assert_equal()
    for _ in range(7):  # every later check passes: the sweep under way, then a clean one
        later = stream.run(reconcile=True, sweep=SLICE).verification
        assert later is not None and later.ok and later.repaired_keys == 0
    assert later.swept_at is not None


def test_repair_in_a_run_that_copies_rows_and_deletes_keys_the_source_lost(
    stream: Stream,
) -> None:
    stream.run(reconcile=True, check="full", deletes="hard")
    pg.execute(stream.target, "UPDATE shop.orders SET note = 'x' WHERE id IN (5, 2400)")
    pg.execute(
        stream.source, "UPDATE shop.orders SET note = 'new', updated_at = now() WHERE id = 9"
    )
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id = 10")
    done = stream.run(reconcile=True, check="full", deletes="hard", repair=True)
    check = done.verification
    assert check is not None and check.ok and check.repaired_keys == 2
    assert (done.updated, done.deleted) == (1, 1)  # the run's own change and delete
    stream.assert_equal()
    assert _digest(stream.target) == _digest(stream.source)


def test_repair_without_verify_is_refused(stream: Stream) -> None:
    with pytest.raises(EngineError) as caught:
        stream.sync(repair=True)
    assert caught.value.code == "incremental_options_invalid"
    assert not pg.table_exists(stream.target, "shop", "orders")  # nothing written
