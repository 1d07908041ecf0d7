"""Copies under a snapshot the caller holds, and their reconciliation inside that snapshot."""

from __future__ import annotations

import dataclasses

import pytest
from psycopg import conninfo, sql

from dpone_dagster.lifecycle import SnapshotLabel, TerminalOutcome, token_digest
from dpone_dagster.postgres import SnapshotError, SnapshotSession, TableName
from dpone_dagster.postgres.snapshot import EXPORTED_SNAPSHOT
from dpone_dagster.reconcile import Guarantee, Proof, ReconcileError, reconcile_copy
from dpone_dagster.snapshot_copy import (
    CopyError,
    CopyOptions,
    CopyReport,
    SnapshotCopy,
    SnapshotCopyOptions,
    Strategy,
    copy_tables,
)
from tests.helpers import pg

COPY = TableName("public", "mixed_copy")
STRATEGIES = list(Strategy)


def _copy(
    source_dsn: str,
    target_dsn: str,
    token: str,
    strategy: Strategy = "batched_copy",
    **kwargs: object,
) -> CopyReport:
    options = SnapshotCopyOptions(strategy=strategy, workers=3, batch_size=700)
    return copy_tables(
        source_dsn, target_dsn, [("public.mixed", COPY)], options=options,
        tuning=CopyOptions(snapshot_token=token), **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.cross_server
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_reads_the_held_snapshot_and_reconciles_while_the_source_changes(
    source_dsn: str, target_dsn: str, strategy: Strategy
) -> None:
    pg.create_mixed_table(source_dsn, rows=4000)
    target_dsn = source_dsn if strategy == "internal_query" else target_dsn
    with SnapshotSession.open(source_dsn, export=True) as held:
        writer = pg.ConcurrentWriter(source_dsn).start()
        try:
            writer.wait_for_writes(30)  # the source moved on before the copy began
            report = _copy(source_dsn, target_dsn, held.token, strategy)
            writer.wait_for_writes(writer.writes + 30)
            results = reconcile_copy(source_dsn, target_dsn, report, held.token)
        finally:
            writer.stop()
        assert report.outcome is TerminalOutcome.SUCCESS
        assert report.snapshot_label is SnapshotLabel.SINGLE_SNAPSHOT
        assert report.source_token == token_digest(held.token)
        receipt = report.tables[0].extraction_receipt
        assert receipt is not None and receipt.snapshot_authority == EXPORTED_SNAPSHOT
        assert receipt.source_token == token_digest(held.token)
        assert report.tables[0].rows_loaded == receipt.row_count == 4000
        [result] = results
        assert result.guarantee is Guarantee.EQUAL and result.passed, result.detail
        assert result.source == result.target and result.source.count == 4000
        # The load vouched for every row it wrote: proven without hashing, but as text rows.
        exact = strategy is not Strategy.STREAM_ROWS
        assert result.proof is (Proof.ROW_VERSIONS if exact else Proof.CONTENT_HASH)
        assert (result.source_table, result.target_table) == (TableName("public", "mixed"), COPY)
        # The source itself has moved on: only the held snapshot equals the target.
        now = pg.table_fingerprint(source_dsn, "public", "mixed")
        assert now != pg.table_fingerprint(target_dsn, "public", "mixed_copy")
        assert [r[0] for r in pg.open_transactions(source_dsn)] == [held.backend_pid]
    assert pg.open_transactions(source_dsn) == [] and pg.open_transactions(target_dsn) == []


@pytest.mark.cross_server
@pytest.mark.parametrize(
    ("change", "target_rows", "same_digest"),
    [
        ("UPDATE public.mixed_copy SET label = label || '!' WHERE id = 17", 500, False),
        ("DELETE FROM public.mixed_copy WHERE id = 17", 499, False),
        ("INSERT INTO public.mixed_copy (id, qty) VALUES (-1, 0)", 501, False),
        ("UPDATE public.mixed_copy SET label = label WHERE id = 17", 500, True),
    ],
)
def test_a_changed_a_missing_or_an_extra_target_row_fails_the_check(
    source_dsn: str, target_dsn: str, change: str, target_rows: int, same_digest: bool
) -> None:
    pg.create_mixed_table(source_dsn, rows=500)
    with SnapshotSession.open(source_dsn, export=True) as held:
        report = _copy(source_dsn, target_dsn, held.token, "whole_copy")
        pg.execute(target_dsn, change)
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
    assert result.passed is same_digest, result.detail
    assert result.proof is Proof.CONTENT_HASH, "every change since the load voids the proof"
    assert (result.source.count, result.target.count) == (500, target_rows)
    assert (result.source.hash == result.target.hash) is same_digest
    if not same_digest:
        assert "differs from the snapshot" in result.detail


def test_a_hostile_name_table_with_a_generated_column_reconciles(
    source_dsn: str, target_dsn: str
) -> None:
    table = TableName('Sales "EU"; --', "Order Items'; DROP TABLE x")
    quote = sql.Identifier('quo"te')
    pg.execute(source_dsn, sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(table.schema)))
    pg.execute(
        source_dsn,
        sql.SQL(
            "CREATE TABLE {} ({} bigint PRIMARY KEY, {} text, {} numeric, "
            "{} numeric GENERATED ALWAYS AS ({} * 2) STORED)"
        ).format(
            table.ident, sql.Identifier("Id"), sql.Identifier("two words"), quote,
            sql.Identifier("Total"), quote,
        ),
    )  # fmt: skip
    pg.execute(
        source_dsn,
        sql.SQL("INSERT INTO {} SELECT g, 'w ' || g, g / 7.0 FROM generate_series(1, 900) g")
        .format(table.ident),
    )  # fmt: skip
    with SnapshotSession.open(source_dsn, export=True) as held:
        report = copy_tables(
            source_dsn, target_dsn, table,
            options=SnapshotCopyOptions(strategy="partitioned_copy", workers=2),
            tuning=CopyOptions(snapshot_token=held.token),
        )  # fmt: skip
        assert report.tables[0].columns == ("Id", "two words", 'quo"te')
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert result.passed and result.source.count == 900, result.detail
        change = sql.SQL("UPDATE {} SET {} = 0 WHERE {} = 3")
        pg.execute(target_dsn, change.format(table.ident, quote, sql.Identifier("Id")))
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert not result.passed and result.source.count == result.target.count == 900


SPECIAL_COLUMNS = """
    id int PRIMARY KEY, n numeric, f float8, r real, ts timestamptz, d date, t text,
    a text[], m int[], j json, b jsonb, x bytea, i interval, mood mood
"""
SPECIAL_ROWS = """
    (1, 'NaN', 'NaN', 'NaN', 'infinity', 'infinity', '', '{}', '{{1,2},{3,4}}',
     '{"a": 1,  "a": 2}', '{"k": [1, null]}', '\\x00ff', '-1 year 2 days', 'sad'),
    (2, 'Infinity', 'Infinity', '-Infinity', '-infinity', '-infinity', 'NULL',
     '{NULL,"NULL","a,b","q\\"t"}', '{NULL}', '[]', 'null', '', '0', 'happy'),
    (3, '-Infinity', '-0', '1.5e-30', '2024-02-29 23:59:59.999999+05:30', '0001-01-01 BC',
     E'tab\\there', '{"é",""}', '{-2147483648}', '"x"', '{}', '\\x', '1 mon -1 sec', NULL),
    (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
"""


@pytest.mark.cross_server
@pytest.mark.parametrize(
    "strategy", ["whole_copy", "stream_rows", "batched_copy", "partitioned_copy"]
)
def test_nulls_nan_infinity_arrays_json_and_enums_reconcile(
    source_dsn: str, target_dsn: str, strategy: Strategy
) -> None:
    for dsn in (source_dsn, target_dsn):
        pg.execute(dsn, "CREATE TYPE mood AS ENUM ('sad', 'happy')")
    pg.execute(source_dsn, f"CREATE TABLE special ({SPECIAL_COLUMNS})")
    pg.execute(source_dsn, f"INSERT INTO special VALUES {SPECIAL_ROWS}".replace("%", "%%"))
    with SnapshotSession.open(source_dsn, export=True) as held:
        report = copy_tables(
            source_dsn, target_dsn, "special", strategy=strategy,
            tuning=CopyOptions(snapshot_token=held.token),
        )  # fmt: skip
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert result.passed and result.source.count == 4, result.detail
        # json keeps its text: a whitespace change is a change.
        pg.execute(target_dsn, """UPDATE special SET j = '{"a": 1, "a": 2}' WHERE id = 1""")
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert not result.passed


def test_merge_checks_that_the_target_contains_every_snapshot_row(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=1000)
    pg.create_mixed_table(target_dsn, name="mixed_copy", rows=300, start=901)  # 901..1200
    pg.execute(target_dsn, "UPDATE mixed_copy SET label = 'stale' WHERE id BETWEEN 901 AND 950")
    with SnapshotSession.open(source_dsn, export=True) as held:
        with pg.concurrent_writer(source_dsn) as writer:
            report = _copy(source_dsn, target_dsn, held.token, sink="merge")
            writer.wait_for_writes(30)
            [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert result.guarantee is Guarantee.CONTAINS and result.passed, result.detail
        assert result.source == result.target and result.source.count == 1000
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed_copy") == 1200

        pg.execute(
            target_dsn, "UPDATE mixed_copy SET label = 'not from the source' WHERE id = 1100"
        )
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert result.passed, "a row the source does not have is outside the guarantee"

        pg.execute(target_dsn, "UPDATE mixed_copy SET qty = qty + 1 WHERE id = 5")
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert not result.passed and result.target.count == 1000
        assert "differ in value" in result.detail

        pg.execute(target_dsn, "DELETE FROM mixed_copy WHERE id IN (5, 6)")
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert not result.passed and result.target.count == 998
        assert result.detail.startswith("2 of the snapshot's 1000 keys have no row")
    assert pg.open_transactions(source_dsn) == [] and pg.open_transactions(target_dsn) == []


def test_append_checks_containment_by_key_or_counts_without_one(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=600)
    pg.create_mixed_table(target_dsn, name="mixed_copy", rows=50, start=10_001)
    pg.execute(target_dsn, f"CREATE TABLE loose ({pg.MIXED_COLUMNS.replace('PRIMARY KEY', '')})")
    pg.execute(target_dsn, "INSERT INTO loose SELECT * FROM mixed_copy")
    with SnapshotSession.open(source_dsn, export=True) as held:
        keyed = _copy(source_dsn, target_dsn, held.token, sink="append")
        [result] = reconcile_copy(source_dsn, target_dsn, keyed, held.token)
        assert result.guarantee is Guarantee.CONTAINS and result.passed, result.detail

        tuning = CopyOptions(snapshot_token=held.token)
        loose = copy_tables(
            source_dsn, target_dsn, [("public.mixed", "public.loose")], sink="append",
            tuning=tuning,
        )  # fmt: skip
        [result] = reconcile_copy(source_dsn, target_dsn, loose, held.token)
        assert result.guarantee is Guarantee.COUNTS and result.passed, result.detail
        assert (result.source.count, result.target.count) == (600, 650)
        assert "Counts only" in result.detail and "the sink inserted 600" in result.detail

        pg.execute(target_dsn, "DELETE FROM loose WHERE id > 100")
        [result] = reconcile_copy(source_dsn, target_dsn, loose, held.token)
        assert not result.passed and result.target.count < 600


def test_reconciling_from_plans_of_a_step_by_step_copy(source_dsn: str, target_dsn: str) -> None:
    pg.create_mixed_table(source_dsn, rows=300)
    with SnapshotSession.open(source_dsn, export=True) as held:
        options = SnapshotCopyOptions(strategy="stream_rows")
        tuning = CopyOptions(snapshot_token=held.token)
        with SnapshotCopy(source_dsn, target_dsn, "mixed", options=options, tuning=tuning) as c:
            c.plan()
            c.extract()
            c.load()
        [result] = reconcile_copy(source_dsn, target_dsn, c.plans, held.token)
        assert result.guarantee is Guarantee.EQUAL and result.passed, result.detail
        [result] = reconcile_copy(source_dsn, target_dsn, c.plans, held.token, sink="merge")
        assert result.guarantee is Guarantee.CONTAINS and result.passed, result.detail


def test_another_snapshot_a_closed_one_and_a_malformed_token_are_refused(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=100)
    held = SnapshotSession.open(source_dsn, export=True)
    report = _copy(source_dsn, target_dsn, held.token)
    with (
        SnapshotSession.open(source_dsn, export=True) as other,
        pytest.raises(ReconcileError) as mismatch,
    ):
        reconcile_copy(source_dsn, target_dsn, report, other.token)
    assert mismatch.value.code == "reconcile_snapshot_mismatch" and mismatch.value.next_actions

    held.rollback_and_close()
    with pytest.raises(SnapshotError) as closed:
        reconcile_copy(source_dsn, target_dsn, report, held.token)
    assert closed.value.code == "snapshot_import_failed"
    with pytest.raises(CopyError) as failed:
        _copy(source_dsn, target_dsn, held.token, sink="append")
    assert failed.value.code == "snapshot_import_failed"
    assert failed.value.report is not None
    assert failed.value.report.outcome is TerminalOutcome.ABORT
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM mixed_copy") == 100  # unchanged

    for bad in ("", token_digest(held.token), "123:456:"):
        with pytest.raises(SnapshotError) as invalid:
            CopyOptions(snapshot_token=bad)
        assert invalid.value.code == "snapshot_token_invalid"
        with pytest.raises(SnapshotError) as invalid:
            reconcile_copy(source_dsn, target_dsn, report, bad)
        assert invalid.value.code == "snapshot_token_invalid"
    assert pg.open_transactions(source_dsn) == [] and pg.open_transactions(target_dsn) == []


def test_a_report_whose_receipt_counts_other_rows_fails_even_if_the_target_matches(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=200)
    with SnapshotSession.open(source_dsn, export=True) as before:
        report = _copy(source_dsn, target_dsn, before.token)
    pg.create_mixed_table(source_dsn, rows=10, start=201)
    pg.create_mixed_table(target_dsn, name="mixed_copy", rows=10, start=201)
    # A report that lost its token digest, reconciled inside a later snapshot whose rows the
    # target happens to hold: the receipt's count (200) betrays that the copy read another one.
    anonymous = dataclasses.replace(report, source_token=None)
    with SnapshotSession.open(source_dsn, export=True) as after:
        [result] = reconcile_copy(source_dsn, target_dsn, anonymous, after.token)
    assert result.source == result.target and result.source.count == 210
    assert not result.passed
    assert "extraction receipt counts 200 rows where the snapshot holds 210" in result.detail


def test_merge_by_a_composite_text_and_timestamp_key_across_time_zones(
    source_dsn: str, target_dsn: str
) -> None:
    source_db = str(conninfo.conninfo_to_dict(source_dsn)["dbname"])
    pg.execute(
        source_dsn,
        sql.SQL("ALTER DATABASE {} SET DateStyle = 'ISO, DMY'").format(sql.Identifier(source_db)),
    )
    pg.execute(
        source_dsn,
        sql.SQL("ALTER DATABASE {} SET TimeZone = 'Asia/Tokyo'").format(sql.Identifier(source_db)),
    )
    columns = '"Region" text, "At" timestamptz, v numeric, PRIMARY KEY ("Region", "At")'
    pg.execute(source_dsn, f"CREATE TABLE events ({columns})")
    pg.execute(target_dsn, f"CREATE TABLE events ({columns})")
    rows = (
        "SELECT r, timestamptz '2024-01-03 00:00+00' + g * interval '1 day', g / 3.0 "
        "FROM generate_series(1, 40) g, unnest(ARRAY['eu', 'É \"x\"', '']) r"
    )
    pg.execute(source_dsn, f"INSERT INTO events {rows}")
    pg.execute(target_dsn, f"INSERT INTO events {rows.replace('1, 40', '30, 60')}")
    with SnapshotSession.open(source_dsn, export=True) as held:
        report = copy_tables(
            source_dsn, target_dsn, "events", sink="merge",
            tuning=CopyOptions(snapshot_token=held.token),
        )  # fmt: skip
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert result.guarantee is Guarantee.CONTAINS and result.passed, result.detail
        assert (
            result.source.count == 120
            and pg.fetch_one(target_dsn, "SELECT count(*) FROM events") == 180
        )
        pg.execute(target_dsn, "DELETE FROM events WHERE \"Region\" = '' AND v < 1")
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
        assert not result.passed and result.target.count == 118
