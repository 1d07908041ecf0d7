"""Every refusal of the backfill against real databases: a stable code, and nothing advanced."""

from __future__ import annotations

import socket
import threading

import psycopg
import pytest

from dpone_dagster.backfill import Backfill, BackfillOptions, BackfillStatus
from dpone_dagster.core import EngineError, LedgerConfig
from dpone_dagster.cursor.batch_commit import wait_for_lost_commit
from dpone_dagster.cursor.run_rules import next_request
from dpone_dagster.lifecycle import DponeError
from tests.backfill.conftest import Pair
from tests.helpers import pg


def code_of(call: object) -> str:
    # A DponeError: an EngineError, or the SessionError of a session that could not be opened.
    with pytest.raises(DponeError) as err:
        call()  # type: ignore[operator]
    assert err.value.message and err.value.next_actions
    return err.value.code


def backfill(pair: Pair, *, cursor: str | None = "id", **kw: object) -> Backfill:
    """The engine over ``public.mixed``: ``kw`` holds options (1000-row batches by default) and
    the engine's other arguments (``lower``, ``ledger``)."""
    options = {k: kw.pop(k) for k in list(kw) if k in BackfillOptions.model_fields}
    built = BackfillOptions.parse({"batch_size": 1000, **options})
    return Backfill(pair.source, pair.target, "public.mixed", cursor=cursor, options=built, **kw)  # type: ignore[arg-type]


def test_a_missing_cursor_is_refused(pair: Pair) -> None:
    assert code_of(lambda: backfill(pair, cursor=None)) == "backfill_cursor_missing"
    assert code_of(lambda: backfill(pair, cursor="nope").plan()) == "cursor_not_found"


def test_plans_that_cannot_work_are_plan_invalid(pair: Pair) -> None:
    assert code_of(lambda: backfill(pair, batch_size=0)) == "plan_invalid"
    assert code_of(lambda: backfill(pair, cursor="label").plan()) == "plan_invalid"  # text cursor
    assert code_of(lambda: backfill(pair, cursor="qty").plan()) == "plan_invalid"  # no index
    assert code_of(lambda: backfill(pair, lower="yesterday").plan()) == "plan_invalid"
    pg.execute(pair.source, "CREATE INDEX ON mixed (happened_at)")
    pg.execute(pair.target, "CREATE INDEX ON mixed (happened_at)")
    # Every tenth row has a NULL happened_at: no keyset range would ever hold it.
    assert code_of(lambda: backfill(pair, cursor="happened_at").plan()) == "plan_invalid"
    pg.execute(pair.source, "ALTER TABLE mixed DROP CONSTRAINT mixed_pkey")
    assert code_of(lambda: backfill(pair).plan()) == "plan_invalid"
    assert pg.fetch_one(pair.target, "SELECT to_regclass('dpone_ledger.backfill_runs') IS NOT NULL")
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM dpone_ledger.backfill_runs") == 0


@pytest.mark.parametrize(
    "ddl",
    [
        "DROP TABLE mixed",
        "ALTER TABLE mixed ALTER COLUMN qty TYPE bigint",
        "ALTER TABLE mixed DROP COLUMN blob",
        "ALTER TABLE mixed DROP CONSTRAINT mixed_pkey, ADD PRIMARY KEY (id, qty)",
    ],
)
def test_a_target_that_is_not_ready_is_destination_expansion_incomplete(
    pair: Pair, ddl: str
) -> None:
    pg.execute(pair.target, ddl)
    assert code_of(lambda: backfill(pair).plan()) == "destination_expansion_incomplete"


def test_a_transaction_in_flight_at_the_mark_that_never_ends_is_unsettled(pair: Pair) -> None:
    with psycopg.connect(pair.source) as writer:
        writer.execute("INSERT INTO mixed (id, qty) VALUES (999999, 1)")  # open, uncommitted
        assert code_of(lambda: backfill(pair, settle_timeout=0.3).plan()) == (
            "backfill_high_water_mark_unsettled"
        )
        writer.rollback()
    # A bounded write pause vouches that nobody writes: no wait.
    with psycopg.connect(pair.source) as idle:
        idle.execute("SELECT 1")
        run = backfill(pair, write_pause="maintenance window 42", settle_timeout=0.3).plan()
        assert run.boundary.kind == "bounded_write_pause"


def test_a_mark_does_not_wait_on_another_partitions_batch_read_held_open(pair: Pair) -> None:
    """Partitions run beside each other: the first's batch read stays open (its COPY waits on a
    row the target holds locked), and the second's mark, taken meanwhile, does not wait for it
    (a batch's read is READ ONLY and commits no row). A client's own transaction is still
    waited for, READ ONLY or not: nothing outside says it will not write."""
    first = backfill(pair, upper=2500)
    request = next_request(first.plan(), 1000)
    done: list[object] = []
    with psycopg.connect(pair.target) as holder:
        holder.execute("INSERT INTO mixed (id, qty) VALUES (10, 1)")  # in the first batch's range
        copying = threading.Thread(target=lambda: done.append(first.apply(request)))
        copying.start()
        try:
            pg.wait_until(
                lambda: pg.fetch_one(
                    pair.target,
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE 'COPY %%' AND datname = current_database()",
                ) == 1,
                timeout=30, what="the first partition's COPY waits on the held row",
            )  # fmt: skip
            second = backfill(pair, lower=2500, upper=4000, settle_timeout=0.3).plan()
            assert second.status is BackfillStatus.PLANNED
            with psycopg.connect(pair.source) as client:
                client.execute("BEGIN READ ONLY")
                client.execute("SELECT 1")
                assert code_of(lambda: backfill(pair, lower=4000, settle_timeout=0.3).plan()) == (
                    "backfill_high_water_mark_unsettled"
                )
        finally:
            holder.rollback()
            copying.join(60)
    [result] = done
    assert result.receipt.observation.copied_count == 1000  # type: ignore[attr-defined]


def test_the_wait_for_a_lost_commit_raises_when_the_old_backend_does_not_exit(
    target_dsn: str,
) -> None:
    with (
        psycopg.connect(target_dsn) as held,
        psycopg.connect(target_dsn, autocommit=True) as conn,
    ):
        held.execute("SELECT 1")  # a session the test holds open, inside a transaction
        pid = held.info.backend_pid
        with pytest.raises(EngineError) as err:
            wait_for_lost_commit(conn, pid, timeout=0.3)
        assert err.value.code == "backfill_persistence_failed"
        assert f"server backend {pid}" in err.value.message and "0.3s" in err.value.message
        assert f"pg_terminate_backend({pid})" in err.value.next_actions[0]
        held.close()
        wait_for_lost_commit(conn, pid, timeout=30)  # returns once the backend has exited
        assert (
            pg.fetch_one(target_dsn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            == 0
        )


def test_an_unreachable_ledger_is_ledger_unreachable(pair: Pair) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        dsn = f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=2"
        error = code_of(lambda: backfill(pair, ledger=LedgerConfig(dsn=dsn)).plan())
    assert error == "ledger_unreachable"


def test_a_tampered_ledger_row_is_backfill_run_invalid(pair: Pair) -> None:
    b = backfill(pair)
    b.run(max_batches=1)
    pg.execute(
        pair.target,
        "UPDATE dpone_ledger.backfill_runs SET run_json = jsonb_set(run_json,"
        " '{progress,copied_count}', '999999')",
    )
    fresh = backfill(pair)
    assert code_of(fresh.load) == "backfill_run_invalid"
    assert code_of(fresh.run) == "backfill_run_invalid"
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 1000


def test_a_reused_batch_id_replays_or_is_refused_and_a_stale_request_is_refused(
    pair: Pair,
) -> None:
    b = backfill(pair)
    planned = b.plan()
    b.run(max_batches=1)
    again = b.apply(next_request(planned, 1000))
    assert again.replayed and again.receipt == b.receipts()[0]
    assert code_of(lambda: b.apply(next_request(planned, 500))) == "backfill_batch_changed"
    stale = next_request(planned, 1000).model_copy(update={"batch_id": "elsewhere"})
    assert code_of(lambda: b.apply(stale)) == "backfill_checkpoint_stale"
    assert b.load().progress.batch_count == 1  # type: ignore[union-attr]
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 1000


def test_the_ledger_compare_and_swap_refuses_an_older_revision(pair: Pair) -> None:
    b = backfill(pair)
    planned = b.plan()
    b.run(max_batches=1)
    ledger = b.ledger
    with psycopg.connect(pair.target, autocommit=True) as conn:
        current = ledger.fetch(conn, planned.run_id)
        assert current is not None and current.revision == planned.revision + 1
        error = code_of(lambda: ledger.swap(conn, planned, current))
    assert error == "backfill_checkpoint_stale"


def test_a_target_row_that_differs_from_the_source_is_refused_and_nothing_advances(
    pair: Pair,
) -> None:
    pg.execute(pair.target, "INSERT INTO mixed (id, qty, label) VALUES (1500, 7, 'not the source')")
    b = backfill(pair)
    assert code_of(b.run) == "backfill_record_changed"
    run = b.load()
    assert (
        run is not None
        and run.progress.batch_count == 1
        and run.status is BackfillStatus.IN_PROGRESS
    )
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 1001
    assert pg.open_transactions(pair.target, "dpone-backfill") == []


def test_reconciliation_repairs_a_missing_row_and_reports_a_changed_one(pair: Pair) -> None:
    b = backfill(pair)
    b.run()
    pg.execute(pair.target, "DELETE FROM mixed WHERE id IN (10, 2500)")
    unrepaired = b.reconcile(repair=False)
    assert [r.sequence for r in unrepaired.differing] == [1, 3]
    assert b.load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]
    report = b.reconcile()
    outcomes = [r.outcome.value for r in report.ranges]
    assert report.ok and outcomes == ["repaired", "equal", "repaired", "equal", "equal"]
    assert sum(r.inserted for r in report.ranges) == 2
    assert pair.fingerprints()[0] == pair.fingerprints()[1]
    pg.execute(pair.source, "UPDATE mixed SET label = 'changed later' WHERE id = 3333")
    report = b.reconcile()
    assert not report.ok and [r.sequence for r in report.differing] == [4]
    assert report.differing[0].code == "backfill_record_changed"
    assert b.load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]
    checks = pg.fetch_all(
        pair.target,
        "SELECT sequence, outcome, code FROM dpone_ledger.backfill_range_checks"
        " WHERE outcome <> 'equal'",
    )
    assert checks == [(4, "differs", "backfill_record_changed")]
    pg.execute(pair.target, "UPDATE mixed SET label = 'changed later' WHERE id = 3333")
    assert b.reconcile().ok and b.load().status is BackfillStatus.SUCCEEDED  # type: ignore[union-attr]


def test_a_target_row_the_source_does_not_hold_in_a_batch_range_is_refused_at_its_batch(
    pair: Pair,
) -> None:
    """A target row the source does not hold, in a batch's range, is refused at the batch.

    The row's key is not the source's, so the batch's COPY meets no unique violation: only the
    target's count of the range (taken because the range was not empty) sees the row."""
    pg.execute(pair.source, "DELETE FROM mixed WHERE id = 1500")
    pg.execute(pair.target, "INSERT INTO mixed (id, qty, label) VALUES (1500, 7, 'not the source')")
    b = backfill(pair)
    with pytest.raises(EngineError) as err:
        b.run()
    assert err.value.code == "backfill_record_changed"
    counts = (
        "read inside the snapshot 1000, COPY TO tag 1000, COPY FROM tag 1000, target count 1001"
    )
    assert counts in str(err.value)
    run = b.load()
    assert run is not None and run.progress.batch_count == 1
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 1001
