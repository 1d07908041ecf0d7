"""Snapshot sessions: open, export, import, refuse; against a real server."""

from __future__ import annotations

import pytest

from dpone_dagster.lifecycle import ExtractionLifecycleAuthority, token_digest
from dpone_dagster.postgres import SnapshotError, SnapshotSession
from dpone_dagster.postgres.snapshot import CURRENT_SNAPSHOT, EXPORTED_SNAPSHOT, POSTGRES_CLOCK
from tests.helpers import pg


def _count(session: SnapshotSession) -> int:
    row = session.conn.execute("SELECT count(*) FROM public.mixed").fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def test_a_session_reads_its_own_snapshot_token_and_server_time(source_dsn: str) -> None:
    session = SnapshotSession.open(source_dsn)
    try:
        row = session.conn.execute(
            "SELECT pg_current_snapshot()::text, current_setting('transaction_isolation'), "
            "current_setting('transaction_read_only'), clock_timestamp()"
        ).fetchone()
        assert row is not None
        assert session.evidence.token == row[0], "the token is the transaction's own snapshot"
        assert row[1:3] == ("repeatable read", "on")
        assert session.evidence.authority == CURRENT_SNAPSHOT
        assert session.evidence.clock_authority == POSTGRES_CLOCK
        assert session.evidence.acquired_at <= row[3]  # type: ignore[operator]
        authority = ExtractionLifecycleAuthority()
        authority.acquire(started_at=session.clock_timestamp(), clock_authority=POSTGRES_CLOCK)
        receipt = authority.acquire_snapshot(session.evidence)
        assert receipt.source_token == token_digest(str(row[0]))
        assert str(row[0]) not in receipt.model_dump_json()
    finally:
        session.commit_and_close()
    assert session.transaction.ended_with == "commit" and session.conn.closed


def test_workers_import_the_exported_snapshot_in_distinct_sessions(source_dsn: str) -> None:
    pg.create_mixed_table(source_dsn, rows=100)
    coordinator = SnapshotSession.open(source_dsn, export=True)
    try:
        pg.execute(source_dsn, "DELETE FROM public.mixed WHERE id <= 40")
        pg.create_mixed_table(source_dsn, rows=7, start=1000)
        workers = [coordinator.worker(), coordinator.worker()]
        try:
            assert coordinator.evidence.authority == EXPORTED_SNAPSHOT
            pids = {coordinator.backend_pid, *(w.backend_pid for w in workers)}
            assert len(pids) == 3, "every worker is a session of its own"
            assert [_count(w) for w in workers] == [100, 100], "workers see the exported state"
            for worker in workers:
                assert worker.evidence.token == coordinator.evidence.token
                assert worker.evidence.acquired_at >= coordinator.evidence.acquired_at
        finally:
            for worker in workers:
                worker.commit_and_close()
    finally:
        coordinator.rollback_and_close()
    assert pg.open_transactions(source_dsn) == []


@pytest.mark.parametrize("token", ["00000003-0000001B-1", "x'; DROP TABLE public.mixed; --"])
def test_an_unknown_or_hostile_token_is_refused_with_a_stable_code(
    source_dsn: str, token: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=3)
    with pytest.raises(SnapshotError) as err:
        SnapshotSession.import_snapshot(source_dsn, token)
    assert err.value.code == "snapshot_import_failed"
    assert pg.fetch_one(source_dsn, "SELECT count(*) FROM public.mixed") == 3
    assert pg.open_transactions(source_dsn) == []


def test_a_worker_needs_an_exported_snapshot(source_dsn: str) -> None:
    session = SnapshotSession.open(source_dsn)
    try:
        with pytest.raises(SnapshotError) as err:
            session.worker()
        assert err.value.code == "snapshot_not_exported"
    finally:
        session.rollback_and_close()
