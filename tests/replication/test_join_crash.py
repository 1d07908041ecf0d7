"""Tables joining and leaving a streaming group under ``kill -9``, against real servers: runs
that alternate the group between ``orders + lines`` and ``orders + extra`` (each run, one table
leaves and one joins, copied alone) are killed inside the joining table's copy, between its copy
and its first streamed change, at the apply, at the commit, between the commit and the slot's
advance; every run that finishes leaves its tables equal to the source (``extra`` has no key:
a change applied twice would show as a duplicate row), and the last run with the three tables
does too."""

from __future__ import annotations

import random

import psycopg

from tests.helpers import crash, pg
from tests.helpers.logical import OWN_SLOTS
from tests.replication.group import Group, ledger_state

SHOP = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text, amount numeric(12,2));
CREATE TABLE shop.lines (id bigint PRIMARY KEY, order_id bigint, qty int);
CREATE TABLE shop.extra (n int, v text);
ALTER TABLE shop.extra REPLICA IDENTITY FULL;
INSERT INTO shop.orders SELECT g, 'n', g FROM generate_series(1, 20000) g;
INSERT INTO shop.lines SELECT g, g %% 100, 1 FROM generate_series(1, 30000) g;
INSERT INTO shop.extra SELECT g %% 100, 'e' FROM generate_series(1, 30000) g;
"""
GROUPS = {
    "replication_lines": ("shop.orders", "shop.lines"),
    "replication_join": ("shop.orders", "shop.extra"),
}


def _mutate(src: str, rng: random.Random, round_: int) -> int:
    """Source transactions over the three tables (a few large); how many."""
    with psycopg.connect(src, autocommit=True) as conn:
        for i in range(4):
            with conn.transaction():
                base = 1_000_000 + round_ * 1000 + i * 10
                conn.execute("INSERT INTO shop.lines SELECT g, g %% 100, 1"
                             " FROM generate_series(%s, %s) g", (base, base + 9))  # fmt: skip
                conn.execute("INSERT INTO shop.extra SELECT %s, 'r' FROM generate_series(1, 300)",
                             (round_,))  # fmt: skip
                conn.execute(
                    "UPDATE shop.extra SET v = v || '+' WHERE ctid IN (SELECT ctid"
                    " FROM shop.extra WHERE n = %s LIMIT 3)",
                    (rng.randint(0, 99),),
                )
                conn.execute("UPDATE shop.orders SET note = %s WHERE id = %s",
                             (f"r{round_}.{i}", rng.randint(1, 20000)))  # fmt: skip
        conn.execute("DELETE FROM shop.extra WHERE ctid IN (SELECT ctid FROM shop.extra"
                     " WHERE n = %s LIMIT 2)", (rng.randint(0, 99),))  # fmt: skip
    return 5


def test_kill_9_while_tables_join_and_leave_loses_and_doubles_nothing(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, SHOP)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    first = crash.start_child("replication", src, target_dsn, 30_000)
    assert crash.kill_at(first, "never", 1, rng) == "finished", f"seed {seed}"
    # Each table joins killed inside its copy (runs alternate: lines joins, then extra), and
    # both tables of 30,000 rows: a kill up to 50 ms after the joining line lands in the copy.
    plan = [
        ("joining", 1), ("joining", 1), ("joined", 1), ("apply", 1), ("joining", 1),
        ("commit", 1), ("joined", 1), ("committed", 1), ("joining", 1), ("advanced", 1),
        ("joined", 1), ("joined", 1),
    ]  # fmt: skip
    issued, outcomes, engines = 0, [], list(GROUPS)
    for i, (mode, nth) in enumerate(plan):
        issued += _mutate(src, rng, i)
        engine = engines[i % 2]
        child = crash.start_child(engine, src, target_dsn, 30_000)
        outcome = crash.kill_at(child, mode, nth, rng, inside_copy=0.05)
        outcomes.append((engine, mode, outcome))
        phase, applied = ledger_state(target_dsn)
        assert phase == "streaming" and applied <= issued, f"seed {seed}: {outcomes}"
        if outcome == "finished":  # drained: its tables equal the source's
            Group(src, target_dsn, GROUPS[engine], slot="dpone_crash").assert_equal()
    kills = [o for o in outcomes if o[2] == "killed"]
    assert len(kills) >= 8, f"seed {seed}: {outcomes}"
    assert {m for _, m, _ in kills} >= {"joining", "joined"}, f"seed {seed}: {outcomes}"
    # A run killed inside its peek leaves its server process decoding until it next writes to
    # its dead socket: the runs below wait for it (test_held_slot.py).
    for _ in range(2):
        last = crash.start_child("replication_all", src, target_dsn, 30_000)
        assert crash.kill_at(last, "never", 1, rng) == "finished", f"seed {seed}: {outcomes}"
    everything = ("shop.orders", "shop.lines", "shop.extra")
    Group(src, target_dsn, everything, slot="dpone_crash").assert_equal()
    assert pg.staging_tables(target_dsn) == []
    pg.wait_until(  # the killed runs' temporary slots went with their sessions
        lambda: pg.fetch_one(src, OWN_SLOTS) == 1,
        timeout=30,
        what="only the group's slot is left",
    )
