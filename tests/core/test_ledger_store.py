"""The one ledger store against a real server: every engine's tables from one migration path, an
earlier release's ledger brought up to date without losing a row, a current ledger that runs no
DDL (so a role without CREATE works), concurrent first runs, and the compare-and-swap wall."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import IsolationLevel, sql
from psycopg.types.json import Jsonb

from dpone_dagster.core import LEDGER_VERSION, LedgerStore
from dpone_dagster.core.ledger_schema import ledger_version
from dpone_dagster.core.sessions import transaction
from tests.helpers import pg

TABLES = {
    "backfill_runs", "backfill_batch_receipts", "backfill_range_checks",
    "incremental_streams", "incremental_batch_receipts", "kafka_offsets", "incremental_sweeps",
    "replication_groups", "replication_sweeps", "replication_keys", "ledger_version",
}  # fmt: skip

# The backfill's tables as the release before the shared ledger created them (no version table).
EARLIER_RELEASE = """
CREATE SCHEMA dpone_ledger;
CREATE TABLE dpone_ledger.backfill_runs (
    run_id text PRIMARY KEY, revision bigint NOT NULL CHECK (revision >= 1),
    run_digest text NOT NULL, status text NOT NULL, run_json jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
INSERT INTO dpone_ledger.backfill_runs (run_id, revision, run_digest, status, run_json)
VALUES ('backfill:old', 3, 'd', 'succeeded', '{"kept": true}');
"""


def _tables(dsn: str, schema: str = "dpone_ledger") -> set[str]:
    rows = pg.fetch_all(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    return {str(r[0]) for r in rows}


def _session(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(dsn, autocommit=True)


def test_a_new_ledger_holds_every_engines_tables_at_the_current_version(target_dsn: str) -> None:
    store = LedgerStore()
    with _session(target_dsn) as conn:
        assert ledger_version(conn, store.tables) == 0
        store.ensure(conn)
        assert ledger_version(conn, store.tables) == LEDGER_VERSION
    assert _tables(target_dsn) == TABLES


def test_an_earlier_releases_ledger_is_brought_up_to_date_and_keeps_its_rows(
    target_dsn: str,
) -> None:
    pg.execute(target_dsn, EARLIER_RELEASE)
    with _session(target_dsn) as conn:
        assert ledger_version(conn, LedgerStore().tables) == 0
        LedgerStore().ensure(conn)
        stored = LedgerStore().runs.fetch(conn, "backfill:old")
    assert _tables(target_dsn) == TABLES
    assert stored is not None and (stored.revision, stored.document) == (3, {"kept": True})


@pytest.fixture
def least_role(target_dsn: str) -> Iterator[str]:
    """A login role with USAGE on the ledger schema and rights on its tables only: no CREATE on
    the database or the schema. Dropped at the end."""
    role = f"dpone_least_{uuid.uuid4().hex[:10]}"
    pg.execute(target_dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        pg.execute(target_dsn, sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        pg.execute(target_dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_current_ledger_runs_no_ddl_so_a_role_without_create_works(
    target_dsn: str, least_role: str
) -> None:
    with _session(target_dsn) as conn:
        LedgerStore().ensure(conn)
    role = sql.Identifier(least_role)
    pg.execute(target_dsn, sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(
        sql.Identifier(str(pg.fetch_one(target_dsn, "SELECT current_database()")))))  # fmt: skip
    pg.execute(target_dsn, sql.SQL("GRANT USAGE ON SCHEMA dpone_ledger TO {}").format(role))
    grant = "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA dpone_ledger TO {}"
    pg.execute(target_dsn, sql.SQL(grant).format(role))
    as_role = psycopg.conninfo.make_conninfo(target_dsn, user=least_role)
    with _session(as_role) as conn:
        LedgerStore().ensure(conn)  # one read; a CREATE would be refused
        store = LedgerStore()
        with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
            assert store.streams.insert(conn, "incremental:x", 1, Jsonb({"stream_id": "x"}))
    with _session(as_role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE SCHEMA dpone_probe")  # the role really has no CREATE


def test_processes_that_start_at_once_create_the_ledger_once(target_dsn: str) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def first_run() -> None:
        try:
            with _session(target_dsn) as conn:
                start.wait()
                LedgerStore().ensure(conn)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=first_run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _tables(target_dsn) == TABLES
    # Each migration applied once, in order.
    assert pg.fetch_all(
        target_dsn, "SELECT version FROM dpone_ledger.ledger_version ORDER BY 1"
    ) == [(v,) for v in range(1, LEDGER_VERSION + 1)]


def test_a_document_moves_only_from_the_revision_it_was_read_at(target_dsn: str) -> None:
    store = LedgerStore("Ledger Ö")  # any legal identifier
    with _session(target_dsn) as conn:
        store.ensure(conn)
        with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
            assert store.streams.insert(conn, "s", 1, Jsonb({"n": 1}))
            assert not store.streams.insert(conn, "s", 1, Jsonb({"n": 99}))  # exists: kept
            assert store.streams.swap(conn, "s", 1, 2, Jsonb({"n": 2}))
            assert not store.streams.swap(conn, "s", 1, 3, Jsonb({"n": 3}))  # stale
        stored = store.streams.fetch(conn, "s")
    assert stored is not None and (stored.revision, stored.document) == (2, {"n": 2})
    assert _tables(target_dsn, "Ledger Ö") == TABLES
