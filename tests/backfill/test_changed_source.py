"""The backfill of a table that changes under it: strict by default, repaired on request.

A real writer session (its own connection, its own transactions) updates and deletes rows the
backfill has already copied, while the backfill goes on and while it reconciles. By default the
final reconciliation refuses the changed history (``backfill_record_changed``), again on every
re-run; with ``on_changed="repair"`` the partition ends equal to the source at the
reconciliation's ONE snapshot, which the test reconstructs from the writer's steps and compares
with the one reconciliation digest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from dpone_dagster.backfill import (
    ApplyPath,
    Backfill,
    BackfillOptions,
    BackfillReconciliationError,
    BackfillStatus,
    BatchResult,
    OnChanged,
    RangeOutcome,
)
from dpone_dagster.core import EngineError
from dpone_dagster.lifecycle import SnapshotLabel
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import table_columns
from dpone_dagster.reconcile import Digest, Proof
from dpone_dagster.reconcile.digest import digest_query, pin_settings, row_hash, run_digest
from tests.backfill.conftest import Pair, make_pair, wait_for_older_transactions
from tests.helpers import pg

ROWS, BATCH = 20_000, 2_000
FLOOR = 1_000_000
"""A stepped row's ``qty`` is ``FLOOR + step``; the table's own values stay below 1,000."""


def updated_id(step: int) -> int:
    """The even id step ``step`` updates (2..2000: copied by the first batch, never deleted)."""
    return 2 * ((step * 7919) % 1000) + 2


def deleted_id(step: int) -> int:
    """The odd id step ``step`` deletes (each once)."""
    return 2 * step + 1


def apply_step(conn: psycopg.Connection[tuple[object, ...]], step: int, table: str) -> None:
    """One writer step, as the writer and the replay both run it (in one transaction)."""
    with conn.transaction():
        conn.execute(
            f"UPDATE {table} SET qty = %s, label = %s WHERE id = %s",
            (FLOOR + step, f"step {step}", updated_id(step)),
        )
        conn.execute(f"DELETE FROM {table} WHERE id = %s", (deleted_id(step),))


class StepWriter:
    """A concurrent writer: step after step, each one committed transaction, about 100 a second
    (the pace of the issue's report), until stopped."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.steps = dsn, 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpone-step-writer", daemon=True)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, application_name="dpone-step-writer") as conn:
                while not self._stop.is_set():
                    apply_step(conn, self.steps + 1, "mixed")
                    self.steps += 1
                    self._stop.wait(0.01)  # paces the load; nothing waits on it
        except BaseException as exc:  # re-raised by wait_for / stop
            self.errors.append(exc)

    def start(self) -> None:
        self._thread.start()

    def wait_for(self, steps: int) -> None:
        """Waits until ``steps`` steps have committed."""
        pg.wait_until(
            lambda: self.errors or self.steps >= steps,
            timeout=30,
            what=f"the writer committed {steps} steps",
        )
        if self.errors:
            raise self.errors[0]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the writer did not stop"
        if self.errors:
            raise self.errors[0]


@pytest.fixture
def changing(source_dsn: str, target_dsn: str) -> Iterator[tuple[Pair, StepWriter]]:
    """20,000 rows, an empty target, the rows as they were (``mixed_before``), and a writer
    that is not started yet."""
    pair = make_pair(source_dsn, target_dsn, ROWS)
    pg.execute(source_dsn, "CREATE TABLE mixed_before AS SELECT * FROM mixed")
    writer = StepWriter(source_dsn)
    yield pair, writer
    if writer._thread.is_alive():
        writer.stop()


def writing_after_first_batches(writer: StepWriter) -> object:
    """An ``on_batch`` hook: starts the writer once batch 1 committed, and lets batch 3 begin
    only after the writer changed 30 copied rows (and deleted 30)."""

    def on_batch(batch: BatchResult) -> None:
        if batch.receipt.sequence == 1:
            writer.start()
        if batch.receipt.sequence == 2:
            writer.wait_for(30)

    return on_batch


def digest(dsn: str, table: str) -> Digest:
    """The one reconciliation digest of a whole table (columns as ``public.mixed`` has them)."""
    with psycopg.connect(dsn) as conn:
        pin_settings(conn, local=True)
        columns = table_columns(conn, TableName("public", "mixed"))
        return run_digest(conn, *digest_query(TableName("public", table), row_hash(conn, columns)))


def replay(dsn: str, steps: int) -> None:
    """``mixed_before`` with the writer's first ``steps`` steps applied: the source as a snapshot
    taken right after step ``steps`` saw it."""
    with psycopg.connect(dsn) as conn:
        for step in range(1, steps + 1):
            apply_step(conn, step, "mixed_before")


def test_by_default_a_changed_history_fails_with_next_actions_and_a_rerun_fails_again(
    changing: tuple[Pair, StepWriter],
) -> None:
    pair, writer = changing
    b = pair.backfill(BackfillOptions(batch_size=BATCH))
    with pytest.raises(BackfillReconciliationError) as err:
        b.run(on_batch=writing_after_first_batches(writer))  # type: ignore[arg-type]
    assert err.value.code == "backfill_record_changed"
    actions = " ".join(err.value.next_actions)
    assert 'on_changed="repair"' in actions and "incremental_asset" in actions
    assert err.value.report.differing[0].sequence == 1  # the rows the writer touched
    assert b.load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]

    with pytest.raises(BackfillReconciliationError) as again:  # the writer is still writing
        b.run()
    assert again.value.code == "backfill_record_changed"
    writer.stop()
    with pytest.raises(BackfillReconciliationError):  # and when it has stopped
        b.run()
    assert b.load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]
    assert digest(pair.source, "mixed") != digest(pair.target, "mixed")  # history untouched

    # The way out for the blocked run: the same scope (the same run), run with on_changed="repair".
    fixed = pair.backfill(BackfillOptions(batch_size=BATCH, on_changed="repair")).run()
    assert fixed.run.run_id == b.run_id and fixed.run.status is BackfillStatus.SUCCEEDED
    assert fixed.snapshot_label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT
    assert digest(pair.source, "mixed") == digest(pair.target, "mixed")


def test_repair_ends_equal_to_the_source_at_the_reconciliation_snapshot_deletes_included(
    changing: tuple[Pair, StepWriter],
) -> None:
    pair, writer = changing
    b = pair.backfill(BackfillOptions(batch_size=BATCH, on_changed="repair"))
    result = b.run(on_batch=writing_after_first_batches(writer))  # type: ignore[arg-type]
    writer.wait_for(writer.steps + 2)  # the source moves on after the reconciliation
    writer.stop()

    report = result.reconciliation
    assert report is not None and report.ok and report.rewritten
    repaired = report.repaired_rows()
    assert repaired["updated"] > 0 and repaired["deleted"] > 0
    assert report.ranges[0].outcome is RangeOutcome.REPAIRED
    assert result.run.status is BackfillStatus.SUCCEEDED
    assert result.snapshot_label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT
    assert b.load().snapshot_label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT  # type: ignore[union-attr]

    # The reconciliation's snapshot saw the writer's steps 1..k: step k's row holds FLOOR + k.
    k = int(pg.fetch_one(pair.target, "SELECT max(qty) FROM mixed") - FLOOR)  # type: ignore[operator]
    assert 30 <= k < writer.steps
    replay(pair.source, k)
    assert digest(pair.source, "mixed_before") == digest(pair.target, "mixed")
    assert digest(pair.source, "mixed") != digest(pair.target, "mixed")  # not "now": step k
    # Row 3 was copied by batch 1, before the writer deleted it: the repair deleted it.
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed WHERE id = 3") == 0
    stored = pg.fetch_all(
        pair.target,
        "SELECT outcome, (check_json->>'updated')::int, (check_json->>'deleted')::int"
        " FROM dpone_ledger.backfill_range_checks WHERE sequence = 1",
    )
    assert stored == [("repaired", report.ranges[0].updated, report.ranges[0].deleted)]

    again = b.run()  # reconciled already: nothing to copy, nothing to repair
    assert again.committed == 0 and again.reconciliation is None
    assert again.snapshot_label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT


@pytest.mark.parametrize("on_changed", ["fail", "repair"])
def test_reverify_checks_a_succeeded_run_against_the_source_as_it_is_now(
    pair: Pair, on_changed: OnChanged
) -> None:
    def backfill() -> Backfill:
        return pair.backfill(BackfillOptions(batch_size=1000, on_changed=on_changed))

    wait_for_older_transactions(pair.source)  # every batch's rows provable by their versions
    done = backfill().run()
    assert done.run.status is BackfillStatus.SUCCEEDED and done.reconciliation is not None
    unchanged = backfill().run(reverify=True)  # nothing changed: proven again, cheaply
    assert unchanged.committed == 0 and unchanged.reconciliation is not None
    assert unchanged.reconciliation.ok
    assert unchanged.reconciliation.proven_by(Proof.ROW_VERSIONS) == 5
    assert unchanged.reconciliation.proved_at > done.reconciliation.proved_at

    # The source moves on after the run succeeded: a row of batch 2 changes, one of batch 4 goes.
    pg.execute(pair.source, "UPDATE mixed SET qty = qty + 1 WHERE id = 1500")
    pg.execute(pair.source, "DELETE FROM mixed WHERE id = 3500")
    assert backfill().run().reconciliation is None  # without reverify: left as it is
    if on_changed == "fail":
        with pytest.raises(BackfillReconciliationError) as err:
            backfill().run(reverify=True)
        assert err.value.code == "backfill_record_changed"
        assert [r.sequence for r in err.value.report.differing] == [2, 4]
        assert backfill().load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]
        assert digest(pair.source, "mixed") != digest(pair.target, "mixed")  # history kept
    else:
        refreshed = backfill().run(reverify=True)
        report = refreshed.reconciliation
        assert report is not None and report.ok
        assert report.repaired_rows() == {"inserted": 0, "updated": 1, "deleted": 1}
        assert refreshed.snapshot_label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT
        assert digest(pair.source, "mixed") == digest(pair.target, "mixed")


@pytest.mark.parametrize("batch_size", [1000, 5000])
def test_repair_rewrites_only_the_keys_that_differ_inside_a_batch_range(
    pair: Pair, batch_size: int
) -> None:
    """1,000-row ranges send their keys at once; the one 5,000-row range is drilled into
    (key-hash ranges, then sub-ranges): either way only the differing keys are written."""

    def backfill() -> Backfill:
        return pair.backfill(BackfillOptions(batch_size=batch_size, on_changed="repair"))

    assert backfill().run().run.status is BackfillStatus.SUCCEEDED
    pg.execute(pair.source, "UPDATE mixed SET qty = qty + 1 WHERE id IN (10, 2500, 4990)")
    pg.execute(pair.source, "DELETE FROM mixed WHERE id = 3500")
    pg.execute(pair.target, "UPDATE mixed SET label = 'forged' WHERE id = 777")
    query = "SELECT id, xmin::text FROM mixed"
    before = dict(pg.fetch_all(pair.target, query))  # type: ignore[arg-type]
    report = backfill().run(reverify=True).reconciliation
    assert report is not None and report.ok
    assert report.repaired_rows() == {"inserted": 0, "updated": 4, "deleted": 1}
    after = dict(pg.fetch_all(pair.target, query))  # type: ignore[arg-type]
    rewritten = {k for k, v in after.items() if before[k] != v}
    assert rewritten == {10, 777, 2500, 4990} and set(before) - set(after) == {3500}
    assert digest(pair.source, "mixed") == digest(pair.target, "mixed")


def test_an_unknown_on_changed_is_refused_before_anything_is_read() -> None:
    with pytest.raises(EngineError) as err:
        BackfillOptions(on_changed="merge")
    assert err.value.code == "plan_invalid" and "repair" in err.value.message


REFUSE_CHECKS = """
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the ledger refuses range checks'; END $$;
CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON dpone_ledger.backfill_range_checks
FOR EACH ROW EXECUTE FUNCTION refuse();
"""


def test_a_row_whose_cursor_moves_stops_the_default_and_is_followed_by_repair_atomically(
    source_dsn: str, target_dsn: str
) -> None:
    for dsn in (source_dsn, target_dsn):
        pg.execute(
            dsn, "CREATE TABLE moving (id bigint PRIMARY KEY, pos bigint NOT NULL, note text)"
        )
        pg.execute(dsn, "CREATE INDEX ON moving (pos)")
    pg.execute(
        source_dsn, "INSERT INTO moving SELECT g, g, 'row ' || g FROM generate_series(1, 1000) g"
    )

    def writer(batch: BatchResult) -> None:  # a writer session, at moments the batches mark
        if batch.receipt.sequence == 1:  # copied row 5 moves forward, into batch 6's range
            pg.execute(source_dsn, "UPDATE moving SET pos = 550, note = 'up' WHERE id = 5")
        if batch.receipt.observation.final:  # copied row 900 moves back, into batch 1's range
            pg.execute(source_dsn, "UPDATE moving SET pos = 50, note = 'down' WHERE id = 900")

    def backfill(on_changed: OnChanged) -> Backfill:
        options = BackfillOptions(batch_size=100, on_changed=on_changed)
        return Backfill(source_dsn, target_dsn, "public.moving", cursor="pos", options=options)

    with pytest.raises(EngineError) as err:  # batch 6 meets row 5, copied by batch 1
        backfill("fail").run(on_batch=writer)
    assert err.value.code == "backfill_record_changed" and "on_changed" in str(err.value)
    assert backfill("fail").load().progress.batch_count == 5  # type: ignore[union-attr]

    # The ledger refuses the reconciliation's record (a real server-side error): the repair it
    # would have recorded rolls back with it, so no rewrite is ever left unlabelled.
    pg.execute(target_dsn, REFUSE_CHECKS)
    with pytest.raises(EngineError) as refused:  # resumes at batch 6, then reconciles
        backfill("repair").run(on_batch=writer)
    assert refused.value.code == "backfill_persistence_failed"
    assert pg.fetch_one(target_dsn, "SELECT pos FROM moving WHERE id = 900") == 900  # not repaired
    assert backfill("repair").load().snapshot_label is SnapshotLabel.SEVERAL_SNAPSHOTS  # type: ignore[union-attr]
    pg.execute(target_dsn, "DROP TRIGGER refuse ON dpone_ledger.backfill_range_checks")

    result = backfill("repair").run()
    sixth = backfill("repair").receipts()[5]
    # 100 rows of pos 501..599, row 5 among them: replaced through the staged apply, counted
    assert (sixth.copied_count, sixth.duplicate_count) == (100, 0)
    assert sixth.observation.apply_path is ApplyPath.STAGED
    report = result.reconciliation
    assert report is not None and report.ok and report.ranges[0].updated == 1  # row 900
    assert result.snapshot_label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT
    assert pg.table_fingerprint(source_dsn, "public", "moving") == pg.table_fingerprint(
        target_dsn, "public", "moving"
    )
