"""The reconciliation's row-version proof, attacked: every write since a batch is still found.

A range is proven equal without hashing only when nobody wrote it on either side since its batch
(``dpone_dagster/reconcile/row_versions.py``). Each test below makes a change the proof must not
miss (some of them invisible to counts, some invisible to ``xmin`` alone) and shows that the
range falls back to the exact content hash and is reported, while untouched ranges stay proven.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from dpone_dagster.backfill import (
    Backfill,
    BackfillOptions,
    BatchReceipt,
    RangeOutcome,
    ReconciliationReport,
)
from dpone_dagster.cursor.run_rules import checkpoint_for
from dpone_dagster.postgres.evidence import RowVersionEvidence
from dpone_dagster.reconcile import Proof
from dpone_dagster.reconcile.row_versions import MAX_DISTANCE, Horizon, usable
from tests.backfill.conftest import Pair
from tests.helpers import pg

HASHED, PROVEN = Proof.CONTENT_HASH, Proof.ROW_VERSIONS


def backfill(pair: Pair) -> Backfill:
    return pair.backfill(BackfillOptions(batch_size=1000))


def proofs(report: ReconciliationReport) -> list[Proof]:
    return [r.proof for r in report.ranges]


def outcomes(report: ReconciliationReport) -> list[str]:
    return [r.outcome.value for r in report.ranges]


@pytest.mark.cross_server
def test_direct_batches_carry_evidence_bound_into_the_checkpoint_chain(pair: Pair) -> None:
    b = backfill(pair)
    report = b.run().reconciliation
    assert report is not None and report.ok and proofs(report) == [PROVEN] * 5
    receipts = b.receipts()
    evidence = [r.observation.row_versions for r in receipts]
    assert all(e is not None for e in evidence)
    assert len({e.target_xids for e in evidence if e is not None}) == 5  # one COPY each
    assert all(r.source_hash == r.target_hash == r.receipt_hash for r in report.ranges)
    hashed = b.reconcile(row_versions=False)  # on demand, every range is hashed
    assert hashed.ok and proofs(hashed) == [HASHED] * 5
    first: BatchReceipt = receipts[0]
    forged = first.observation.model_copy(
        update={"row_versions": evidence[0].model_copy(update={"target_xids": (12345,)})}  # type: ignore[union-attr]
    )
    assert checkpoint_for(first.run_id, None, first.batch_digest, forged) != first.checkpoint


@pytest.mark.cross_server
def test_source_writes_since_a_batch_fall_back_to_the_hash_and_are_found(pair: Pair) -> None:
    b = backfill(pair)
    b.run()
    with psycopg.connect(pair.source, autocommit=True) as conn:
        conn.execute("UPDATE mixed SET qty = qty + 1 WHERE id = 500")  # range 1: a value
        # range 2: one row replaced by another, so the count is unchanged
        conn.execute("DELETE FROM mixed WHERE id = 1500")
        conn.execute("INSERT INTO mixed (id, qty) VALUES (1500, -1)")
        conn.execute("UPDATE mixed SET qty = qty WHERE id = 2500")  # range 3: a no-op write
    report = b.reconcile(repair=False)
    assert proofs(report) == [HASHED, HASHED, HASHED, PROVEN, PROVEN]
    assert outcomes(report) == ["differs", "differs", "equal", "equal", "equal"]
    assert report.ranges[1].source_count == report.ranges[1].target_count == 1000


@pytest.mark.parametrize(
    ("side", "row", "changed", "counts"),
    [("source", 3500, 3, (999, 1000)), ("target", 4500, 4, (1000, 999))],
)
def test_a_row_deleted_from_one_side_alone_is_found(
    pair: Pair, side: str, row: int, changed: int, counts: tuple[int, int]
) -> None:
    """A delete leaves no newer row version behind: only the counts (whole run, range) tell."""
    b = backfill(pair)
    b.run()
    pg.execute(getattr(pair, side), "DELETE FROM mixed WHERE id = %s", (row,))
    report = b.reconcile(repair=False)
    assert proofs(report) == [HASHED if i == changed else PROVEN for i in range(5)]
    assert outcomes(report) == ["differs" if i == changed else "equal" for i in range(5)]
    found = report.ranges[changed]
    assert (found.source_count, found.target_count) == counts


def test_target_writes_fall_back_to_the_hash_and_a_rewrite_keeps_the_proof(pair: Pair) -> None:
    b = backfill(pair)
    b.run()
    with psycopg.connect(pair.target, autocommit=True) as conn:
        conn.execute("UPDATE mixed SET label = 'changed' WHERE id = 10")  # range 1
        conn.execute(  # range 2: deleted and put back exactly as it was
            "WITH gone AS (DELETE FROM mixed WHERE id = 1010 RETURNING *)"
            " INSERT INTO mixed SELECT * FROM gone"
        )
    for dsn in (pair.source, pair.target):  # rewrites and freezing keep every row version
        pg.execute(dsn, "VACUUM FULL mixed")
        pg.execute(dsn, "VACUUM FREEZE mixed")
    report = b.reconcile(repair=False)
    assert proofs(report) == [HASHED, HASHED, PROVEN, PROVEN, PROVEN]
    assert outcomes(report) == ["differs", "equal", "equal", "equal", "equal"]


def test_a_savepoint_write_of_a_transaction_in_flight_at_the_batch_is_found(pair: Pair) -> None:
    b = backfill(pair)
    list(b.batches(max_batches=1))
    with psycopg.connect(pair.source) as writer:
        writer.execute("SELECT pg_current_xact_id()")
        writer.execute("SAVEPOINT s")
        writer.execute("UPDATE mixed SET qty = qty + 7 WHERE id = 1700")  # written by a subxid
        writer.execute("RELEASE SAVEPOINT s")
        list(b.batches())  # batch 2 copies the row as it was: the writer has not committed
        writer.commit()
    report = b.reconcile(repair=False)
    assert proofs(report)[1] is HASHED and report.ranges[1].outcome is RangeOutcome.DIFFERS
    assert proofs(report)[2:] == [PROVEN] * 3


def test_a_table_swapped_in_by_rename_is_hashed_not_trusted(pair: Pair) -> None:
    """The impostor's rows are older than every batch and as many: only the table key tells."""
    pg.execute(pair.source, "CREATE TABLE impostor (LIKE mixed INCLUDING ALL)")
    pg.execute(pair.source, "INSERT INTO impostor SELECT * FROM mixed")
    pg.execute(pair.source, "UPDATE impostor SET qty = qty + 1 WHERE id = 4200")
    pg.execute(pair.source, "VACUUM impostor")
    b = backfill(pair)
    b.run()
    with psycopg.connect(pair.source, autocommit=True) as conn, conn.transaction():
        conn.execute("ALTER TABLE mixed RENAME TO original")
        conn.execute("ALTER TABLE impostor RENAME TO mixed")
    report = backfill(pair).reconcile(repair=False)  # a new process resolves the new table
    assert proofs(report) == [HASHED] * 5
    assert outcomes(report) == ["equal", "equal", "equal", "equal", "differs"]


def test_a_column_dropped_and_re_added_with_a_default_is_hashed_not_trusted(pair: Pair) -> None:
    """Every row gets the new default without a new row version: only the column key tells."""
    b = backfill(pair)
    b.run()
    with psycopg.connect(pair.source, autocommit=True) as conn, conn.transaction():
        conn.execute("ALTER TABLE mixed DROP COLUMN blob")  # the last: the order stays
        conn.execute("ALTER TABLE mixed ADD COLUMN blob bytea NOT NULL DEFAULT '\\x00'")
    report = b.reconcile(repair=False)
    assert proofs(report) == [HASHED] * 5 and outcomes(report) == ["differs"] * 5


def test_rows_a_target_trigger_changed_on_the_way_in_are_hashed(pair: Pair) -> None:
    pg.execute(
        pair.target,
        "CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN IF NEW.id = 3333 THEN NEW.qty := NEW.qty + 1; END IF; RETURN NEW; END$$",
    )
    pg.execute(
        pair.target,
        "CREATE TRIGGER bump BEFORE INSERT ON mixed FOR EACH ROW EXECUTE FUNCTION bump()",
    )
    b = backfill(pair)
    list(b.batches())
    assert all(r.observation.row_versions is None for r in b.receipts())
    report = b.reconcile(repair=False)
    assert proofs(report) == [HASHED] * 5
    assert outcomes(report) == ["equal", "equal", "equal", "differs", "equal"]


def test_rows_an_inheritance_child_brings_into_view_are_hashed(pair: Pair) -> None:
    """A child's rows are old and, with as many deleted, the count holds: the children rule."""
    pg.execute(pair.source, "CREATE TABLE child (LIKE mixed)")
    pg.execute(pair.source, "INSERT INTO child (id, qty) VALUES (4999, 1)")  # before the batches
    b = backfill(pair)
    b.run()
    pg.execute(pair.source, "DELETE FROM ONLY mixed WHERE id = 4999")  # the count stays 1000
    pg.execute(pair.source, "ALTER TABLE child INHERIT mixed")
    report = backfill(pair).reconcile(repair=False)
    assert proofs(report) == [HASHED] * 5
    assert outcomes(report) == ["equal", "equal", "equal", "equal", "differs"]


def test_evidence_older_than_two_to_the_thirty_transactions_is_not_used() -> None:
    """32-bit ids compare exactly only within 2^31 of each other: far older evidence is hashed."""
    evidence = RowVersionEvidence(
        source_xmin=1_000, source_table="s", target_xids=(2_000,), target_top_xid=2_000,
        target_table="t",
    )  # fmt: skip
    near = Horizon(xmax=1_000 + MAX_DISTANCE - 1, key="s"), Horizon(xmax=5_000, key="t")
    assert usable(evidence, *near)
    assert not usable(evidence, Horizon(1_000 + MAX_DISTANCE, "s"), near[1])
    assert not usable(evidence, near[0], Horizon(2_000 + MAX_DISTANCE, "t"))
    assert not usable(evidence, Horizon(999, "s"), near[1])  # a horizon behind the evidence
    assert not usable(evidence, near[0], Horizon(5_000, "another table"))


def _writer_open_in(dsn: str) -> tuple[psycopg.Connection[tuple[object, ...]], int]:
    """A session of ``dsn`` holding a transaction with an id (a writer), left open."""
    conn = psycopg.connect(dsn)
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return conn, int(str(row[0]))


def _rows_rewritten_after(pair: Pair, xid: int) -> int:
    """Every source row gets a new version, written after transaction ``xid`` began (and the
    held writer keeps every snapshot's cluster-wide ``xmin`` at or below it); the writing
    transaction's id."""
    with psycopg.connect(pair.source) as conn:
        conn.execute("UPDATE mixed SET qty = qty")
        found = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert found is not None
        rewrite = int(str(found[0]))
    held = pg.fetch_one(pair.source, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
    assert int(str(held)) <= xid
    oldest = pg.fetch_one(pair.source, "SELECT min(xmin::text::bigint) FROM mixed")
    assert int(str(oldest)) > xid % 2**32
    return rewrite


@pytest.mark.cross_server
def test_a_writer_open_in_another_database_keeps_the_row_version_proof(
    pair: Pair, make_database: Callable[..., str]
) -> None:
    """A transaction in another database cannot write this one's tables: a writer left open
    there (a report, a stuck session) no longer forces every range to be hashed."""
    elsewhere = make_database("dpone_elsewhere", pg.server_admin(pair.source))
    b = backfill(pair)
    b.plan()
    writer, xid = _writer_open_in(elsewhere)
    try:
        rewrite = _rows_rewritten_after(pair, xid)
        report = b.run().reconciliation
    finally:
        writer.close()
    assert report is not None and report.ok
    # No batch's evidence is held back by the open writer: each one's oldest in-flight id of
    # the source database is past it, and past the rewrite, so its range is proven by row
    # versions. (A short transaction of another database that ended between a batch's
    # snapshot and its read of pg_stat_activity is kept, conservatively: on a server other
    # tests share, such a batch's range is hashed instead, as its evidence says.)
    evidence = [r.observation.row_versions for r in b.receipts()]
    assert all(e is not None and e.source_xmin is not None for e in evidence)
    floors = [e.source_xmin for e in evidence if e is not None and e.source_xmin is not None]
    assert len(floors) == 5 and all(floor > xid for floor in floors), (floors, xid)
    assert proofs(report) == [PROVEN if floor > rewrite else HASHED for floor in floors]
    assert PROVEN in proofs(report)


def test_a_writer_open_in_the_same_database_still_forces_the_hash(pair: Pair) -> None:
    """A writer of the source database in flight at the batches (it began after the mark, which
    waits out the writers open then) might have written the rows: the ranges are hashed (and
    found equal), never proven by row versions."""
    b = backfill(pair)
    b.plan()
    writer, xid = _writer_open_in(pair.source)
    try:
        _rows_rewritten_after(pair, xid)
        report = b.run().reconciliation
    finally:
        writer.close()
    assert report is not None and report.ok
    assert proofs(report) == [HASHED] * 5
