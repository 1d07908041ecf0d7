"""Failover against real servers: a primary and its physical standby (:mod:`tests.helpers.standby`,
embedded PostgreSQL 18), the target on the run's normal server.

- The primary killed (``pg_ctl -m immediate``) mid-apply and between a target commit and the
  slot's advance, under live writers: after promotion the runs go on from the standby's
  synchronized copy of the slot, and every source transaction reaches the target exactly once,
  whole, as a concurrent reader of the target sees it.
- A promoted standby that never held the slot, and one whose history forked before what the
  target holds, are refused with a code, nothing written.
- A run reports whether the standby holds the slot.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
import pytest
from psycopg import IsolationLevel

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.replication.replication_report import ReplicationProgress, ReplicationReport
from tests.helpers import pg
from tests.helpers.standby import StandbyPair, standby_pair
from tests.replication.group import Group, ledger_state

ACCOUNTS, OPENING = 20, 1000
BANK = f"""
CREATE SCHEMA bank;
CREATE TABLE bank.accounts (id bigint PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE bank.moves (id bigint PRIMARY KEY, account_id bigint NOT NULL, amount bigint NOT NULL);
INSERT INTO bank.accounts SELECT g, {OPENING} FROM generate_series(1, {ACCOUNTS}) AS g;
"""
TABLES = ("bank.accounts", "bank.moves")
SLOT = "dpone_failover"

BALANCES = """
SELECT a.id, a.balance, coalesce(m.total, 0)::int8
FROM bank.accounts AS a
LEFT JOIN (SELECT account_id, sum(amount) AS total FROM bank.moves GROUP BY account_id) AS m
    ON m.account_id = a.id
"""
"""Each account's balance beside the sum of its moves: ``balance = OPENING + total`` whenever a
reader sees each transaction (one move and its balance change) whole."""


def _move(conn: psycopg.Connection[Any], move_id: int, rng: random.Random) -> None:
    """One source transaction over both tables: a move and its account's new balance."""
    account, amount = rng.randint(1, ACCOUNTS), rng.randint(-50, 50)
    with conn.transaction():
        conn.execute(
            "INSERT INTO bank.moves (id, account_id, amount) VALUES (%s, %s, %s)",
            (move_id, account, amount),
        )
        conn.execute(
            "UPDATE bank.accounts SET balance = balance + %s WHERE id = %s", (amount, account)
        )


def _moves(dsn: str, first_id: int, count: int) -> None:
    """``count`` source transactions (:func:`_move`), ids from ``first_id`` on."""
    rng = random.Random(first_id)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(count):
            _move(conn, first_id + i, rng)


def _moving(group: Group) -> Callable[[], object]:
    """A step that moves the group's slot: a few source transactions (ids from 10,000,000 on),
    then a run that applies them and advances the slot."""
    ids = itertools.count(10_000_000, 5)

    def step() -> ReplicationReport:
        _moves(group.source, next(ids), 5)
        return group.run()

    return step


@dataclass
class Writers:
    """Threads that commit :func:`_move` transactions through ``dsn`` until stopped, and
    reconnect (through the multi-host DSN: to whichever server accepts writes) when their
    server goes away. A transaction whose commit was in flight then may or may not exist: its
    id is never used again, and only the source's final rows count."""

    dsn: str
    threads: int = 2
    committed: int = 0
    reconnects: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _running: list[threading.Thread] = field(default_factory=list)

    def _write(self, n: int) -> None:
        rng, move_id = random.Random(n), (n + 1) * 1_000_000_000
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                    while not self._stop.is_set():
                        move_id += 1  # before the transaction: an id is tried once
                        _move(conn, move_id, rng)
                        with self._lock:
                            self.committed += 1
                        self._stop.wait(0.002)  # a pace, not a wait: about 400 per second
            except psycopg.OperationalError:  # the server went away, or none accepts writes
                with self._lock:
                    self.reconnects += 1
                self._stop.wait(0.05)
            except BaseException as exc:  # reported by stop()
                self.errors.append(exc)
                return

    def start(self) -> Writers:
        """Starts the threads."""
        for n in range(self.threads):
            thread = threading.Thread(target=self._write, args=(n,), daemon=True)
            thread.start()
            self._running.append(thread)
        return self

    def stop(self) -> None:
        """Stops the threads; fails on any error other than a lost connection."""
        self._stop.set()
        for thread in self._running:
            thread.join(30)
        assert not self.errors, f"a writer failed: {self.errors[0]!r}"


@contextmanager
def sampled(target: str) -> Iterator[list[int]]:
    """A reader of the target for the block: every ~20 ms, in a ``REPEATABLE READ``
    transaction, it checks each account's balance against its moves; yields the list of
    samples taken, and fails when the block ends if one sample saw a transaction in part."""
    samples: list[int] = []
    broken: list[str] = []
    done = threading.Event()

    def read() -> None:
        try:
            with psycopg.connect(target, autocommit=False) as conn:
                conn.isolation_level = IsolationLevel.REPEATABLE_READ
                conn.read_only = True
                while not done.wait(0.02):
                    with conn.transaction():
                        rows = conn.execute(BALANCES).fetchall()
                    bad = [r for r in rows if r[1] != OPENING + r[2]]
                    if len(rows) != ACCOUNTS or bad:
                        broken.append(f"sample {len(samples)}: {len(rows)} accounts, {bad}")
                    samples.append(len(rows))
        except BaseException as exc:
            broken.append(f"the reader failed: {exc!r}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield samples
    finally:
        done.set()
        reader.join(30)
    assert not broken, broken[:5]
    assert samples, "the reader took no sample"


def _target_state(group: Group) -> tuple[list[list[str]], list[tuple[object, ...]]]:
    """Every target table's rows and the group's ledger row: what a refused run must leave."""
    rows = [group.rows(group.target, table) for table in group.tables]
    ledger = pg.fetch_all(
        group.target, "SELECT * FROM dpone_ledger.replication_groups WHERE slot = %s", (SLOT,)
    )
    return rows, ledger


def _assert_refused(pair: StandbyPair, group: Group, code: str) -> None:
    """A run of ``group`` against the promoted standby (through the multi-host DSN) fails with
    ``code``, and the target's rows and ledger row are as they were."""
    before = _target_state(group)
    after = replace(group, source=pair.multi_host_dsn("source"))
    with pytest.raises(DponeError) as raised:
        after.run()
    assert raised.value.code == code, raised.value
    assert _target_state(group) == before


def _kill_at(
    pair: StandbyPair, phase: str
) -> tuple[Callable[[ReplicationProgress], None], threading.Event]:
    """An ``on_progress`` that kills the primary the first time the run reaches ``phase``
    (``committed``: one that committed at least one source transaction), and the event set
    once it did."""
    killed = threading.Event()
    lock = threading.Lock()
    last = [0]

    def on_progress(progress: ReplicationProgress) -> None:
        with lock:
            grew = progress.transactions > last[0]
            if progress.phase == "committed":
                last[0] = progress.transactions
            if killed.is_set() or progress.phase != phase:
                return
            if phase == "committed" and not grew:
                return
            pair.kill_primary()
            killed.set()

    return on_progress, killed


def _kill_during_a_run(pair: StandbyPair, group: Group, phase: str) -> BaseException | None:
    """Runs ``group`` until one run has killed the primary at ``phase``; that run's failure."""
    on_progress, killed = _kill_at(pair, phase)
    for _ in range(20):
        try:
            group.run(on_progress=on_progress)
        except Exception as exc:
            if not killed.is_set():
                raise AssertionError(f"a run failed before the kill: {exc!r}") from exc
            return exc
        if killed.is_set():
            return None
    raise AssertionError(f"no run reached {phase!r} in 20 runs")


@pytest.mark.parametrize("moment", ["apply", "committed"])
def test_a_failover_under_live_writers_loses_and_doubles_nothing(
    moment: str, target_dsn: str
) -> None:
    """Live writers on the primary, runs of the group, the primary stopped with ``-m
    immediate`` at ``moment`` of a run (``apply``: mid-apply; ``committed``: after a target
    commit, before the slot's advance), the standby promoted, writers and runs going on through
    a multi-host DSN: every sample of the target sees each transaction whole, the target ends
    equal to the new primary, and the ledger counts each of its transactions once (after a kill
    past a commit, transactions re-read from the synchronized copy are skipped)."""
    with standby_pair() as pair:
        src = pair.primary_dsn("source")
        pg.execute(src, BANK)
        group = Group(src, target_dsn, TABLES, slot=SLOT, publication=SLOT)
        assert group.run().initial_copy is not None
        baseline = ledger_state(target_dsn)[1]
        writers = Writers(pair.multi_host_dsn("source"))
        with sampled(target_dsn) as samples:
            writers.start()
            try:
                pair.wait_synced(SLOT, advance=group.run)
                _kill_during_a_run(pair, group, moment)
                pair.promote()
                after = replace(group, source=pair.multi_host_dsn("source"))
                skipped, committed = 0, writers.committed
                deadline = time.monotonic() + 30
                while writers.committed < committed + 300:  # writers go on on the new primary
                    assert time.monotonic() < deadline, "the writers did not resume in 30 s"
                    skipped += after.run().skipped_transactions
            finally:
                writers.stop()
            report = after.run()
            skipped += report.skipped_transactions
            while report.budget_reached:
                report = after.run()
        assert len(samples) > 10
        assert writers.reconnects > 0
        after.assert_equal()
        moves = int(
            str(pg.fetch_one(pair.standby_dsn("source"), "SELECT count(*) FROM bank.moves"))
        )
        assert ledger_state(target_dsn) == ("streaming", baseline + moves)
        if moment == "committed":
            # The kill came after a target commit and before that commit's slot advance: the
            # primary's slot, and so the standby's copy, was behind what the target held.
            assert skipped >= 1


def test_a_standby_that_never_held_the_slot_is_refused_with_a_code(target_dsn: str) -> None:
    """A standby without slot sync, promoted after the primary is killed: the run against it
    fails with ``replication_failover_slot_missing``, the target's rows and ledger row as they
    were."""
    with standby_pair(sync_slots=False) as pair:
        src = pair.primary_dsn("source")
        pg.execute(src, BANK)
        group = Group(src, target_dsn, TABLES, slot=SLOT, publication=SLOT)
        group.run()
        _moves(src, 1, 50)
        assert group.run().transactions == 50
        pair.kill_primary()
        pair.promote()
        _moves(pair.standby_dsn("source"), 1000, 10)
        _assert_refused(pair, group, "replication_failover_slot_missing")


def test_a_standby_behind_what_the_target_holds_is_refused_with_a_code(target_dsn: str) -> None:
    """Without ``synchronized_standby_slots``, the target applies transactions the stopped
    standby never received; the primary is killed and the standby promoted: its history forked
    before what the target holds, and the run fails with ``replication_source_diverged``,
    nothing written."""
    with standby_pair(synchronized=False) as pair:
        src = pair.primary_dsn("source")
        pg.execute(src, BANK)
        group = Group(src, target_dsn, TABLES, slot=SLOT, publication=SLOT)
        group.run()
        pair.wait_synced(SLOT, advance=_moving(group))
        pair.stop_standby()
        _moves(src, 1, 50)
        assert group.run().transactions == 50  # the target holds what the standby never got
        pair.kill_primary()
        pair.start_standby()
        pair.promote()
        _assert_refused(pair, group, "replication_source_diverged")


def _report_with_standby(pair: StandbyPair, target: str, *, hold: bool) -> ReplicationReport:
    """The report of a run of a fresh group on ``pair``'s primary that reads the standby's copy
    of the slot, after waiting (``hold``) until the standby holds it."""
    src = pair.primary_dsn("source")
    pg.execute(src, BANK)
    group = Group(src, target, TABLES, slot=SLOT, publication=SLOT)
    group.run()
    _moves(src, 1, 20)
    group.run()
    if hold:
        pair.wait_synced(SLOT, advance=_moving(group))
    else:
        pair.wait_replayed()  # the standby is caught up, and still has no copy
    return group.run(standby=pair.standby_dsn("source"))


def test_the_run_reports_whether_the_standby_holds_the_slot(
    target_dsn: str, make_database: Callable[..., str]
) -> None:
    """With ``standby=`` the report carries the standby's copy of the slot: held (synced,
    persistent, valid, its lag a number of bytes) once slot sync has kept it, not present on a
    standby without slot sync."""
    with standby_pair() as pair:
        report = _report_with_standby(pair, target_dsn, hold=True)
    assert report.slot.failover is True
    standby = report.standby
    assert standby is not None, "no standby in the report"
    assert standby.holds, standby
    assert (standby.in_recovery, standby.present, standby.synced, standby.persistent) == (
        True, True, True, True,
    ), standby  # fmt: skip
    assert standby.invalidation_reason is None
    assert isinstance(standby.lag_bytes, int) and standby.lag_bytes >= 0, standby

    with standby_pair(sync_slots=False) as pair:
        report = _report_with_standby(pair, make_database("dpone_tgt", pg.target_admin_dsn()),
                                      hold=False)  # fmt: skip
    assert report.slot.failover is True
    standby = report.standby
    assert standby is not None, "no standby in the report"
    assert standby.in_recovery, standby
    assert (standby.holds, standby.present) == (False, False), standby
