"""Every refusal of a source that cannot replicate, produced for real, with nothing half-created:
wal_level replica (the machine's PostgreSQL 15), a role without REPLICATION, no free slot, tables
the role does not own, a slot or publication of the group's name that is not the group's, a
table without a key; and a slot creation that fails after the publication was made."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from dpone_dagster import embedded
from dpone_dagster.core.errors import EngineError
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.publication import publication_tables
from dpone_dagster.replication.setup import (
    SetupState,
    check_replication_setup,
    create_replication,
)
from dpone_dagster.replication.slot import create_slot, slot_status
from tests.helpers import logical, pg
from tests.helpers.roles import as_role, role_with

SLOT = "dpone_setup_slot"
PUB = "dpone_setup_pub"
MARK = "dpone-dagster replication group dpone_setup_slot"
TABLES = (TableName("public", "orders"), TableName("public", "lines"))
SCHEMA = [
    "CREATE TABLE orders (id int PRIMARY KEY, total numeric)",
    "CREATE TABLE lines (order_id int, n int, PRIMARY KEY (order_id, n))",
]


def prepared(dsn: str) -> str:
    for statement in SCHEMA:
        pg.execute(dsn, statement)
    return dsn


@pytest.fixture
def source(logical_source_dsn: str) -> str:
    return prepared(logical_source_dsn)


def check(dsn: str, tables: tuple[TableName, ...] = TABLES) -> SetupState:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return check_replication_setup(
            conn, slot=SLOT, publication=PUB, tables=tables, owner_comment=MARK
        )


def create(dsn: str, tables: tuple[TableName, ...] = TABLES) -> None:
    with create_replication(
        dsn, slot=SLOT, publication=PUB, tables=tables, owner_comment=MARK
    ) as created:
        assert created.consistent_point > 0


def refused(code: str, attempt: Callable[[], object]) -> EngineError:
    with pytest.raises(EngineError) as caught:
        attempt()
    assert caught.value.code == code, caught.value
    assert caught.value.next_actions
    return caught.value


def nothing_created(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert slot_status(conn, SLOT) is None
        assert publication_tables(conn, PUB) is None


def test_a_server_without_wal_level_logical_is_refused_naming_the_setting(
    make_database: Callable[..., str],
) -> None:
    server = pg.server_where(lambda d: logical.wal_level(d) != "logical", "at wal_level replica")
    dsn = prepared(make_database("dpone_repl_replica", server))
    for attempt in (lambda: check(dsn), lambda: create(dsn)):
        error = refused("replication_wal_level", attempt)
        assert "wal_level = replica" in error.message
        assert "ALTER SYSTEM SET wal_level = logical" in error.next_actions[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert publication_tables(conn, PUB) is None


def test_a_role_without_replication_is_refused(source: str) -> None:
    grants = {
        source: [
            "GRANT CONNECT, CREATE ON DATABASE {db} TO {role}",
            "GRANT USAGE ON SCHEMA public TO {role}",
            "ALTER TABLE orders OWNER TO {role}",
            "ALTER TABLE lines OWNER TO {role}",
        ]
    }
    with role_with(grants) as role:
        dsn = as_role(source, role)
        for attempt in (lambda: check(dsn), lambda: create(dsn)):
            error = refused("replication_privilege_missing", attempt)
            assert f"ALTER ROLE {role} WITH REPLICATION" in error.message
            assert "rds_replication" in error.next_actions[0]
        nothing_created(source)
        # With the attribute, the same role may.
        pg.execute(source, f"ALTER ROLE {role} WITH REPLICATION")
        create(dsn)
        assert check(dsn) == SetupState(True, True, tuple(sorted(TABLES)))


@pytest.fixture(scope="module")
def private_logical_server() -> Iterator[str]:
    """A logical server of its own (an embedded cluster in a scratch folder, stopped and
    removed afterwards), whose slots a test may all take without starving another test's or
    the demo's replication on the shared one."""
    scratch = Path(tempfile.mkdtemp(prefix="dpone-embedded-"))
    folder = scratch / "pg"
    try:
        yield embedded.start(folder).dsn()
    finally:
        if folder.exists():
            embedded.stop(folder)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def no_free_slot(private_logical_server: str) -> Iterator[tuple[str, int]]:
    """A fresh source database on :func:`private_logical_server`, every free replication slot
    of which is taken by a throwaway physical slot (dropped again when the test ends); yields
    the database's DSN and ``max_replication_slots``."""
    dsn = prepared(pg.create_database("dpone_repl_full", private_logical_server))
    fillers: list[str] = []
    with psycopg.connect(private_logical_server, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_replication_slots')::int,"
            " (SELECT count(*) FROM pg_replication_slots)::int"
        ).fetchone()
        assert row is not None
        most, used = row
        try:
            for _ in range(most - used):
                name = f"dpone_filler_{uuid.uuid4().hex[:10]}"
                conn.execute("SELECT pg_create_physical_replication_slot(%s)", (name,))
                fillers.append(name)
            yield dsn, most
        finally:
            for name in fillers:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            logical.drop_logical_database(dsn)


def test_no_free_slot_is_refused_naming_max_replication_slots(
    no_free_slot: tuple[str, int],
) -> None:
    source, most = no_free_slot
    error = refused("replication_slots_exhausted", lambda: check(source))
    assert f"max_replication_slots = {most}" in error.message
    refused("replication_slots_exhausted", lambda: create(source))

    def server_refuses() -> None:  # the server's own refusal, past the check, has the code too
        with create_slot(source, SLOT):
            pass

    refused("replication_slots_exhausted", server_refuses)
    nothing_created(source)


def test_tables_the_role_does_not_own_refuse_the_publication(source: str) -> None:
    grants = {
        source: [
            "ALTER ROLE {role} WITH REPLICATION",
            "GRANT CONNECT, CREATE ON DATABASE {db} TO {role}",
            "GRANT USAGE ON SCHEMA public TO {role}",
            "GRANT SELECT ON orders, lines TO {role}",
            "ALTER TABLE lines OWNER TO {role}",
        ]
    }
    with role_with(grants) as role:
        dsn = as_role(source, role)
        for attempt in (lambda: check(dsn), lambda: create(dsn)):
            error = refused("publication_not_permitted", attempt)
            assert "orders (owned by postgres)" in error.message
            assert "lines" not in error.message.split("does not own")[1].split(":")[0]
            assert f"CREATE PUBLICATION {PUB} FOR TABLE" in error.message
        nothing_created(source)
        # Once the owner made the publication (with the group's mark), the role may replicate.
        pg.execute(source, f"CREATE PUBLICATION {PUB} FOR TABLE orders, lines")
        pg.execute(source, f"COMMENT ON PUBLICATION {PUB} IS '{MARK}'")
        create(dsn)
        assert check(dsn).slot_exists


def test_a_slot_or_publication_that_is_not_the_groups_is_refused_and_left_alone(
    source: str, make_logical_database: Callable[[str], str]
) -> None:
    # A slot of the name with another plugin.
    pg.execute(source, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'test_decoding')")
    error = refused("replication_slot_foreign", lambda: check(source))
    assert "test_decoding" in error.message
    refused("replication_slot_foreign", lambda: create(source))
    pg.execute(source, f"SELECT pg_drop_replication_slot('{SLOT}')")
    # A pgoutput slot of the name, but no publication of the group: not made by dpone.
    pg.execute(source, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    error = refused("replication_slot_foreign", lambda: check(source))
    assert "does not exist" in error.message
    pg.execute(source, f"SELECT pg_drop_replication_slot('{SLOT}')")
    # A slot of the name that decodes another database.
    other = make_logical_database("dpone_repl_other")
    pg.execute(other, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    error = refused("replication_slot_foreign", lambda: check(source))
    assert "decodes database" in error.message
    pg.execute(other, f"SELECT pg_drop_replication_slot('{SLOT}')")
    # A publication of the name made by someone else.
    pg.execute(source, f"CREATE PUBLICATION {PUB} FOR TABLE orders")
    error = refused("replication_slot_foreign", lambda: check(source))
    assert "not made by dpone" in error.message
    refused("replication_slot_foreign", lambda: create(source))
    with psycopg.connect(source, autocommit=True) as conn:
        assert slot_status(conn, SLOT) is None
        assert publication_tables(conn, PUB) == [TableName("public", "orders")]  # untouched


def test_a_table_without_key_or_full_identity_is_refused_and_full_identity_is_accepted(
    source: str,
) -> None:
    pg.execute(source, "CREATE TABLE keyless (n int, v text)")
    tables = (*TABLES, TableName("public", "keyless"))
    error = refused("replica_identity_missing", lambda: check(source, tables))
    assert "keyless" in error.message and "orders" not in error.message
    refused("replica_identity_missing", lambda: create(source, tables))
    nothing_created(source)
    pg.execute(source, "ALTER TABLE keyless REPLICA IDENTITY FULL")
    assert check(source, tables) == SetupState(False, False, ())
    with pytest.raises(DponeError) as caught:
        check(source, (*TABLES, TableName("public", "missing")))
    assert caught.value.code == "table_not_found"


def test_a_failure_after_the_publication_was_made_leaves_nothing_behind(source: str) -> None:
    # A failure inside the block (the initial copy failing, say): slot and publication go.
    with (
        pytest.raises(RuntimeError, match="copy failed"),
        create_replication(source, slot=SLOT, publication=PUB, tables=TABLES, owner_comment=MARK),
    ):
        with psycopg.connect(source, autocommit=True) as conn:
            assert slot_status(conn, SLOT) is not None
            assert publication_tables(conn, PUB) is not None
        raise RuntimeError("copy failed")
    nothing_created(source)
    # The slot's creation itself failing, after the publication was made: the replication
    # session is ended while the slot waits for a running transaction to finish.
    failures: list[BaseException] = []

    def creating() -> None:
        try:
            create(source)
        except BaseException as exc:
            failures.append(exc)

    dbname = psycopg.conninfo.conninfo_to_dict(source)["dbname"]
    with psycopg.connect(source) as blocker:
        blocker.execute("SELECT pg_current_xact_id()")  # a running transaction with an xid
        thread = threading.Thread(target=creating)
        thread.start()

        def walsender() -> list[tuple[object, ...]]:
            return pg.fetch_all(
                source,
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'"
                " AND datname = %s AND wait_event IS NOT NULL",
                (dbname,),
            )

        pids = pg.wait_until(walsender, timeout=30, what="the slot waits for the transaction")
        with psycopg.connect(source, autocommit=True) as conn:
            assert publication_tables(conn, PUB) is not None  # made before the slot
        pg.terminate([int(p[0]) for p in pids], source)  # type: ignore[call-overload]
        thread.join(30)
        blocker.rollback()
    assert failures and not isinstance(failures[0], AssertionError), failures
    nothing_created(source)
    create(source)  # and the next attempt makes both
    assert check(source).slot_exists


def test_a_replica_identity_index_other_than_the_key_is_refused(source: str) -> None:
    # Under REPLICA IDENTITY USING INDEX of another unique index, a delete comes with that
    # index's columns, not the primary key's: the rows could not be named by key.
    pg.execute(source, "CREATE TABLE coded (id int PRIMARY KEY, code text NOT NULL UNIQUE)")
    pg.execute(source, "ALTER TABLE coded REPLICA IDENTITY USING INDEX coded_code_key")
    tables = (*TABLES, TableName("public", "coded"))
    error = refused("replica_identity_missing", lambda: check(source, tables))
    assert "coded" in error.message and "orders" not in error.message
    refused("replica_identity_missing", lambda: create(source, tables))
    nothing_created(source)
    # The primary key's own index as the identity is the key: accepted.
    pg.execute(source, "ALTER TABLE coded REPLICA IDENTITY USING INDEX coded_pkey")
    assert check(source, tables) == SetupState(False, False, ())


def test_the_slot_is_a_failover_slot_where_the_source_supports_it_and_true_is_refused_before_17(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """``failover=None`` makes a failover slot on PostgreSQL 17+ and a plain one before;
    ``failover=True`` on an older source is refused with its code before anything is created
    (no ledger row, slot or publication); a plain slot (``failover=False``) becomes a failover
    slot at the next run that asks for one."""
    from tests.replication.group import Group, ledger_state

    src = versioned_source_dsn
    pg.execute(src, "CREATE TABLE orders (id int PRIMARY KEY, total numeric)")
    pg.execute(src, "INSERT INTO orders SELECT g, g FROM generate_series(1, 10) g")
    group = Group(src, target_dsn, ("public.orders",), slot="dpone_fo", publication="dpone_fo")
    modern = int(str(pg.fetch_one(src, "SHOW server_version_num"))) >= 170000
    if not modern:
        with pytest.raises(DponeError) as caught:
            group.run(failover=True)
        assert caught.value.code == "replication_failover_unsupported"
        assert "PostgreSQL 15" in caught.value.message
        assert ledger_state(target_dsn) == (None, 0)
        here = "SELECT 1 FROM pg_replication_slots WHERE database = current_database()"
        assert not pg.fetch_all(src, here)
        assert not pg.fetch_all(src, "SELECT 1 FROM pg_publication")
        report = group.run()
        assert report.slot.failover is None  # the column does not exist before 17
        return
    plain = group.run(failover=False)
    assert plain.slot.failover is False
    pg.execute(src, "INSERT INTO orders VALUES (11, 11)")
    report = group.run()
    assert report.slot.failover is True and report.transactions == 1
    slots = pg.fetch_all(src, "SELECT slot_name::text, failover FROM pg_replication_slots"
                         " WHERE database = current_database()")  # fmt: skip
    assert slots == [("dpone_fo", True)]
    group.assert_equal()


def test_a_standby_slot_the_source_lacks_fails_the_run_instead_of_waiting_forever(
    target_dsn: str,
) -> None:
    """A source whose ``synchronized_standby_slots`` names a physical slot it does not have (a
    promoted standby keeps its old primary's setting) would make a failover slot's read wait
    forever: the run fails at once with ``replication_standby_slot_missing``, nothing written,
    and goes on once the setting names what exists (a private server: the setting is the
    whole server's)."""
    from tests.helpers.private_server import private_server
    from tests.replication.group import Group, ledger_state

    with private_server("dpone_sss_") as admin:
        src = pg.create_database("dpone_sss_src", admin)
        pg.execute(src, "CREATE TABLE orders (id int PRIMARY KEY, total numeric)")
        group = Group(src, target_dsn, ("public.orders",), slot="dpone_sss", publication="sss")
        group.run()
        _standby_slots(admin, src, "gone_standby")
        pg.execute(src, "INSERT INTO orders VALUES (1, 1)")
        before = ledger_state(target_dsn)
        with pytest.raises(DponeError) as caught:
            group.run()
        assert caught.value.code == "replication_standby_slot_missing"
        assert "gone_standby" in caught.value.message
        assert ledger_state(target_dsn) == before
        assert pg.fetch_all(target_dsn, "SELECT * FROM public.orders") == []
        _standby_slots(admin, src, "")
        assert group.run().transactions == 1
        group.assert_equal()


def _standby_slots(admin: str, src: str, value: str) -> None:
    """Sets the server's ``synchronized_standby_slots`` (reset when empty) and waits until a new
    session of ``src`` sees it."""
    if value:
        pg.execute(admin, f"ALTER SYSTEM SET synchronized_standby_slots = '{value}'")
    else:
        pg.execute(admin, "ALTER SYSTEM RESET synchronized_standby_slots")
    pg.execute(admin, "SELECT pg_reload_conf()")
    pg.wait_until(
        lambda: pg.fetch_one(src, "SHOW synchronized_standby_slots") == value,
        timeout=10, what="the setting reloaded",
    )  # fmt: skip
