"""A run meets its slot held by another session (another run of the group, or a killed run's
server process still decoding for its dead client): it waits, as long as a lock is waited for
(``ConnectionOptions.lock_wait``), then reads; past the wait it fails with
``replication_slot_active`` naming the holder's pid, and changes nothing. The holder here is a
real consumer on the replication protocol (``tests.helpers.logical.hold_slot``)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import ConnectionOptions
from tests.helpers import logical, pg
from tests.replication.group import Group, ledger_state

ORDERS = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text);
INSERT INTO shop.orders SELECT g, 'n' || g FROM generate_series(1, 100) g;
"""
SLOT, PUB = "dpone_held", "dpone_held_pub"


def _copied(src: str, target: str) -> Group:
    """The group of ``shop.orders``, its initial copy done."""
    pg.execute(src, ORDERS)
    group = Group(src, target, ("shop.orders",), slot=SLOT, publication=PUB)
    group.run()
    return group


def test_a_run_waits_for_a_slot_another_session_holds_then_applies(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src, group = logical_source_dsn, _copied(logical_source_dsn, target_dsn)
    pg.execute(src, "UPDATE shop.orders SET note = 'changed' WHERE id <= 5")
    consumer = logical.hold_slot(src, SLOT, PUB)
    logical.holder_pid(src, SLOT)
    name = f"dpone-held-{uuid.uuid4().hex[:8]}"
    released: list[float] = []

    def release() -> None:
        # The run is waiting: one of its sessions has read the slot's state while the
        # consumer holds it (its peek, which would fail at once, comes only after the wait).
        pg.wait_until(
            lambda: pg.fetch_one(
                src, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND query LIKE %s", (name, "%pg_replication_slots%"),
            ),
            timeout=60, what="the run reads the slot's state while it is held",
        )  # fmt: skip
        consumer.finish()
        released.append(time.monotonic())

    holder = threading.Thread(target=release)
    holder.start()
    try:
        report = group.run(
            connection_options=ConnectionOptions(application_name=name, lock_wait=60)
        )
        ended = time.monotonic()
    finally:
        holder.join()
    assert released and ended >= released[0]
    assert report.tables[0].updated == 5
    group.assert_equal()


def test_a_slot_held_past_the_wait_fails_the_run_naming_the_holder_and_changes_nothing(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src, group = logical_source_dsn, _copied(logical_source_dsn, target_dsn)
    before = ledger_state(target_dsn)
    pg.execute(src, "DELETE FROM shop.orders WHERE id <= 3")
    consumer = logical.hold_slot(src, SLOT, PUB)
    try:
        pid = logical.holder_pid(src, SLOT)
        started = time.monotonic()
        with pytest.raises(DponeError) as caught:
            group.run(connection_options=ConnectionOptions(lock_wait=1.5))
        waited = time.monotonic() - started
    finally:
        consumer.finish()
    assert caught.value.code == "replication_slot_active"
    assert str(pid) in caught.value.message
    assert waited >= 1.5  # it waited for the slot before it failed
    assert ledger_state(target_dsn) == before
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM shop.orders") == 100
    after = group.run()  # the holder gone, the next run applies what waited
    assert after.tables[0].deleted == 3
    group.assert_equal()
