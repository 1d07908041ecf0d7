"""The slot and the publication as operational objects, on a real server with wal_level logical:
the slot's state and lag, its exported snapshot meeting its changes, an advance that never goes
backwards, a publication kept exactly to the group's tables, and a drop that is idempotent and
leaves a slot another session uses alone."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from dpone_dagster.core.errors import EngineError
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication import Commit, Insert, lsn_text
from dpone_dagster.replication.publication import (
    PublicationChange,
    ensure_publication,
    publication_tables,
)
from dpone_dagster.replication.reader import read_changes
from dpone_dagster.replication.slot import (
    Dropped,
    advance_slot,
    create_slot,
    current_lsn,
    drop_replication,
    slot_status,
)
from tests.helpers import logical, pg

SLOT = "dpone_slot_test"
PUB = "dpone_pub_test"

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def source(logical_source_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(logical_source_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        yield conn


def inserted(conn: Conn) -> list[bytes | None]:
    """The ids of the rows the slot's pending changes insert."""
    return [
        m.new[0]  # type: ignore[misc]
        for _, m in read_changes(
            conn, slot=SLOT, publication=PUB, upto_lsn=current_lsn(conn), max_changes=None
        )
        if isinstance(m, Insert)
    ]


def test_the_exported_snapshot_is_exactly_the_slots_start(
    source: Conn, logical_source_dsn: str
) -> None:
    ensure_publication(source, PUB, [TableName("public", "t")])
    source.execute("INSERT INTO t VALUES (1, 'before')")
    with create_slot(logical_source_dsn, SLOT) as created:
        assert re.fullmatch(r"[0-9A-F]+-[0-9A-F]+-[0-9]+", created.snapshot)
        source.execute("INSERT INTO t VALUES (2, 'after')")
        with psycopg.connect(logical_source_dsn) as reader:
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{created.snapshot}'")
            seen = reader.execute("SELECT id FROM t ORDER BY id").fetchall()
        status = slot_status(source, SLOT)
        assert status is not None and status.confirmed_flush_lsn == created.consistent_point
    assert seen == [(1,)]  # the snapshot holds what committed before the slot's start ...
    assert inserted(source) == [b"2"]  # ... and the slot every change after it


def test_the_status_reads_positions_wal_status_and_lag(
    source: Conn, logical_source_dsn: str
) -> None:
    assert slot_status(source, SLOT) is None
    ensure_publication(source, PUB, [TableName("public", "t")])
    with create_slot(logical_source_dsn, SLOT):
        pass
    before = slot_status(source, SLOT)
    assert before is not None
    assert (before.slot, before.plugin, before.active, before.active_pid) == (
        SLOT, "pgoutput", False, None
    )  # fmt: skip
    assert before.database == source.info.dbname
    assert before.wal_status == "reserved"
    keep = pg.fetch_one(pg.with_db(pg.server_admin(logical_source_dsn), "postgres"),
                        "SHOW max_slot_wal_keep_size")  # fmt: skip
    assert (before.safe_wal_size is None) == (keep == "-1")
    source.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
    after = slot_status(source, SLOT)
    assert after is not None
    assert after.confirmed_flush_lsn == before.confirmed_flush_lsn
    assert after.lag_bytes == after.current_lsn - after.confirmed_flush_lsn > 100_000
    assert after.retained_bytes == after.current_lsn - after.restart_lsn >= after.lag_bytes
    assert after.current_lsn <= current_lsn(source)


def test_an_advance_never_moves_the_slot_backwards(source: Conn, logical_source_dsn: str) -> None:
    ensure_publication(source, PUB, [TableName("public", "t")])
    with create_slot(logical_source_dsn, SLOT):
        pass
    for i in (1, 2, 3):
        source.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
    commits = [
        m
        for _, m in read_changes(
            source, slot=SLOT, publication=PUB, upto_lsn=current_lsn(source), max_changes=None
        )
        if isinstance(m, Commit)
    ]
    # Confirmed at a transaction's own commit LSN, it is read again; at its end, it is not.
    assert advance_slot(source, SLOT, commits[0].commit_lsn) == commits[0].commit_lsn
    assert inserted(source) == [b"1", b"2", b"3"]
    assert advance_slot(source, SLOT, commits[1].end_lsn) == commits[1].end_lsn
    assert inserted(source) == [b"3"]
    # An older position is a no-op: the slot stays where it is.
    assert advance_slot(source, SLOT, commits[0].end_lsn) == commits[1].end_lsn
    status = slot_status(source, SLOT)
    assert status is not None and status.confirmed_flush_lsn == commits[1].end_lsn
    assert inserted(source) == [b"3"]
    with pytest.raises(EngineError) as caught:
        advance_slot(source, "no_such_slot", commits[1].end_lsn)
    assert caught.value.code == "replication_slot_missing"
    assert lsn_text(commits[1].end_lsn) in str(pg.fetch_one(
        pg.with_db(pg.server_admin(source.info.dsn), source.info.dbname),
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (SLOT,),
    ))  # fmt: skip


def test_the_publication_is_kept_to_exactly_the_groups_tables(source: Conn) -> None:
    source.execute('CREATE SCHEMA "Odd Schema"')
    source.execute('CREATE TABLE "Odd Schema"."Odd, Name" (id int PRIMARY KEY)')
    source.execute("CREATE TABLE u (id int PRIMARY KEY)")
    t, u, odd = (
        TableName("public", "t"),
        TableName("public", "u"),
        TableName("Odd Schema", "Odd, Name"),
    )
    pub = 'Pub "quoted"'
    assert publication_tables(source, pub) is None
    assert ensure_publication(source, pub, [t, u], comment="dpone test") == PublicationChange(
        True, (t, u), ()
    )
    comment = source.execute(
        "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
        (pub,),
    ).fetchone()
    assert comment == ("dpone test",)
    change = ensure_publication(source, pub, [u, odd])
    assert change == PublicationChange(False, (odd,), (t,)) and change.changed
    assert sorted(publication_tables(source, pub) or []) == sorted([u, odd])
    assert not ensure_publication(source, pub, [odd, u]).changed
    with pytest.raises(ValueError, match="at least one table"):
        ensure_publication(source, pub, [])


def test_drop_is_idempotent_and_leaves_a_slot_in_use_or_foreign_alone(
    source: Conn, logical_source_dsn: str
) -> None:
    ensure_publication(source, PUB, [TableName("public", "t")])
    with create_slot(logical_source_dsn, SLOT):
        pass
    consumer = logical.hold_slot(logical_source_dsn, SLOT, PUB)
    try:
        status = pg.wait_until(
            lambda: (s := slot_status(source, SLOT)) is not None and s.active and s,
            timeout=30,
            what="the consumer holds the slot",
        )
        with pytest.raises(EngineError) as caught:
            drop_replication(source, slot=SLOT, publication=PUB)
        assert caught.value.code == "replication_slot_active"
        assert str(status.active_pid) in caught.value.message
        with pytest.raises(EngineError) as caught:
            list(
                read_changes(source, slot=SLOT, publication=PUB, upto_lsn=1 << 40, max_changes=None)
            )
        assert caught.value.code == "replication_slot_active"
        # Nothing was dropped.
        assert slot_status(source, SLOT) is not None
        assert publication_tables(source, PUB) == [TableName("public", "t")]
    finally:
        consumer.finish()
    pg.wait_until(
        lambda: not (s := slot_status(source, SLOT)) or not s.active,
        timeout=30,
        what="the consumer has let go of the slot",
    )
    assert drop_replication(source, slot=SLOT, publication=PUB) == Dropped(True, True)
    assert drop_replication(source, slot=SLOT, publication=PUB) == Dropped(False, False)
    assert slot_status(source, SLOT) is None and publication_tables(source, PUB) is None
    source.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (SLOT,))
    with pytest.raises(EngineError) as caught:
        drop_replication(source, slot=SLOT, publication=PUB)
    assert caught.value.code == "replication_slot_foreign"
    assert slot_status(source, SLOT) is not None


def test_a_lost_slot_is_reported_lost_and_reading_it_fails_with_a_code(
    source: Conn, logical_source_dsn: str
) -> None:
    ensure_publication(source, PUB, [TableName("public", "t")])
    with create_slot(logical_source_dsn, SLOT):
        pass
    source.execute("INSERT INTO t VALUES (1, 'x')")
    logical.lose_slot(logical_source_dsn, SLOT)
    status = slot_status(source, SLOT)
    assert status is not None and status.wal_status == "lost"
    with pytest.raises(EngineError) as caught:
        list(read_changes(source, slot=SLOT, publication=PUB, upto_lsn=1 << 40, max_changes=None))
    assert caught.value.code == "replication_slot_lost"
    assert "resync=True" in caught.value.next_actions[0]
    # A lost slot is still dropped by the one call.
    assert drop_replication(source, slot=SLOT, publication=PUB) == Dropped(True, True)
