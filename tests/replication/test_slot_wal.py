"""A group's slot never holds the source's disk hostage: a quiet group's slot moves while the rest
of the server writes, a run stopped by its budget advances to the last transaction it applied,
and an open transaction that holds the slot back is named until it ends.

The source is a private server (:mod:`tests.helpers.private_server`): nothing else writes its
WAL or keeps a transaction open on it, so the WAL a slot retains is the test's to state. The
target is the run's test server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from dpone_dagster.replication.slot import RESTART_LAG_BYTES
from tests.helpers import pg
from tests.helpers.logical import drop_logical_database
from tests.helpers.private_server import (
    BUSY,
    MB,
    checkpoint,
    lsn,
    private_server,
    slot_positions,
    write_wal,
)
from tests.replication.group import Group

WRITTEN = 100 * MB
"""WAL written outside the group (another table and another database) while it is quiet."""
BOUND = 16 * MB
"""The WAL a slot may retain once a checkpoint and a run have passed (one WAL segment): what
the server wrote since the checkpoint, never what was written before it."""
SLOT = "dpone_wal"
ORDERS = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text);
INSERT INTO shop.orders SELECT g, 'n' || g FROM generate_series(1, 100) g;
"""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with private_server("dpone_slot_wal_") as dsn:
        yield dsn


@pytest.fixture
def databases(server: str) -> Iterator[Callable[[str], str]]:
    """Fresh databases on the private server, dropped with their slots at the end."""
    made: list[str] = []

    def make(prefix: str) -> str:
        made.append(pg.create_database(prefix, server))
        return made[-1]

    yield make
    for dsn in made:
        drop_logical_database(dsn)


def _group(make: Callable[[str], str], target: str) -> tuple[Group, str, str]:
    """The group of ``shop.orders`` (initial copy done), its source and another database of
    the same server; both have a ``public.busy`` table outside the group."""
    src, other = make("dpone_wal_src"), make("dpone_wal_other")
    pg.execute(src, ORDERS + ";" + BUSY)
    pg.execute(other, BUSY)
    group = Group(src, target, ("shop.orders",), slot=SLOT, publication=SLOT)
    assert group.run().initial_copy is not None
    return group, src, other


def test_a_quiet_groups_slot_moves_while_other_tables_and_databases_write(
    databases: Callable[[str], str], target_dsn: str
) -> None:
    """The group's table stays quiet while 100 MB of WAL is written to another table and
    another database. A run confirms the slot at least to the source's LSN taken before it;
    after a checkpoint and the next run the slot retains none of those 100 MB (its restart
    point is past them) and under 16 MB in all; a change to the quiet table still arrives."""
    group, src, other = _group(databases, target_dsn)
    start = lsn(src)
    written = write_wal([src, other], WRITTEN)
    assert written - start >= WRITTEN
    before = lsn(src)
    quiet = group.run()
    assert quiet.transactions == 0
    confirmed, restart, _ = slot_positions(src, SLOT)
    assert confirmed >= before
    assert quiet.slot.confirmed_flush_lsn == confirmed
    checkpoint(src)
    after = group.run()
    confirmed, restart, current = slot_positions(src, SLOT)
    assert restart >= written, "the slot still retains WAL written before the checkpoint"
    assert current - restart < BOUND
    assert after.slot.retained_bytes < BOUND and after.slot.held_by == ()
    pg.execute(src, "UPDATE shop.orders SET note = 'late' WHERE id = 1")
    assert group.run().tables[0].updated == 1
    group.assert_equal()


def test_the_run_after_a_large_one_moves_the_restart_point_past_it_without_a_checkpoint(
    databases: Callable[[str], str], target_dsn: str
) -> None:
    """A run applies about 4 MB of the group's own changes; the slot's restart point then lags
    its confirmed position by that WAL, which every read would decode again until a
    running-transactions record is decoded past it (a checkpoint's, or the background writer's
    every 15 s of activity). The run writes one (:func:`~dpone_dagster.replication.slot.
    mark_restart_point`), so the very next run, with nothing to apply, moves the restart point
    past the large run: the slot retains none of its WAL."""
    group, src, _ = _group(databases, target_dsn)
    pg.execute(
        src,
        "INSERT INTO shop.orders SELECT g, repeat(md5(g::text), 30)"
        " FROM generate_series(1000, 5000) AS g",
    )
    large = group.run()
    assert large.tables[0].inserted == 4001
    confirmed, restart, _ = slot_positions(src, SLOT)
    assert confirmed - restart > RESTART_LAG_BYTES  # the large run's WAL, still retained
    # The record is written, not flushed: a read decodes flushed WAL only. A commit flushes it
    # (here another table's; the WAL writer does within wal_writer_delay, 200 ms by default).
    pg.execute(src, "INSERT INTO public.busy (pad) VALUES ('flush')")
    quiet = group.run()
    assert quiet.transactions == 0
    _, restart, current = slot_positions(src, SLOT)
    assert restart >= confirmed, "the slot still retains the large run's WAL"
    assert quiet.slot.retained_bytes < RESTART_LAG_BYTES and current - restart < MB
    group.assert_equal()


def _commit_transactions(src: str, count: int) -> list[tuple[int, int]]:
    """Commits ``count`` transactions of 10 inserts each into ``shop.orders``; returns each
    one's ``(LSN before its COMMIT, LSN after it)``: its commit record lies between."""
    brackets = []
    with psycopg.connect(src) as conn:
        for i in range(count):
            first = 1000 + 10 * i
            conn.execute(
                "INSERT INTO shop.orders SELECT g, 'batch'"
                " FROM generate_series(%s::int8, %s::int8) g",
                (first, first + 9),
            )
            before = lsn(src)
            conn.commit()
            brackets.append((before, lsn(src)))
    return brackets


def _applied_end(target: str) -> int:
    value = pg.fetch_one(
        target,
        "SELECT (applied_end_lsn - '0/0')::int8 FROM dpone_ledger.replication_groups"
        " WHERE slot = %s",
        (SLOT,),
    )
    return int(value)  # type: ignore[call-overload]


def test_a_run_stopped_by_its_budget_advances_to_the_last_transaction_it_applied(
    databases: Callable[[str], str], target_dsn: str
) -> None:
    """100 MB is written outside the group, then a checkpoint, then six transactions into
    it. A run stopped by its budget confirms the slot exactly at the end of the last
    transaction it applied (past the 100 MB, before the next transaction's commit), as the
    ledger records it; after a checkpoint and the next budget-stopped run the slot retains none
    of the 100 MB and under 16 MB in all; the runs after drain the rest."""
    group, src, other = _group(databases, target_dsn)
    written = write_wal([src, other], WRITTEN)
    checkpoint(src)
    brackets = _commit_transactions(src, 6)
    first = group.run(max_changes_per_run=15)
    applied = first.transactions
    assert first.budget_reached and 0 < applied < 5
    confirmed, _, _ = slot_positions(src, SLOT)
    before_commit, after_commit = brackets[applied - 1]
    assert before_commit < confirmed <= after_commit < brackets[applied][0]
    assert confirmed >= written
    assert confirmed == _applied_end(target_dsn) == first.slot.confirmed_flush_lsn
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders") == 100 + 10 * applied
    checkpoint(src)
    second = group.run(max_changes_per_run=15)
    assert second.budget_reached and second.transactions > 0
    _, restart, current = slot_positions(src, SLOT)
    assert restart >= written, "the slot still retains WAL written before its applied position"
    assert current - restart < BOUND
    while group.run().transactions:
        pass
    group.assert_equal()


def _reading_session(src: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session left idle in a ``REPEATABLE READ`` transaction that only read: it has a
    snapshot (``backend_xmin``) and no transaction id."""
    reader = psycopg.connect(src)
    reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    reader.execute("SELECT count(*) FROM shop.orders")
    return reader


def test_an_open_transaction_holds_the_slot_and_is_named_until_it_ends(
    databases: Callable[[str], str], target_dsn: str
) -> None:
    """A session of another database of the source writes a row and stays idle in its
    transaction; a second session only reads, under REPEATABLE READ. Runs go on applying what
    commits, but the slot keeps the WAL since the writer began (20 MB written meanwhile), and
    the slot's state names the writer (pid, database, state, age, its statement with its
    literal masked), never the reader. Once the writer commits, a checkpoint and the next run
    release the WAL while the reader is still open."""
    group, src, other = _group(databases, target_dsn)
    reader = _reading_session(src)
    holder = psycopg.connect(other, application_name="nightly report")
    holder.execute("INSERT INTO public.busy (pad) VALUES ('the password is hunter2')")
    held_from = lsn(src)
    try:
        pg.execute(src, "UPDATE shop.orders SET note = 'while held' WHERE id <= 10")
        write_wal([src, other], 20 * MB)
        checkpoint(src)
        run = group.run()
        assert run.tables[0].updated == 10
        group.assert_equal()
        _, restart, current = slot_positions(src, SLOT)
        assert restart < held_from and current - restart >= 20 * MB
        [held] = run.slot.held_by
        assert (held.pid, held.database, held.application_name, held.state) == (
            holder.info.backend_pid, holder.info.dbname, "nightly report", "idle in transaction"
        )  # fmt: skip
        assert held.seconds is not None and held.seconds > 0 and held.xact_start is not None
        assert held.query == "INSERT INTO public.busy (pad) VALUES ('…')"
        holder.commit()
        holder.close()
        done = lsn(src)
        checkpoint(src)
        released = group.run()
        _, restart, current = slot_positions(src, SLOT)
        assert released.slot.held_by == ()
        assert restart >= done and current - restart < BOUND
    finally:
        holder.close()
        reader.close()
