"""Every server refusal of creating, altering or reading a group's publication and slot, produced
for real, carries a stable code whose next action works when followed: a joining table the role
does not own, a table dropped at the source, a publication dropped by hand or made by another
tool (on PostgreSQL 15 and 18, which differ), the publication statements' own refusals, and no
free WAL sender for the slot's snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import conninfo

from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.publication import ensure_publication, publication_tables
from dpone_dagster.replication.slot import drop_replication
from tests.helpers import pg
from tests.helpers.logical import OWN_SLOTS, drop_logical_database
from tests.helpers.roles import as_role, role_with
from tests.replication.group import Group
from tests.replication.test_setup import refused

SHOP = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text);
CREATE TABLE shop.lines (id bigint PRIMARY KEY, qty int);
CREATE TABLE shop.extra (id bigint PRIMARY KEY, v text);
INSERT INTO shop.orders SELECT g, 'o' FROM generate_series(1, 100) g;
INSERT INTO shop.lines SELECT g, 1 FROM generate_series(1, 100) g;
INSERT INTO shop.extra SELECT g, 'e' FROM generate_series(1, 100) g;
"""
ORDERS, LINES, EXTRA = (TableName("shop", n) for n in ("orders", "lines", "extra"))


def _role_grants(extra: list[str]) -> list[str]:
    return [
        "ALTER ROLE {role} WITH REPLICATION",
        "GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {db} TO {role}",
        "GRANT USAGE ON SCHEMA shop TO {role}",
        "ALTER TABLE shop.orders OWNER TO {role}",
        *extra,
    ]


def test_a_joining_table_the_role_does_not_own_is_refused_with_the_statement_that_works(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """``publication_not_permitted`` names the ``ALTER PUBLICATION`` to run, nothing changed;
    run by a superuser, the next run joins the table."""
    src = logical_source_dsn
    pg.execute(src, SHOP)
    with role_with({src: _role_grants(["GRANT SELECT ON shop.extra TO {role}"])}) as role:
        dsn = as_role(src, role)
        Group(dsn, target_dsn, ("shop.orders",)).run()
        wider = Group(dsn, target_dsn, ("shop.orders", "shop.extra"))
        error = refused("publication_not_permitted", wider.run)
        statement = "ALTER PUBLICATION dpone_test_pub ADD TABLE shop.extra"
        assert statement in error.message and "shop.extra (owned by postgres)" in error.message
        assert pg.fetch_all(src, "SELECT prrelid::regclass::text FROM pg_publication_rel") == [
            ("shop.orders",)
        ]
        pg.execute(src, statement)  # as the message says: a superuser runs it
        assert wider.run().tables_joined == (EXTRA,)
        wider.assert_equal()


def test_the_publication_statements_refused_by_the_server_carry_codes(
    logical_source_dsn: str,
) -> None:
    """Past the setup's checks, the server's own refusals: a table the role does not own, a
    table that does not exist, a publication another role owns (altered, then dropped)."""
    src = logical_source_dsn
    pg.execute(src, SHOP)
    with (
        role_with({src: _role_grants([])}) as role,
        psycopg.connect(as_role(src, role), autocommit=True) as conn,
    ):
        error = refused("publication_not_permitted",
                        lambda: ensure_publication(conn, "mine", [ORDERS, LINES]))  # fmt: skip
        assert "must be owner of table lines" in error.message
        assert (
            'CREATE PUBLICATION "mine" FOR TABLE "shop"."orders", "shop"."lines"'
            in (error.next_actions[0])
        )
        assert publication_tables(conn, "mine") is None
        gone = TableName("shop", "gone")
        refused("replication_table_dropped", lambda: ensure_publication(conn, "mine", [gone]))
        pg.execute(src, "CREATE PUBLICATION theirs FOR TABLE shop.lines")
        error = refused("publication_not_permitted",
                        lambda: ensure_publication(conn, "theirs", [ORDERS]))  # fmt: skip
        assert "must be owner of publication theirs" in error.message
        refused("publication_not_permitted",
                lambda: drop_replication(conn, slot="none", publication="theirs"))  # fmt: skip
        assert publication_tables(conn, "theirs") == [LINES]


def test_a_table_dropped_at_the_source_is_refused_until_it_leaves_the_group(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """``replication_table_dropped``, nothing applied; taken out of the group, the others go
    on and its target is kept."""
    src = logical_source_dsn
    pg.execute(src, SHOP)
    group = Group(src, target_dsn, ("shop.orders", "shop.lines"))
    group.run()
    kept = group.rows(target_dsn, "shop.lines")
    pg.execute(src, "UPDATE shop.orders SET note = 'after' WHERE id = 1; DROP TABLE shop.lines")
    error = refused("replication_table_dropped", group.run)
    assert "shop.lines" in error.message and "out of the group" in error.next_actions[0]
    assert pg.fetch_one(target_dsn, "SELECT note FROM shop.orders WHERE id = 1") == "o"
    smaller = Group(src, target_dsn, ("shop.orders",))  # the next action
    report = smaller.run()
    assert report.tables_removed == (LINES,) and report.tables[0].updated == 1
    smaller.assert_equal()
    assert group.rows(target_dsn, "shop.lines") == kept


@pytest.mark.cross_server
def test_a_publication_dropped_or_made_by_another_tool_is_refused_and_a_resync_heals(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """Dropped: ``replication_publication_missing``, nothing applied. Another tool's of the name:
    ``replication_slot_foreign``. One made again by hand with the group's mark, after changes
    it missed: PostgreSQL 15 cannot decode past the gap (the run fails with
    ``replication_publication_missing``), 16 and later skip it (each table's publication entry
    is new, so every table is copied again, alone). The resync makes the target whole."""
    src = versioned_source_dsn
    pg.execute(src, SHOP)
    group = Group(src, target_dsn, ("shop.orders", "shop.lines"))
    group.run()
    pg.execute(src, "DROP PUBLICATION dpone_test_pub")
    pg.execute(src, "UPDATE shop.orders SET note = 'in the gap' WHERE id = 1")
    error = refused("replication_publication_missing", group.run)
    assert "resync=True" in error.next_actions[0]
    pg.execute(src, "CREATE PUBLICATION dpone_test_pub FOR TABLE shop.orders")
    refused("replication_slot_foreign", group.run)
    pg.execute(src, "COMMENT ON PUBLICATION dpone_test_pub IS 'dpone replication group dpone_test';"
                    "ALTER PUBLICATION dpone_test_pub ADD TABLE shop.lines")  # fmt: skip
    pg.execute(src, "UPDATE shop.orders SET note = 'after the gap' WHERE id = 2")
    if pg.server_version(src) < 16:
        refused("replication_publication_missing", group.run)
    else:
        assert set(group.run().tables_joined) == {ORDERS, LINES}
        group.assert_equal()
    assert group.run(resync=True).initial_copy is not None
    pg.execute(src, "UPDATE shop.orders SET note = 'after the resync' WHERE id = 3")
    group.run()
    group.assert_equal()


@contextmanager
def _every_wal_sender_taken(dsn: str) -> Iterator[int]:
    """Replication connections holding every WAL sender of ``dsn``'s server free now (closed
    on leaving); yields ``max_wal_senders``."""
    most = int(str(pg.fetch_one(dsn, "SHOW max_wal_senders")))
    senders = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
    used = int(str(pg.fetch_one(dsn, senders)))
    held = []
    try:
        for _ in range(most - used):
            info = conninfo.make_conninfo(dsn, replication="database")
            conn = psycopg.pq.PGconn.connect(info.encode())
            assert conn.status == psycopg.pq.ConnStatus.OK, conn.get_error_message()
            held.append(conn)
        yield most
    finally:
        for conn in held:
            conn.finish()


def test_no_free_wal_sender_for_the_slots_snapshot_is_refused_with_a_code(
    pg15_logical_server: str, target_dsn: str
) -> None:
    """Every WAL sender taken by real replication connections: the first run fails with
    ``replication_senders_exhausted``, no slot or publication left; once one is free, it
    runs."""
    src = pg.create_database("dpone_repl_senders", pg15_logical_server)
    try:
        pg.execute(src, SHOP)
        group = Group(src, target_dsn, ("shop.orders",))
        with _every_wal_sender_taken(src) as most:
            error = refused("replication_senders_exhausted", group.run)
            assert f"max_wal_senders (currently {most})" in error.message
            assert "pg_stat_replication" in error.next_actions[0]
            assert pg.fetch_one(src, "SELECT count(*) FROM pg_publication") == 0
            assert pg.fetch_one(src, OWN_SLOTS) == 0
        senders = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
        pg.wait_until(
            lambda: pg.fetch_one(src, senders) == 0, timeout=30, what="the held senders ended"
        )
        group.run()  # once a sender is free, as the next action says
        group.assert_equal()
    finally:
        drop_logical_database(src)
