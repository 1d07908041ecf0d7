"""Schema changes of an existing target: evolve in the load's transaction, refuse what loses data.

Every test copies a source into a target, changes the source's columns, and copies again.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from dpone_dagster.lifecycle import TerminalOutcome
from dpone_dagster.postgres import SnapshotSession
from dpone_dagster.postgres.catalog import parse_type
from dpone_dagster.postgres.schema_change import SchemaChangeError, widens
from dpone_dagster.reconcile import reconcile_copy
from dpone_dagster.snapshot_copy import CopyError, CopyOptions, SnapshotCopyOptions, copy_tables
from tests.helpers import locks, pg

FREEZE = SnapshotCopyOptions(schema_changes="freeze")
"""A copy that refuses every schema change."""

ITEMS = """
CREATE TABLE public.items (
    id bigint PRIMARY KEY,
    name varchar(40) NOT NULL,
    small smallint,
    qty integer,
    price numeric(10,2),
    ratio real,
    seen_at timestamp(3),
    code varchar(10),
    total numeric(8,2)
);
INSERT INTO public.items
SELECT g, 'item ' || g, mod(g, 100), g * 3, g * 1.25, g / 4.0,
       timestamp '2026-01-01 00:00:00.123' + g * interval '1 minute', 'c' || g, g * 2.5
FROM generate_series(1, 200) g
"""

COLUMNS = (
    "SELECT attname, format_type(atttypid, atttypmod), attnotnull,"
    " pg_get_expr(adbin, adrelid) FROM pg_attribute LEFT JOIN pg_attrdef"
    " ON adrelid = attrelid AND adnum = attnum"
    " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attname"
)


def _columns(dsn: str, table: str = "public.items") -> list[tuple[object, ...]]:
    return pg.fetch_all(dsn, COLUMNS, (table,))


def _same_rows(source_dsn: str, target_dsn: str, table: str = "items") -> None:
    assert pg.table_fingerprint(source_dsn, "public", table) == pg.table_fingerprint(
        target_dsn, "public", table
    )


def _untouched(target_dsn: str) -> tuple[object, ...]:
    return (_columns(target_dsn), pg.table_fingerprint(target_dsn, "public", "items"))


@pytest.mark.parametrize(
    ("sink", "strategy", "in_place"),
    [
        ("replace", "batched_copy", False),
        ("replace", "whole_copy", True),
        ("replace", "partitioned_copy", False),
        ("replace", "stream_rows", True),
        ("merge", "batched_copy", True),
    ],
)
def test_an_added_column_lands_with_its_data_under_every_sink(
    source_dsn: str, target_dsn: str, sink: str, strategy: str, in_place: bool
) -> None:
    pg.execute(source_dsn, ITEMS)
    copy_tables(source_dsn, target_dsn, ["public.items"], sink=sink)  # type: ignore[arg-type]
    if in_place:  # an index of its own: the target is changed in place, not swapped
        pg.execute(target_dsn, "CREATE INDEX items_name ON public.items (name)")
    pg.execute(source_dsn, "ALTER TABLE public.items ADD note text NOT NULL DEFAULT 'none'")
    pg.execute(source_dsn, "UPDATE public.items SET note = 'n' || id WHERE mod(id, 3) = 0")
    report = copy_tables(
        source_dsn, target_dsn, ["public.items"], sink=sink, strategy=strategy,  # type: ignore[arg-type]
    )  # fmt: skip
    assert report.outcome is TerminalOutcome.SUCCESS
    [change] = report.tables[0].schema_changes
    assert (change.kind, change.column, change.not_null) == ("added", "note", True)
    assert (
        change.describe() == "added 'note' text DEFAULT 'none'::text (NOT NULL, as in the source)"
    )
    assert ("note", "text", True, "'none'::text") in _columns(target_dsn)
    _same_rows(source_dsn, target_dsn)
    assert pg.staging_tables(target_dsn) == []


def test_an_added_not_null_column_without_a_default_is_nullable_where_the_target_keeps_rows(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, "CREATE TABLE public.events (id bigint, v text)")
    pg.execute(
        source_dsn, "INSERT INTO public.events SELECT g, 'v' || g FROM generate_series(1, 5) g"
    )
    copy_tables(source_dsn, target_dsn, ["public.events"], sink="append")
    pg.execute(
        source_dsn,
        "ALTER TABLE public.events ADD extra integer NOT NULL DEFAULT 7;"
        " ALTER TABLE public.events ALTER extra DROP DEFAULT",
    )
    report = copy_tables(source_dsn, target_dsn, ["public.events"], sink="append")
    [change] = report.tables[0].schema_changes
    assert (change.kind, change.not_null) == ("added", False)
    assert "nullable: NOT NULL in the source, but the target's existing rows" in change.detail
    assert ("extra", "integer", False, None) in _columns(target_dsn, "public.events")
    assert pg.fetch_all(
        target_dsn, "SELECT count(*), count(extra), sum(extra) FROM public.events"
    ) == [(10, 5, 35)]


@pytest.mark.parametrize("in_place", [False, True])
def test_each_listed_widening_is_applied_with_the_data(
    source_dsn: str, target_dsn: str, in_place: bool
) -> None:
    pg.execute(source_dsn, ITEMS)
    copy_tables(source_dsn, target_dsn, ["public.items"])
    if in_place:
        pg.execute(target_dsn, "CREATE INDEX items_name ON public.items (name)")
    pg.execute(
        source_dsn,
        "ALTER TABLE public.items ALTER name TYPE varchar(200), ALTER small TYPE integer,"
        " ALTER qty TYPE bigint, ALTER price TYPE numeric(14,2), ALTER ratio TYPE double precision,"
        " ALTER seen_at TYPE timestamp(6), ALTER code TYPE text, ALTER total TYPE numeric;"
        " INSERT INTO public.items VALUES (201, repeat('n', 150), 100000, 10000000000,"
        " 123456789012.25, 0.1, '2026-01-01 00:00:00.123456', repeat('c', 50), 1.23456789)",
    )
    report = copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
    changes = {c.column: (c.kind, c.before, c.after) for c in report.tables[0].schema_changes}
    assert changes == {
        "name": ("widened", "character varying(40)", "character varying(200)"),
        "small": ("widened", "smallint", "integer"),
        "qty": ("widened", "integer", "bigint"),
        "price": ("widened", "numeric(10,2)", "numeric(14,2)"),
        "ratio": ("widened", "real", "double precision"),
        "seen_at": ("widened", "timestamp(3) without time zone", "timestamp(6) without time zone"),
        "code": ("widened", "character varying(10)", "text"),
        "total": ("widened", "numeric(8,2)", "numeric"),
    }
    assert _columns(target_dsn) == _columns(source_dsn)
    _same_rows(source_dsn, target_dsn)


def test_a_column_dropped_from_the_source_is_kept_and_new_rows_get_null_or_its_default(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ITEMS)
    pg.execute(source_dsn, "ALTER TABLE public.items ADD flag boolean NOT NULL DEFAULT true")
    copy_tables(source_dsn, target_dsn, ["public.items"])
    pg.execute(
        source_dsn,
        "ALTER TABLE public.items DROP name, DROP flag, DROP code;"
        " INSERT INTO public.items (id, qty) VALUES (201, 1), (202, 2)",
    )
    report = copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
    changes = {c.column: c.detail for c in report.tables[0].schema_changes}
    assert changes == {
        "name": "no longer in the source: kept, its NOT NULL dropped so new rows get NULL",
        "code": "no longer in the source: kept, new rows get NULL",
        "flag": "no longer in the source: kept, new rows get its default",
    }
    assert ("name", "character varying(40)", False, None) in _columns(target_dsn)
    assert pg.fetch_all(
        target_dsn,
        "SELECT id, name, code, flag, qty FROM public.items WHERE id IN (1, 201, 202) ORDER BY id",
    ) == [(1, "item 1", "c1", True, 3), (201, None, None, True, 1), (202, None, None, True, 2)]


GATE_KEY = 4242
GATED_INSERTS = f"""
CREATE FUNCTION public.gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock_shared({GATE_KEY}); RETURN NULL; END $$;
CREATE TRIGGER gate BEFORE INSERT ON public.items
FOR EACH STATEMENT EXECUTE FUNCTION public.gate()
"""


def _gated_target(source_dsn: str, target_dsn: str) -> None:
    """A target whose inserts wait at an advisory gate: a load stops after its ALTER TABLE."""
    pg.execute(source_dsn, ITEMS)
    copy_tables(source_dsn, target_dsn, ["public.items"])
    pg.execute(target_dsn, GATED_INSERTS)
    pg.execute(source_dsn, "ALTER TABLE public.items ADD note text NOT NULL DEFAULT 'none'")
    pg.execute(source_dsn, "UPDATE public.items SET note = 'n' || id")


def test_a_reader_never_sees_the_new_column_before_its_data(
    source_dsn: str, target_dsn: str
) -> None:
    _gated_target(source_dsn, target_dsn)
    done: list[object] = []
    with locks.AdvisoryGate(target_dsn, GATE_KEY) as gate:
        load = threading.Thread(
            target=lambda: done.append(
                copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
            )
        )
        load.start()
        try:
            [pid] = pg.wait_until(
                lambda: locks.lock_waiters(target_dsn, "dpone-dagster", wait_event="advisory"),
                timeout=60,
                what="the load waits at the gate, after its ALTER TABLE",
            )
            # The load altered the table and holds it: the catalog others read has no new
            # column yet, and a reader of the table waits rather than see it empty.
            assert "AccessExclusiveLock" in locks.held_lock_modes(target_dsn, "public.items")[pid]
            assert "note" not in [c[0] for c in _columns(target_dsn)]
            with psycopg.connect(target_dsn, autocommit=True) as reader:
                reader.execute("SET lock_timeout = '200ms'")
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    reader.execute("SELECT * FROM public.items LIMIT 1")
        finally:
            gate.open()
            load.join(60)
    assert done, "the load ended"
    assert pg.fetch_all(
        target_dsn, "SELECT count(*), count(*) FILTER (WHERE note = 'n' || id) FROM public.items"
    ) == [(200, 200)]


def test_a_snapshot_reader_of_the_table_holds_the_alter_until_it_ends_and_sees_no_new_column(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ITEMS)
    copy_tables(source_dsn, target_dsn, ["public.items"])
    pg.execute(source_dsn, "ALTER TABLE public.items ADD note text NOT NULL DEFAULT 'none'")
    pg.execute(source_dsn, "UPDATE public.items SET note = 'n' || id")
    done: list[object] = []
    with psycopg.connect(target_dsn) as reader:
        reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        assert reader.execute("SELECT count(*) FROM public.items").fetchone() == (200,)
        load = threading.Thread(
            target=lambda: done.append(
                copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
            )
        )
        load.start()
        try:
            pg.wait_until(
                lambda: locks.lock_waiters(target_dsn, "dpone-dagster", wait_event="relation"),
                timeout=60,
                what="the load's ALTER TABLE waits for the reader's lock",
            )
            cursor = reader.execute("SELECT * FROM public.items LIMIT 1")
            assert cursor.description is not None
            assert "note" not in [c.name for c in cursor.description]
        finally:
            reader.commit()
            load.join(60)
    assert done, "the load ended once the reader's transaction did"
    assert pg.fetch_all(
        target_dsn, "SELECT count(*) FILTER (WHERE note = 'n' || id) FROM public.items"
    ) == [(200,)]


def test_a_load_that_fails_after_the_alter_leaves_the_old_schema_and_rows(
    source_dsn: str, target_dsn: str
) -> None:
    _gated_target(source_dsn, target_dsn)
    before = _untouched(target_dsn)
    gate = locks.terminated_at_gate(target_dsn, "dpone-dagster", "MERGE INTO")
    with gate, pytest.raises(CopyError) as caught:
        copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
    report = caught.value.report
    assert report is not None and report.outcome is TerminalOutcome.ABORT
    assert _untouched(target_dsn) == before
    assert pg.staging_tables(target_dsn) == []


@pytest.mark.parametrize(
    ("change", "listed"),
    [
        ("ALTER code TYPE integer USING 1", "'code': character varying(10) -> integer"),
        ("ALTER price TYPE numeric(10,4)", "'price': numeric(10,2) -> numeric(10,4)"),
        (
            "ALTER seen_at TYPE timestamptz(3)",
            "'seen_at': timestamp(3) without time zone -> timestamp(3) with time zone",
        ),
        ("DROP CONSTRAINT items_pkey, ADD PRIMARY KEY (id, name)", "key: (id) -> (id, name)"),
        ("RENAME id TO item_id", "'id': bigint (primary key) -> absent"),
    ],
)  # fmt: skip
def test_an_incompatible_change_is_refused_and_nothing_is_written(
    source_dsn: str, target_dsn: str, change: str, listed: str
) -> None:
    pg.execute(source_dsn, ITEMS)
    copy_tables(source_dsn, target_dsn, ["public.items"])
    pg.execute(source_dsn, "ALTER TABLE public.items ADD note text")  # evolvable, yet not applied
    pg.execute(source_dsn, f"ALTER TABLE public.items {change}")
    before = _untouched(target_dsn)
    with pytest.raises(SchemaChangeError) as caught:
        copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
    assert caught.value.code == "schema_change_incompatible"
    assert listed in caught.value.message
    assert "Nothing was written" in caught.value.message and caught.value.next_actions
    assert _untouched(target_dsn) == before
    assert pg.open_transactions(target_dsn) == [] and pg.staging_tables(target_dsn) == []


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE public.items ADD note text",
        "ALTER TABLE public.items ALTER qty TYPE bigint",
        "ALTER TABLE public.items DROP code",
    ],
)
def test_freeze_refuses_every_change(source_dsn: str, target_dsn: str, change: str) -> None:
    pg.execute(source_dsn, ITEMS)
    copy_tables(source_dsn, target_dsn, ["public.items"], options=FREEZE)
    pg.execute(source_dsn, change)
    before = _untouched(target_dsn)
    with pytest.raises(SchemaChangeError) as caught:
        copy_tables(source_dsn, target_dsn, ["public.items"], options=FREEZE)
    assert caught.value.code == "schema_change_incompatible"
    assert "schema_changes='freeze' refuses every change" in caught.value.message
    assert _untouched(target_dsn) == before
    with pytest.raises(SchemaChangeError) as unknown:
        copy_tables(
            source_dsn, target_dsn, ["public.items"],
            options=SnapshotCopyOptions(schema_changes="thaw"),  # type: ignore[arg-type]
        )  # fmt: skip
    assert unknown.value.code == "copy_options_invalid"


SPELLINGS = """
CREATE DOMAIN public.money_amount AS numeric(14,2);
CREATE TABLE public.spelled (
    id bigint PRIMARY KEY, exact numeric(14,2), via_domain public.money_amount,
    plain numeric(14,2), code varchar(40), at timestamp, narrow integer
)
"""
SPELLED_TARGET = """
CREATE DOMAIN public.price AS numeric(14,2);
CREATE TABLE public.spelled (
    id int8 PRIMARY KEY, exact numeric, via_domain numeric(14,2), plain public.price,
    code character varying(40), at timestamp(6) without time zone, narrow bigint
)
"""


@pytest.mark.parametrize("strategy", ["batched_copy", "whole_copy", "stream_rows"])
def test_equal_types_spelled_differently_are_no_change_and_pass_the_copy_check(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    pg.execute(source_dsn, SPELLINGS)
    pg.execute(
        source_dsn,
        "INSERT INTO public.spelled SELECT g, g * 1.5, g * 2.25, g / 4.0, 'c' || g,"
        " timestamp '2026-01-01' + g * interval '1 second', g FROM generate_series(1, 300) g",
    )
    pg.execute(target_dsn, SPELLED_TARGET)
    with SnapshotSession.open(source_dsn, export=True) as held:
        report = copy_tables(
            source_dsn, target_dsn, ["public.spelled"], options=FREEZE.replace(strategy=strategy),
            tuning=CopyOptions(snapshot_token=held.token),
        )  # fmt: skip
        [result] = reconcile_copy(source_dsn, target_dsn, report, held.token)
    assert report.tables[0].schema_changes == ()
    assert result.passed, result.detail
    assert result.source.count == 300


@pytest.mark.parametrize(
    ("before", "after", "widened"),
    [
        ("varchar(40)", "character varying(200)", True),
        ("character varying(40)", "text", True),
        ("varchar", "varchar(40)", False),
        ("int2", "integer", True),
        ("bigint", "integer", False),
        ("numeric(10,2)", "numeric(14,2)", True),
        ("numeric(10,2)", "numeric(14,3)", False),
        ("numeric(10)", "numeric", True),
        ("real", "float8", True),
        ("timestamp(3)", "timestamp", True),
        ("timestamptz(6)", "timestamp with time zone(3)", False),
        ("timestamp", "timestamptz", False),
        ("text", "integer", False),
        ("integer[]", "bigint[]", False),
    ],
)
def test_the_widening_rules(before: str, after: str, widened: bool) -> None:
    assert widens(parse_type(before), parse_type(after)) is widened


def test_internal_query_evolves_its_target_in_the_same_database(source_dsn: str) -> None:
    pg.execute(source_dsn, ITEMS)
    pair = [("public.items", "public.items_copy")]
    copy_tables(source_dsn, source_dsn, pair, strategy="internal_query")
    pg.execute(source_dsn, "ALTER TABLE public.items ADD note text DEFAULT 'none'")
    pg.execute(source_dsn, "UPDATE public.items SET note = 'n' || id WHERE mod(id, 2) = 0")
    report = copy_tables(source_dsn, source_dsn, pair, strategy="internal_query", sink="merge")
    [change] = report.tables[0].schema_changes
    assert (change.kind, change.column) == ("added", "note")
    assert pg.table_fingerprint(source_dsn, "public", "items") == pg.table_fingerprint(
        source_dsn, "public", "items_copy"
    )


def test_a_source_column_the_target_computes_is_refused(source_dsn: str, target_dsn: str) -> None:
    pg.execute(source_dsn, ITEMS)
    pg.execute(
        target_dsn,
        "CREATE TABLE public.items (id bigint PRIMARY KEY, name varchar(40) NOT NULL,"
        " small smallint, qty integer GENERATED ALWAYS AS (id * 3) STORED, price numeric(10,2),"
        " ratio real, seen_at timestamp(3), code varchar(10), total numeric(8,2))",
    )
    with pytest.raises(SchemaChangeError) as caught:
        copy_tables(source_dsn, target_dsn, ["public.items"])
    assert caught.value.code == "schema_change_incompatible"
    assert "'qty': generated in the target -> integer" in caught.value.message
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.items") == 0
