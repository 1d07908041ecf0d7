"""The final reconciliation on real databases: it finds every kind of difference, per range.

The digests are computed by each server over its own rows (count and a sum of exact row
hashes); these tests show that nothing the old client-side stream hash caught slips through.
"""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import (
    Backfill,
    BackfillOptions,
    BackfillReconciliationError,
    BackfillStatus,
)
from dpone_dagster.backfill.existing_rows import apply_missing
from dpone_dagster.backfill.shape import resolve_shape
from dpone_dagster.core.sessions import prepared_session
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile import DIGEST_ALGORITHM, Proof
from tests.backfill.conftest import Pair
from tests.helpers import pg


def backfill(pair: Pair) -> Backfill:
    return pair.backfill(BackfillOptions(batch_size=1000))


@pytest.mark.cross_server
def test_a_differing_a_missing_and_an_extra_row_are_found_repaired_or_reported(
    pair: Pair,
) -> None:
    pg.execute(pair.source, "DELETE FROM mixed WHERE id = 2600")  # a gap the target will fill
    b = backfill(pair)
    clean = b.run().reconciliation
    assert clean is not None and clean.ok and len(clean.ranges) == 5
    # untouched since their batches: proven by row versions, the receipt's hash stands for both
    assert all(r.proof is Proof.ROW_VERSIONS for r in clean.ranges)
    assert all(r.source_hash == r.target_hash == r.receipt_hash for r in clean.ranges)

    pg.execute(pair.target, "DELETE FROM mixed WHERE id = 700")  # missing, range 1
    pg.execute(pair.target, "UPDATE mixed SET qty = qty + 1 WHERE id = 1500")  # differing, 2
    pg.execute(  # extra: the target holds a row the source does not, range 3
        pair.target, "INSERT INTO mixed (id, qty, label) VALUES (2600, 1, 'only here')"
    )
    found = b.reconcile(repair=False)
    assert [r.sequence for r in found.differing] == [1, 2, 3]
    counts = {r.sequence: (r.source_count, r.target_count) for r in found.differing}
    assert counts == {1: (1000, 999), 2: (1000, 1000), 3: (1000, 1001)}
    assert all(r.source_hash.startswith(DIGEST_ALGORITHM + ":") for r in found.differing)
    assert [r.proof for r in found.ranges] == [Proof.CONTENT_HASH] * 3 + [Proof.ROW_VERSIONS] * 2
    assert b.load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]

    with pytest.raises(BackfillReconciliationError) as err:
        b.run()
    report = err.value.report
    outcomes = {r.sequence: (r.outcome.value, r.code, r.inserted) for r in report.ranges}
    assert outcomes == {
        1: ("repaired", None, 1),
        2: ("differs", "backfill_record_changed", 0),
        3: ("differs", "backfill_record_changed", 0),
        4: ("equal", None, 0),
        5: ("equal", None, 0),
    }
    assert "1500" in report.ranges[1].detail and "rows" in report.ranges[2].detail
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed WHERE id = 700") == 1
    checks = pg.fetch_all(
        pair.target,
        "SELECT sequence, outcome, code FROM dpone_ledger.backfill_range_checks ORDER BY 1",
    )
    assert checks[:3] == [
        (1, "repaired", None),
        (2, "differs", "backfill_record_changed"),
        (3, "differs", "backfill_record_changed"),
    ]
    assert b.load().status is BackfillStatus.BLOCKED  # type: ignore[union-attr]

    pg.execute(pair.target, "UPDATE mixed SET qty = qty - 1 WHERE id = 1500")
    pg.execute(pair.target, "DELETE FROM mixed WHERE id = 2600")
    assert b.reconcile().ok and b.load().status is BackfillStatus.SUCCEEDED  # type: ignore[union-attr]
    assert pair.fingerprints()[0] == pair.fingerprints()[1]


def test_a_range_that_lacks_rows_stages_only_the_rows_the_drill_down_names(pair: Pair) -> None:
    """``on_changed="fail"``'s repair of a range compares by the one drill-down compare first:
    of a 1,000-row range that lacks two rows, only those two are staged and inserted."""
    backfill(pair).run()
    pg.execute(pair.target, "DELETE FROM mixed WHERE id IN (700, 701)")
    table = TableName("public", "mixed")
    with (
        prepared_session(pair.source, None, "source") as src,
        prepared_session(pair.target, None, "target") as tgt,
    ):
        shape = resolve_shape(src, tgt, table, table, "id")
        with tgt.transaction():
            staged = apply_missing(src, tgt, shape, None, "1000", rows=1000)
    assert (staged.relayed.rows_in, staged.inserted) == (2, 2)
    assert pair.fingerprints()[0] == pair.fingerprints()[1]


# Each change leaves a value that hashes like the original under the type's own hash function
# (PostgreSQL's "=" even calls the first three equal), but that is stored, and spelled, otherwise.
EQUAL_BUT_NOT_THE_SAME = {
    1: "UPDATE mixed SET doc = jsonb_set(doc, '{g}', '12.0') WHERE id = 12",
    2: "UPDATE mixed SET span = interval '1 day' WHERE id = 1024",  # was '24:00:00'
    3: "UPDATE mixed SET ratio = '-0' WHERE id = 2001",  # the source holds 0
    4: "UPDATE mixed SET tags = ('[0:2]=' || tags::text)::int[] WHERE id = 3001",
    5: "UPDATE mixed SET code = code || ' ' WHERE id = 4001",  # a plain change, for contrast
}
_SAME_NATIVE_HASH = """
SELECT count(*) FROM mixed m JOIN mixed_before b USING (id)
WHERE hash_record_extended(ROW(m.doc, m.span, m.ratio, m.tags, m.code), 0)
    = hash_record_extended(ROW(b.doc, b.span, b.ratio, b.tags, b.code), 0)
"""


def test_values_equal_by_their_type_but_stored_otherwise_are_differences(pair: Pair) -> None:
    pg.execute(pair.source, "UPDATE mixed SET ratio = 0 WHERE id = 2001")
    b = backfill(pair)
    assert b.run().reconciliation.ok  # type: ignore[union-attr]
    pg.execute(pair.target, "CREATE TABLE mixed_before AS SELECT * FROM mixed")
    for change in EQUAL_BUT_NOT_THE_SAME.values():
        pg.execute(pair.target, change)
    assert pg.fetch_one(pair.target, _SAME_NATIVE_HASH) == 4999  # all but the plain change
    found = b.reconcile(repair=False)
    assert [r.sequence for r in found.differing] == sorted(EQUAL_BUT_NOT_THE_SAME)
    assert all(r.source_count == r.target_count for r in found.differing)


@pytest.mark.cross_server
def test_user_defined_types_and_hostile_column_names_are_digested_alike(
    source_dsn: str, target_dsn: str
) -> None:
    table = '"T ""x"""'
    for dsn in (source_dsn, target_dsn):
        pg.execute(dsn, "CREATE TYPE \"Mood; --\" AS ENUM ('sad', 'ok', 'happy')")
        pg.execute(dsn, "CREATE DOMAIN pos AS numeric CHECK (VALUE > 0)")
        pg.execute(
            dsn,
            f'CREATE TABLE {table} ("Id" bigint PRIMARY KEY, "m""ood" "Mood; --", p pos,'
            ' n numeric, t text COLLATE "C", j json)',
        )
    pg.execute(
        source_dsn,
        f"INSERT INTO {table} SELECT g, (ARRAY['sad', 'ok', 'happy'])[1 + g %% 3]::\"Mood; --\","
        " g * 1.5, g * 1.50, 'row ' || g, json_build_object('g', g) FROM generate_series(1, 300) g",
    )
    options = BackfillOptions(batch_size=100)
    b = Backfill(source_dsn, target_dsn, 'public."T ""x"""', cursor="Id", options=options)
    result = b.run()
    assert result.reconciliation is not None and result.reconciliation.ok
    pg.execute(target_dsn, f'UPDATE {table} SET n = 150.0 WHERE "Id" = 100')  # was 150.00
    pg.execute(target_dsn, f'UPDATE {table} SET "m""ood" = \'sad\' WHERE "Id" = 151')
    pg.execute(target_dsn, f'UPDATE {table} SET j = \'{{"g":250}}\' WHERE "Id" = 250')
    found = b.reconcile(repair=False)
    assert [r.sequence for r in found.differing] == [1, 2, 3]
