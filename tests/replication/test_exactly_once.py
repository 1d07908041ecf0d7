"""Contract points 1 and 2 against real servers: ``kill -9`` of a run at >= 12 moments
(inside the initial copy, inside a large source transaction, at the apply, at the commit,
between the target's commit and the slot's advance, at random), and of a pipelined run while one
target transaction is applied and the next staged on the other target session, never loses or
doubles a change;
a source transaction that touched two tables is seen whole by a concurrent reader; a replay from
an older slot position skips what the ledger holds."""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg

from dpone_dagster.replication.slot import slot_status
from tests.helpers import crash, pg
from tests.replication.group import Group, ledger_state

SHOP = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text, amount numeric(12,2));
CREATE TABLE shop.lines (id bigint PRIMARY KEY, order_id bigint, qty int);
"""
TABLES = ("shop.orders", "shop.lines")


def _transfers(conn: psycopg.Connection[Any], rng: random.Random, base: int, count: int) -> int:
    """``count`` source transactions over both tables (10 lines inserted from ``base`` on, one
    order updated, in each); how many."""
    for i in range(count):
        with conn.transaction():
            start = base + i * 10
            conn.execute(
                "INSERT INTO shop.lines SELECT g, g %% 100, 1 FROM generate_series(%s, %s) g",
                (start, start + 9),
            )
            conn.execute(
                "UPDATE shop.orders SET note = %s WHERE id = %s",
                (f"b{start}", rng.randint(1, 5000)),
            )
    return count


def _mutate(src: str, rng: random.Random, round_: int, big: bool) -> int:
    """Source transactions over both tables (one large one when ``big``); how many."""
    with psycopg.connect(src, autocommit=True) as conn:
        made = _transfers(conn, rng, 1_000_000 + round_ * 1000, 5)
        # A delete of an id an earlier round deleted changes nothing, and the server sends no
        # empty transaction (pgoutput skips them since PostgreSQL 15): it counts only when it
        # deleted its row.
        deleted = conn.execute("DELETE FROM shop.orders WHERE id = %s", (rng.randint(1, 5000),))
        made += deleted.rowcount
        if big:  # one transaction of 40,000 changes: several staging blocks before its commit
            base = 10_000_000 + round_ * 100_000
            conn.execute(
                "INSERT INTO shop.orders SELECT g, 'big', g FROM generate_series(%s, %s) g",
                (base, base + 39_999),
            )
            made += 1
    return made


def test_kill_9_at_many_moments_applies_every_change_exactly_once(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, SHOP)
    pg.execute(src, "INSERT INTO shop.orders SELECT g, 'n', g FROM generate_series(1, 60000) g")
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    plan = [
        ("copy", 1),
        ("timer", 1),
        ("copy", 2),
        ("apply", 1),
        ("commit", 1),
        ("committed", 1),
        ("advanced", 1),
        ("timer", 1),
        ("copy", 3),
        ("committed", 2),
        ("commit", 1),
        ("copy", 1),
        ("advanced", 1),
    ]
    # A run may finish before its kill point (a faster run, a slice with one copy only): such
    # attempts count as runs, not kills, and more attempts follow (at points every run reaches)
    # until 12 kills have landed.
    later = [("apply", 1), ("commit", 1), ("committed", 1), ("advanced", 1), ("timer", 1)]
    expected, outcomes = 0, []
    i = 0
    while sum(1 for _, o in outcomes if o == "killed") < 12 and i < 30:
        mode, nth = plan[i] if i < len(plan) else rng.choice(later)
        phase, _ = ledger_state(target_dsn)
        if i >= 2:
            made = _mutate(src, rng, i, big=True)
            expected += made if phase == "streaming" else 0
        child = crash.start_child("replication", src, target_dsn, 30_000)
        outcomes.append((mode, crash.kill_at(child, mode, nth, rng, timer=1.5, inside_copy=0.05)))
        phase, applied = ledger_state(target_dsn)
        assert applied <= expected, f"seed {seed}: {outcomes}: {applied} > {expected}"
        i += 1
    killed = sum(1 for _, o in outcomes if o == "killed")
    assert killed >= 12, f"seed {seed}: {outcomes}"
    # A run killed inside its peek leaves its source backend decoding until it next writes to
    # the dead socket: the run below waits for it, as for a lock (test_held_slot.py).
    group = Group(src, target_dsn, TABLES, slot="dpone_crash", publication="dpone_crash")
    report = group.run(batch_changes=30_000)
    assert report.initial_copy is None
    group.assert_equal()
    phase, applied = ledger_state(target_dsn)
    assert (phase, applied) == ("streaming", expected), f"seed {seed}: {outcomes}"
    assert pg.staging_tables(target_dsn) == []


def test_kill_9_while_one_target_transaction_applies_and_the_next_is_staged_loses_nothing(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """The pipelined apply: a run's target transactions of about 300 changes each, the next one
    staged on one target session (``next``) while the one before is applied and committed on
    the other by the apply worker's thread; ``kill -9`` just after a ``next`` (the worker
    mid-apply) and just after a ``committed`` (between the two sessions' commits: one landed,
    the slot not yet advanced, the next one staged)."""
    src = logical_source_dsn
    pg.execute(src, SHOP)
    pg.execute(src, "INSERT INTO shop.orders SELECT g, 'n', g FROM generate_series(1, 5000) g")
    group = Group(src, target_dsn, TABLES, slot="dpone_crash", publication="dpone_crash")
    group.run()
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    expected, outcomes = 0, []
    for round_ in range(8):
        with psycopg.connect(src, autocommit=True) as conn:
            expected += _transfers(conn, rng, 5_000_000 + round_ * 10_000, 120)
        mode = ("next", "committed")[round_ % 2]
        child = crash.start_child("replication", src, target_dsn, 300)
        outcomes.append((mode, crash.kill_at(child, mode, rng.randint(1, 4), rng)))
        assert ledger_state(target_dsn)[1] <= expected, f"seed {seed}: {outcomes}"
    assert sum(1 for _, o in outcomes if o == "killed") >= 6, f"seed {seed}: {outcomes}"
    report = group.run(batch_changes=300)
    assert report.initial_copy is None
    group.assert_equal()
    assert ledger_state(target_dsn) == ("streaming", expected), f"seed {seed}: {outcomes}"
    assert pg.staging_tables(target_dsn) == []


def test_a_replay_from_an_older_slot_position_skips_what_the_ledger_holds(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, SHOP)
    group = Group(src, target_dsn, TABLES)
    group.run()
    # A copy of the slot before the changes stands for a slot whose advance was lost.
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot('dpone_test', 'dpone_test_old')")
    pg.execute(src, "INSERT INTO shop.orders SELECT g, 'a', g FROM generate_series(1, 100) g")
    pg.execute(src, "UPDATE shop.orders SET amount = amount + 1")
    first = group.run()
    assert first.transactions == 2
    replay = Group(src, target_dsn, TABLES, slot="dpone_test_old", publication="dpone_test_pub")
    pg.execute(
        target_dsn,
        "INSERT INTO dpone_ledger.replication_groups (slot, publication, tables,"
        " phase, consistent_lsn, applied_lsn, applied_end_lsn, transactions)"
        " SELECT 'dpone_test_old', publication, tables, phase, consistent_lsn, applied_lsn,"
        " applied_end_lsn, transactions FROM dpone_ledger.replication_groups"
        " WHERE slot = 'dpone_test'",
    )
    again = replay.replication().run()
    assert (again.transactions, again.skipped_transactions) == (0, 2)
    group.assert_equal()
    with psycopg.connect(src, autocommit=True) as conn:
        status = slot_status(conn, "dpone_test_old")  # type: ignore[arg-type]
    assert status is not None and status.confirmed_flush_lsn >= again.applied_lsn


def test_a_transfer_between_two_tables_keeps_the_sum_for_a_reader(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(
        src,
        "CREATE TABLE public.a (id int PRIMARY KEY, bal bigint);"
        "CREATE TABLE public.b (id int PRIMARY KEY, bal bigint);"
        "INSERT INTO public.a SELECT g, 1000 FROM generate_series(1, 100) g;"
        "INSERT INTO public.b SELECT g, 1000 FROM generate_series(1, 100) g",
    )
    group = Group(src, target_dsn, ("public.a", "public.b"))
    group.run()
    rng = random.Random(3)
    with psycopg.connect(src, autocommit=True) as conn:
        for _ in range(300):
            x, y, amount = rng.randint(1, 100), rng.randint(1, 100), rng.randint(1, 50)
            with conn.transaction():
                conn.execute("UPDATE public.a SET bal = bal - %s WHERE id = %s", (amount, x))
                conn.execute("UPDATE public.b SET bal = bal + %s WHERE id = %s", (amount, y))
    sums: list[int] = []
    done = threading.Event()

    def read() -> None:
        with psycopg.connect(target_dsn, autocommit=True) as conn:
            while not done.is_set():
                row = conn.execute(
                    "SELECT (SELECT sum(bal) FROM public.a) + (SELECT sum(bal) FROM public.b)"
                ).fetchone()
                sums.append(int(row[0]))  # type: ignore[index]

    reader = threading.Thread(target=read)
    reader.start()
    try:
        report = group.run(batch_changes=1)  # one target transaction per source transaction
    finally:
        done.set()
        reader.join()
    assert report.transactions == 300
    assert sums and set(sums) == {200_000}
    group.assert_equal()
