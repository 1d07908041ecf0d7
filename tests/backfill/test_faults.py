"""Faults for real: in-flight writers at the mark, lost responses, killed sessions, interrupts."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg import conninfo, sql

from dpone_dagster.backfill import Backfill, BackfillOptions, BackfillStatus
from dpone_dagster.core import EngineError, LedgerConfig
from dpone_dagster.postgres.identifiers import IdentifierError, TableName
from tests.backfill.conftest import Pair
from tests.helpers import pg
from tests.helpers.proxy import TcpProxy

APP = "dpone-backfill"


def waiting_out_in_flight(source_dsn: str) -> bool:
    """True once the run's source session has read the mark and polls ``pg_locks`` for the
    virtual xids in flight at that moment (the one statement of the boundary's settle loop)."""
    return bool(
        pg.fetch_all(
            pg.admin_dsn(),
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s"
            " AND query LIKE '%%virtualxid = ANY(%%'",
            (conninfo.conninfo_to_dict(source_dsn)["dbname"], APP),
        )
    )


def test_a_row_reserved_below_the_mark_and_committed_later_is_not_lost(
    source_dsn: str, target_dsn: str
) -> None:
    for dsn in (source_dsn, target_dsn):
        pg.execute(dsn, "CREATE TABLE q (id bigserial PRIMARY KEY, v text)")
    pg.execute(source_dsn, "INSERT INTO q (v) SELECT 'early' FROM generate_series(1, 1000)")
    late = psycopg.connect(source_dsn)
    late.execute("INSERT INTO q (v) VALUES ('late')")  # reserves id 1001, not committed
    pg.execute(source_dsn, "INSERT INTO q (v) SELECT 'after' FROM generate_series(1, 1000)")
    assert pg.fetch_one(source_dsn, "SELECT max(id) FROM q") == 2001  # the mark will be 2001

    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = Backfill(
                source_dsn, target_dsn, "q", cursor="id", options=BackfillOptions(batch_size=300)
            ).run()
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    pg.wait_until(
        lambda: "error" in outcome or waiting_out_in_flight(source_dsn),
        timeout=30,
        what="the run's source session waits out the transaction that reserved id 1001",
    )
    assert "error" not in outcome, outcome.get("error")
    # The mark is read, the reserving transaction is still open: no run is stored and no batch
    # is copied until it ends.
    assert worker.is_alive()
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.backfill_runs") == 0
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM q") == 0
    late.commit()  # the reserved row commits after the mark was taken
    late.close()
    worker.join(60)
    assert not worker.is_alive(), "the run did not finish once the transaction had ended"
    assert "error" not in outcome, outcome.get("error")
    assert pg.fetch_all(target_dsn, "SELECT v FROM q WHERE id = 1001") == [("late",)]
    assert pg.table_fingerprint(source_dsn, "public", "q") == pg.table_fingerprint(
        target_dsn, "public", "q"
    )
    result = outcome["result"]
    evidence = {e.kind: e for e in result.run.evidence}  # type: ignore[attr-defined]
    assert "1 in-flight transaction(s) waited out" in evidence["source_boundary"].detail


def test_a_lost_commit_response_is_answered_by_replay(pair: Pair) -> None:
    proxy = TcpProxy.to(pair.target)
    batches = {"n": 0}

    def on_phase(phase: str) -> None:
        if phase == "commit":
            batches["n"] += 1
            if batches["n"] == 2:
                proxy.cut_after_client_message()  # the COMMIT reaches the server, its reply not

    try:
        result = Backfill(
            pair.source,
            proxy.dsn(pair.target),
            "public.mixed",
            cursor="id",
            options=BackfillOptions(batch_size=1000),
            on_phase=on_phase,
        ).run()
    finally:
        proxy.close()
    assert proxy.cut_events == 1
    assert (result.committed, result.replayed) == (4, 1)
    assert result.run.progress.copied_count == 5000 and result.run.progress.duplicate_count == 0
    assert pair.fingerprints()[0] == pair.fingerprints()[1]


def test_a_ledger_elsewhere_crashing_after_the_rows_committed_is_repaired_by_replay(
    pair: Pair, make_database: object
) -> None:
    ledger_dsn = make_database("dpone_ledger")  # type: ignore[operator]
    proxy = TcpProxy.to(ledger_dsn)
    batches = {"n": 0}

    def on_phase(phase: str) -> None:
        if phase == "commit":
            batches["n"] += 1
            if batches["n"] == 2:
                proxy.cut_all()  # the target commits; the ledger never hears of it

    config = LedgerConfig(dsn=proxy.dsn(ledger_dsn))
    try:
        with pytest.raises(EngineError) as err:
            pair.backfill(BackfillOptions(batch_size=1000), ledger=config, on_phase=on_phase).run()
        assert err.value.code == "backfill_persistence_failed"
        assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 2000
        assert (
            pg.fetch_one(ledger_dsn, "SELECT count(*) FROM dpone_ledger.backfill_batch_receipts")
            == 1
        )
        resumed = pair.backfill(BackfillOptions(batch_size=1000), ledger=config)
        result = resumed.run()
        assert resumed.receipts()[1].observation.apply_path.value == "staged_apply"
    finally:
        proxy.close()
    assert result.run.progress.copied_count == 4000
    assert result.run.progress.duplicate_count == 1000  # batch 2 found present and equal
    assert pair.fingerprints()[0] == pair.fingerprints()[1]
    assert not pg.table_exists(pair.target, "dpone_ledger", "backfill_runs")


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_terminated_session_mid_batch_leaves_the_checkpoint_and_the_next_attempt_resumes(
    pair: Pair, side: str
) -> None:
    dsn = pair.source if side == "source" else pair.target
    calls = {"copy": 0}

    def on_phase(phase: str) -> None:
        if phase == "copy":
            calls["copy"] += 1
            if calls["copy"] == 3:
                pids = pg.backends(dsn, APP)
                assert pids
                pg.terminate(pids, dsn)

    b = pair.backfill(BackfillOptions(batch_size=1000), on_phase=on_phase)
    with pytest.raises(EngineError) as err:
        b.run()
    assert err.value.code == "backfill_persistence_failed"
    run = b.load()
    assert run is not None and run.progress.batch_count == 2
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 2000
    result = b.run()
    assert result.run.status is BackfillStatus.SUCCEEDED and result.committed == 3
    b.verify()
    assert pair.fingerprints()[0] == pair.fingerprints()[1]


class Interrupted(BaseException):
    """Stands in for Dagster's DagsterExecutionInterruptedError (also a BaseException)."""


def test_an_interrupt_mid_copy_leaves_the_checkpoint_and_no_open_transaction(pair: Pair) -> None:
    calls = {"copy": 0}

    def on_phase(phase: str) -> None:
        if phase == "copy":
            calls["copy"] += 1
            if calls["copy"] == 3:
                raise Interrupted

    b = pair.backfill(BackfillOptions(batch_size=1000), on_phase=on_phase)
    with pytest.raises(Interrupted):
        b.run()
    assert pg.open_transactions(pair.source, APP) == []
    assert pg.open_transactions(pair.target, APP) == []
    assert b.load().progress.batch_count == 2  # type: ignore[union-attr]
    b.on_phase = lambda _: None
    assert b.run().run.progress.copied_count == 5000


HOSTILE_SCHEMA = 'we"ird; DROP TABLE public.victim; --'
HOSTILE_TABLE = 'Order Items ünï "q" --'
HOSTILE_CURSOR = '"id"; DELETE FROM victim --'


def test_hostile_names_reach_only_the_intended_table(source_dsn: str, target_dsn: str) -> None:
    table = TableName(HOSTILE_SCHEMA, HOSTILE_TABLE)
    ddl = sql.SQL(
        "CREATE SCHEMA {s}; CREATE TABLE {t} ({c} bigint PRIMARY KEY, {v} text);"
        " CREATE TABLE public.victim (id int); INSERT INTO public.victim VALUES (1)"
    ).format(
        s=sql.Identifier(HOSTILE_SCHEMA),
        t=table.ident,
        c=sql.Identifier(HOSTILE_CURSOR),
        v=sql.Identifier("välue; --"),
    )
    for dsn in (source_dsn, target_dsn):
        pg.execute(dsn, ddl)
    pg.execute(
        source_dsn,
        sql.SQL("INSERT INTO {} SELECT g, 'v' || g FROM generate_series(1, 500) g").format(
            table.ident
        ),
    )
    ledger = LedgerConfig(schema='ledger"; DROP SCHEMA public; --')
    before = set(pg.fetch_all(target_dsn, "SELECT schemaname, tablename FROM pg_tables"))
    options = BackfillOptions(batch_size=70)
    result = Backfill(
        source_dsn, target_dsn, table, cursor=HOSTILE_CURSOR, options=options, ledger=ledger
    ).run()
    assert result.run.progress.copied_count == 500
    after = set(pg.fetch_all(target_dsn, "SELECT schemaname, tablename FROM pg_tables"))
    # The one ledger's tables (every engine's, and its migrations), in the hostile schema only.
    assert after - before == {
        (ledger.schema, n)
        for n in (
            "backfill_runs", "backfill_batch_receipts", "backfill_range_checks",
            "incremental_streams", "incremental_batch_receipts", "incremental_sweeps",
            "kafka_offsets", "replication_groups", "replication_sweeps", "replication_keys",
            "ledger_version",
        )
    }  # fmt: skip
    for dsn in (source_dsn, target_dsn):
        assert pg.fetch_all(dsn, "SELECT * FROM public.victim") == [(1,)]
    assert pg.fetch_one(target_dsn, sql.SQL("SELECT count(*) FROM {}").format(table.ident)) == 500
    with pytest.raises(IdentifierError) as err:
        Backfill(source_dsn, target_dsn, TableName("public", "x" * 64), cursor="id")
    assert err.value.code == "identifier_invalid"
    with pytest.raises(IdentifierError):
        LedgerConfig(schema="é" * 32)  # 64 bytes in UTF-8
