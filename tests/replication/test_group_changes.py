"""Tables that join or leave a streaming group, against real servers (the first two tests with
the source on PostgreSQL 15 and 18): a joining table is copied
alone under a snapshot whose place in the group's stream is known (writers running across it
lose and double nothing, the other tables are not copied again); a table that leaves is no
longer applied and its target is kept as it is; a table the publication lost is copied again; a
joining table whose target holds rows needs ``adopt``; a join overtaken by a run that streamed
past its snapshot commits nothing."""

from __future__ import annotations

import threading

import psycopg
import pytest

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import ConnectionOptions
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.replication_report import ReplicationProgress
from tests.helpers import pg
from tests.replication.group import Group

SHOP = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text);
CREATE TABLE shop.lines (id bigint PRIMARY KEY, qty int);
CREATE TABLE shop.extra (n int, v text);
ALTER TABLE shop.extra REPLICA IDENTITY FULL;
INSERT INTO shop.orders SELECT g, 'o' FROM generate_series(1, 1000) g;
INSERT INTO shop.lines SELECT g, 1 FROM generate_series(1, 1000) g;
INSERT INTO shop.extra SELECT g %% 50, 'e' FROM generate_series(1, 20000) g;
"""
ORDERS, LINES, EXTRA = (TableName("shop", n) for n in ("orders", "lines", "extra"))


def _ledger_tables(target: str) -> list[object]:
    """The ledger's record of the group's tables."""
    return list(pg.fetch_one(target, "SELECT tables FROM dpone_ledger.replication_groups"))  # type: ignore[call-overload]


class Writer:
    """Source transactions over ``shop.extra`` (keyless: an insert applied twice shows as a
    duplicate row, one skipped as a missing row) and ``shop.orders``, one after another, from
    :meth:`start` until :meth:`stop`."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.done, self.count = dsn, threading.Event(), 0
        self.at_joined: int | None = None  # transactions committed when the copy ended
        self.thread = threading.Thread(target=self._write)

    def _write(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.done.is_set() or self.count < 30:
                with conn.transaction():
                    conn.execute("INSERT INTO shop.extra VALUES (%s, 'w')", (self.count % 7,))
                    conn.execute(
                        "UPDATE shop.extra SET v = v || '+' WHERE ctid = (SELECT ctid"
                        " FROM shop.extra WHERE n = %s LIMIT 1)",
                        (self.count % 50,),
                    )
                    conn.execute("UPDATE shop.orders SET note = %s WHERE id = %s",
                                 (f"w{self.count}", self.count % 1000 + 1))  # fmt: skip
                self.count += 1

    def start(self, step: ReplicationProgress | None = None) -> None:
        if (step is None or step.phase == "joining") and not self.thread.is_alive():
            self.thread.start()
        if step is not None and step.phase == "joined":
            self.at_joined = self.count

    def stop(self) -> None:
        self.done.set()
        self.thread.join(60)


@pytest.mark.cross_server
def test_a_table_joins_a_streaming_group_alone_under_a_snapshot_the_stream_knows(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """A writer commits across the new table's snapshot, from just before it is taken until
    the run ends: every one of its transactions reaches the target once (the keyless table would
    show a doubled or a missing row), and the tables already in the group are not copied."""
    src = versioned_source_dsn
    pg.execute(src, SHOP)
    Group(src, target_dsn, ("shop.orders", "shop.lines")).run()
    group = Group(src, target_dsn, ("shop.orders", "shop.lines", "shop.extra"))
    before = {t: group.target_oid(t) for t in ("shop.orders", "shop.lines")}
    writer = Writer(src)
    try:
        report = group.run(on_progress=writer.start)
        ran = writer.count  # committed by the time the run ended
    finally:
        writer.stop()
    assert writer.at_joined is not None and ran > writer.at_joined  # across the snapshot
    assert (report.tables_joined, report.tables_removed) == ((EXTRA,), ())
    assert [t.target for c in report.join_copies for t in c.tables] == [EXTRA]
    assert report.initial_copy is None
    assert {t: group.target_oid(t) for t in before} == before  # neither copied again
    [_, _, joined] = _ledger_tables(target_dsn)
    assert list(joined[:2]) == ["shop", "extra"] and "start" in joined[2]  # type: ignore[index]
    group.run()  # what the writer committed after the run's read
    group.assert_equal()


@pytest.mark.cross_server
def test_a_table_that_leaves_is_no_longer_applied_and_its_target_is_kept(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """The publication drops it and the ledger forgets it; its changes from then on (and those
    still in the slot) are not applied; the run says so once."""
    src = versioned_source_dsn
    pg.execute(src, SHOP)
    Group(src, target_dsn, ("shop.orders", "shop.lines")).run()
    pg.execute(src, "UPDATE shop.lines SET qty = 2 WHERE id = 1; UPDATE shop.orders SET note = 'x'"
                    " WHERE id = 1")  # fmt: skip
    kept = Group(src, target_dsn, ("shop.lines",)).rows(target_dsn, "shop.orders")
    smaller = Group(src, target_dsn, ("shop.lines",))
    report = smaller.run()
    assert report.tables_removed == (ORDERS,)
    assert [t.table for t in report.tables] == [LINES] and report.tables[0].updated == 1
    assert pg.fetch_all(src, "SELECT prrelid::regclass::text FROM pg_publication_rel") == [
        ("shop.lines",)
    ]
    pg.execute(
        src, "DELETE FROM shop.orders WHERE id < 100; INSERT INTO shop.orders VALUES (0, 'n')"
    )
    again = smaller.run()
    assert again.tables_removed == ()
    assert smaller.rows(target_dsn, "shop.orders") == kept  # as it was when it left
    smaller.assert_equal("shop.lines")
    assert [e[:2] for e in _ledger_tables(target_dsn)] == [["shop", "lines"]]  # type: ignore[index]


def test_a_table_the_publication_lost_is_copied_again_and_a_filled_target_needs_adopt(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A table dropped from the publication by hand missed its changes meanwhile: the next run
    copies it again, alone. A new table whose target already holds rows is refused
    (``replication_target_exists``, nothing changed) until the run adopts it."""
    src = logical_source_dsn
    pg.execute(src, SHOP)
    group = Group(src, target_dsn, ("shop.orders", "shop.lines"))
    group.run()
    orders = group.target_oid("shop.orders")
    pg.execute(src, "ALTER PUBLICATION dpone_test_pub DROP TABLE shop.lines")
    pg.execute(src, "UPDATE shop.lines SET qty = 7 WHERE id <= 10")  # not published
    pg.execute(src, "ALTER PUBLICATION dpone_test_pub ADD TABLE shop.lines")
    report = group.run()
    assert report.tables_joined == (LINES,)
    group.assert_equal()
    assert group.target_oid("shop.orders") == orders
    pg.execute(target_dsn, "CREATE TABLE shop.extra (n int, v text); INSERT INTO shop.extra"
                           " VALUES (1, 'the target''s own')")  # fmt: skip
    wider = Group(src, target_dsn, ("shop.orders", "shop.lines", "shop.extra"))
    with pytest.raises(DponeError) as caught:
        wider.run()
    assert caught.value.code == "replication_target_exists"
    assert "shop.extra" in caught.value.message and "adopt=True" in caught.value.next_actions[0]
    assert pg.fetch_all(src, "SELECT prrelid::regclass::text FROM pg_publication_rel"
                             " ORDER BY 1") == [("shop.lines",), ("shop.orders",)]  # fmt: skip
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.extra") == 1
    assert wider.run(adopt=True).tables_joined == (EXTRA,)
    wider.assert_equal()


def test_a_join_overtaken_by_a_run_that_streamed_past_its_snapshot_commits_nothing(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A joining run held at its copy's swap (a reader of the target table) while a run of the
    group without the table streams past the copy's snapshot: the copy is refused
    (``replication_join_overtaken``), nothing of it committed; the next run joins the table."""
    src = logical_source_dsn
    pg.execute(src, SHOP)
    small = Group(src, target_dsn, ("shop.orders",))
    small.run()
    pg.execute(target_dsn, "CREATE TABLE shop.extra (n int, v text)")  # empty: no adopt needed
    failures: list[BaseException] = []
    joined = threading.Event()

    def join() -> None:
        wide = Group(src, target_dsn, ("shop.orders", "shop.extra"))
        try:
            wide.run(connection_options=ConnectionOptions(lock_wait=60),
                     on_progress=lambda s: s.phase == "joining" and joined.set())  # fmt: skip
        except BaseException as exc:
            failures.append(exc)

    with psycopg.connect(target_dsn) as reader:
        reader.execute("SELECT count(*) FROM shop.extra")  # holds ACCESS SHARE until rollback
        thread = threading.Thread(target=join)
        thread.start()
        pg.wait_until(
            lambda: pg.fetch_one(
                target_dsn,
                "SELECT count(*) FROM pg_locks WHERE relation = 'shop.extra'::regclass"
                " AND NOT granted",
            ),
            timeout=60,
            what="the joining run waits to swap shop.extra in",
        )
        assert joined.is_set()
        pg.execute(src, "UPDATE shop.orders SET note = 'after the snapshot' WHERE id = 1")
        assert small.run().transactions == 1  # streams past the copy's snapshot
        reader.rollback()
        thread.join(120)
    assert len(failures) == 1 and isinstance(failures[0], DponeError), failures
    assert failures[0].code == "replication_join_overtaken"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.extra") == 0
    assert [e[:2] for e in _ledger_tables(target_dsn)] == [["shop", "orders"]]  # type: ignore[index]
    wide = Group(src, target_dsn, ("shop.orders", "shop.extra"))
    assert wide.run().tables_joined == (EXTRA,)
    wide.assert_equal()
