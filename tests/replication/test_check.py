"""The replication group's check (``reconcile=True``) against real servers: every key a run
applied, exactly, and a rolling sweep of each table's key, proved at the applied position while
writers go on writing (a key a change committed after it is left to the next run, counted); a
target row edited behind the engine's back fails the check naming its key; a keyless table is
compared whole; the sweep finds a
difference in a key no run touched within its stated number of runs; the check run alone
compares both whole tables."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from dpone_dagster.core.sweep import Sweep
from dpone_dagster.core.verification import Verification
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.engine import Replication
from dpone_dagster.replication.replication_report import ReplicationProgress, ReplicationReport
from tests.helpers import pg
from tests.replication.group import Group

ORDERS = TableName("shop", "orders")
SLICE = Sweep(rows=500)
"""2,500 source rows in slices of 500: a full sweep in five runs."""


def _shop(src: str) -> None:
    pg.execute(src, "CREATE SCHEMA shop")
    pg.execute(src, "CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text)")
    pg.execute(src, "INSERT INTO shop.orders SELECT g, 'n' || g FROM generate_series(1, 2500) g")
    pg.execute(src, "ANALYZE shop.orders")  # the row estimate a full sweep's ranges come from


def _checked(group: Group, deletes: str = "hard", **kwargs: Any) -> Replication:
    """The group's engine with its check (slices of 500 rows)."""
    checked = group.group(deletes=deletes, reconcile=True, sweep=SLICE)
    return Replication(checked, source=group.source, target=group.target, **kwargs)


def at_the_runs_advance(act: Callable[[], object]) -> Callable[[ReplicationProgress], None]:
    """A progress hook that calls ``act`` once, when the run has advanced the slot to the
    position L it read up to (its check comes next). A run of one target transaction advances
    the slot once: its commit leaves the advance to the run's own."""
    done: list[bool] = []

    def hook(progress: ReplicationProgress) -> None:
        if progress.phase == "advanced" and not done:
            done.append(True)
            act()

    return hook


def _check(report: ReplicationReport) -> Verification:
    check = report.checks[ORDERS]
    assert check.applied_lsn is not None and check.proved_at is not None
    return check


def test_writers_after_the_runs_position_are_left_to_the_next_run_and_counted(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    first = _check(_checked(group).run())  # the initial copy: no applied key, a slice
    assert first.ok and (first.keys_checked, first.ranges_checked) == (0, 1)
    pg.execute(src, "UPDATE shop.orders SET note = 'run' WHERE id BETWEEN 10 AND 20")
    pg.execute(src, "DELETE FROM shop.orders WHERE id = 30")

    def write() -> None:
        # Writers after the run's position: the run's own keys 10..15 change again, and a
        # key of this run's slice ((500, 1000]) is deleted; the check sees them all.
        pg.execute(src, "UPDATE shop.orders SET note = 'later' WHERE id BETWEEN 10 AND 15")
        pg.execute(src, "DELETE FROM shop.orders WHERE id = 700")
        pg.execute(src, "INSERT INTO shop.orders VALUES (600000, 'new')")

    report = _checked(group, on_progress=at_the_runs_advance(write)).run()
    check = _check(report)
    assert report.tables[0].updated == 11 and report.tables[0].deleted == 1
    assert check.ok, check
    assert check.scope == "run" and check.keys_checked == 12  # 10..20 and the deleted 30
    assert check.ranges_checked == 1 and check.ranges_total == 5
    assert check.changed_since_mark == 7  # 10..15 (the run's) and 700 (the slice's)
    assert check.unexplained == 0
    again = _check(_checked(group).run())  # the next run applies them: nothing left over
    assert again.ok and again.changed_since_mark == 0 and again.keys_checked == 8
    group.assert_equal()


def test_a_backlog_is_checked_by_the_whole_table_which_also_finds_a_row_no_run_touched(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A run whose keys are an eighth of the table or more is checked by both whole tables'
    digests (a full sweep too), the keys changed after its position left out; a target row no
    run touched, edited behind the engine's back, fails it, named."""
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    _checked(group).run()
    pg.execute(src, "UPDATE shop.orders SET note = 'backlog' WHERE id <= 400")

    def write() -> None:
        pg.execute(src, "UPDATE shop.orders SET note = 'later' WHERE id BETWEEN 5 AND 9")
        pg.execute(src, "DELETE FROM shop.orders WHERE id = 2222")

    whole = _check(_checked(group, on_progress=at_the_runs_advance(write)).run())
    assert whole.ok and whole.keys_checked == 400 and whole.keys_compared == 0
    assert whole.ranges_checked == whole.ranges_total == 5 and whole.swept_at == whole.proved_at
    assert whole.changed_since_mark == 6  # 5..9 and 2222: the next run's
    pg.execute(target_dsn, "UPDATE shop.orders SET note = 'edited' WHERE id = 2000")
    pg.execute(src, "UPDATE shop.orders SET note = 'again' WHERE id BETWEEN 401 AND 800")
    failed = _check(_checked(group).run())
    assert not failed.ok and failed.examples == (("2000",),) and failed.ranges_checked == 0
    small = _check(_checked(group).run())  # a few keys: checked key by key, 2000 kept failing
    assert small.keys_checked < 100 and not small.ok and small.examples == (("2000",),)


def test_a_truncate_after_the_runs_position_leaves_every_key_to_the_next_run(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A ``TRUNCATE`` committed after the run's position: every key that differs (the run's, and
    the whole slice) is left to the next run, which empties the target; both checks pass."""
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    _checked(group).run()
    pg.execute(src, "UPDATE shop.orders SET note = 'run' WHERE id <= 5")

    def truncate() -> None:
        pg.execute(src, "TRUNCATE shop.orders")

    check = _check(_checked(group, on_progress=at_the_runs_advance(truncate)).run())
    assert check.ok, check
    # The run's 5 keys, and the slice: the source holds no key after 500 any more, so it is the
    # last one, open-ended: the target's keys 501..2500.
    assert check.changed_since_mark == 5 + 2000 and check.differing_ranges == ()
    emptied = _check(_checked(group).run())
    assert emptied.ok and emptied.changed_since_mark == 0
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders") == 0


def test_the_check_passes_run_after_run_with_a_writer_writing_throughout(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A writer updates, inserts and deletes random rows the whole time (before, during and
    after each run's position): every run's check passes, whatever it finds changed after the
    applied position; once the writer stops, the next run leaves the target equal and its check
    finds nothing left over."""
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    _checked(group).run()
    stop = threading.Event()
    written = [0]

    def write() -> None:
        rng = random.Random(24)
        with psycopg.connect(src, autocommit=True) as conn:
            while not stop.is_set():
                key = rng.randint(1, 2600)
                kind = rng.random()
                if kind < 0.6:
                    conn.execute("UPDATE shop.orders SET note = md5(random()::text) WHERE id = %s",
                                 (key,))  # fmt: skip
                elif kind < 0.8:
                    conn.execute("INSERT INTO shop.orders VALUES (%s, 'w') ON CONFLICT DO NOTHING",
                                 (key,))  # fmt: skip
                else:
                    conn.execute("DELETE FROM shop.orders WHERE id = %s", (key,))
                written[0] += 1

    writer = threading.Thread(target=write)
    writer.start()
    left = 0
    try:
        for _ in range(6):
            check = _check(_checked(group).run())
            assert check.ok, check
            left += check.changed_since_mark
    finally:
        stop.set()
        writer.join()
    assert written[0] > 100 and left > 0  # the writer raced the checks, and they saw it
    last = _check(_checked(group).run())
    assert last.ok and last.changed_since_mark == 0
    group.assert_equal()


def test_key_changes_and_soft_deletes_are_checked_as_the_target_holds_them(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A key change is checked at both keys (the old one is gone on both sides), and under
    ``soft`` deletes a marked row is not the target's: the check passes; a marked row revived
    behind the engine's back fails it, naming the key."""
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    _checked(group, deletes="soft").run()
    pg.execute(src, "UPDATE shop.orders SET id = 9001 WHERE id = 5")  # a key change
    pg.execute(src, "DELETE FROM shop.orders WHERE id BETWEEN 40 AND 44")
    check = _check(_checked(group, deletes="soft").run())
    assert check.ok, check
    assert check.keys_checked == 7  # 5 and 9001, 40..44
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders WHERE id BETWEEN 40 AND 44"
                        " AND _dpone_deleted_at IS NOT NULL") == 5  # fmt: skip
    pg.execute(target_dsn, "UPDATE shop.orders SET _dpone_deleted_at = NULL WHERE id = 42")
    whole = _checked(group, deletes="soft").check()[ORDERS]
    assert not whole.ok and whole.examples == (("42",),)


def test_a_run_stopped_by_its_budget_leaves_its_keys_to_the_run_that_drains_the_slot(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A run stopped by ``max_changes_per_run`` reports no check (its check would peek the whole
    backlog); its keys stay recorded, and the run that drains the slot checks them with its
    own."""
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    _checked(group).run()
    for ids in ("1 AND 3", "4 AND 9"):
        pg.execute(src, f"UPDATE shop.orders SET note = 'b' WHERE id BETWEEN {ids}")
    budget = Replication(group.group(max_changes_per_run=1, reconcile=True, sweep=SLICE),
                         source=src, target=target_dsn)  # fmt: skip
    stopped = budget.run()
    assert stopped.budget_reached and stopped.checks == {}
    drained = _check(_checked(group).run())
    assert drained.ok and drained.keys_checked == 9  # 1..3 of the stopped run, 4..9 its own
    group.assert_equal()


def test_a_keyless_table_beside_a_keyed_one_is_compared_whole_and_records_no_key(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """A table without a primary key (``REPLICA IDENTITY FULL``) beside a keyed one: the run
    applies both, checks the keyed one by its keys and the keyless one whole (its digest,
    :mod:`dpone_dagster.replication.verify_keyless`), and records no key of it."""
    src = logical_source_dsn
    _shop(src)
    pg.execute(src, "CREATE TABLE shop.log (at int, what text)")
    pg.execute(src, "ALTER TABLE shop.log REPLICA IDENTITY FULL")
    group = Group(src, target_dsn, ("shop.orders", "shop.log"))
    _checked(group).run()
    pg.execute(src, "INSERT INTO shop.log VALUES (1, 'a'), (1, 'a'), (2, 'b')")
    pg.execute(src, "UPDATE shop.orders SET note = 'k' WHERE id = 3")
    report = _checked(group).run()
    assert set(report.checks) == {ORDERS, TableName("shop", "log")}
    assert _check(report).ok and _check(report).keys_checked == 1
    log = report.checks[TableName("shop", "log")]
    assert (log.ok, log.scope, log.ranges_checked, log.rows_swept) == (True, "table", 1, 3)
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.replication_keys") == 0
    group.assert_equal()


def test_a_target_row_edited_behind_the_engines_back_fails_the_check_naming_the_key(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    _checked(group).run()
    # A target trigger garbles one row the apply writes: the run's own key now differs.
    pg.execute(
        target_dsn,
        "CREATE FUNCTION shop.garble() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.id = 15 THEN NEW.note := 'garbled'; END IF; RETURN NEW; END $$;"
        " CREATE TRIGGER garble BEFORE UPDATE ON shop.orders FOR EACH ROW"
        " EXECUTE FUNCTION shop.garble()",
    )
    pg.execute(src, "UPDATE shop.orders SET note = 'run' WHERE id BETWEEN 10 AND 20")
    check = _check(_checked(group).run())
    assert not check.ok
    assert (check.keys_checked, check.unexplained, check.examples) == (11, 1, (("15",),))
    assert check.changed_since_mark == 0
    # Nothing changed since: the key that differs is verified again, and fails again.
    again = _check(_checked(group).run())
    assert (again.ok, again.keys_checked, again.examples) == (False, 1, (("15",),))


def test_the_sweep_finds_a_difference_no_run_touched_within_its_stated_runs(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    _shop(src)
    group = Group(src, target_dsn, ("shop.orders",))
    first = _check(_checked(group).run())
    assert first.ranges_total == 5
    pg.execute(target_dsn, "UPDATE shop.orders SET note = 'edited' WHERE id = 2222")
    found: Verification | None = None
    for _ in range(first.ranges_total):
        check = _check(_checked(group).run())
        assert check.keys_checked == 0  # no run touched a key
        if not check.ok:
            found = check
            break
    assert found is not None, "the sweep did not reach key 2222 within 5 runs"
    assert found.examples == (("2222",),) and found.unexplained == 1
    assert found.differing_ranges == ((("2000",), None),)  # the last, open-ended slice
    # The check run alone compares both whole tables, and writes nothing.
    whole = _checked(group).check()[ORDERS]
    assert whole.scope == "full" and not whole.ok and whole.examples == (("2222",),)
    pg.execute(target_dsn, "UPDATE shop.orders SET note = 'n2222' WHERE id = 2222")
    assert _checked(group).check()[ORDERS].ok
    later = _check(_checked(group).run())  # the range is verified again: it agrees now
    assert later.ok and later.differing_ranges == ()
