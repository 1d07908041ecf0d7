"""The merge sink, against real databases: one ``MERGE`` on PostgreSQL 15+ (its inserted and
updated rows split from the transaction's own counters), and the ``INSERT ... ON CONFLICT``
fallback where ``MERGE`` cannot be used or its counters do not add up.

Which statement wrote the target is read from the server: a statement trigger records the
session and the first word of its client's statement (``MERGE``, or ``WITH`` for ``WITH merged
AS (INSERT ... ON CONFLICT ...``) in ``public.sink_log``. A ``MERGE`` undone by its savepoint
takes its records with it, so the log names the statement that committed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import conninfo, sql

from dpone_dagster.postgres import SinkResult
from dpone_dagster.postgres.connection import connect
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.sinks import apply_sink
from dpone_dagster.postgres.target_plan import Sink, TableMapping, plan_tables
from dpone_dagster.snapshot_copy import CopyError, copy_tables
from tests.helpers import locks, pg

SINK_LOG = """
CREATE TABLE public.sink_log (
    moment text, session text, statement text, op text, hashjoin text, mergejoin text
);
CREATE FUNCTION public.log_sink() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.sink_log VALUES (
        TG_ARGV[0], current_setting('application_name'),
        split_part(ltrim(current_query()), ' ', 1), TG_OP,
        current_setting('enable_hashjoin'), current_setting('enable_mergejoin'));
    RETURN NULL;
END $$;
CREATE TRIGGER log_sink AFTER INSERT OR UPDATE ON {table}
FOR EACH STATEMENT EXECUTE FUNCTION public.log_sink('statement')
"""

MERGED = {("MERGE", "INSERT"), ("MERGE", "UPDATE")}
"""The log of one ``MERGE`` with both actions (its statement triggers fire for each action)."""
UPSERTED = {("WITH", "INSERT"), ("WITH", "UPDATE")}
"""The log of ``INSERT ... ON CONFLICT DO UPDATE`` (it fires INSERT and UPDATE triggers)."""

ITEMS = "CREATE TABLE public.items (id integer PRIMARY KEY, v text NOT NULL)"
# The source has keys 1..20; the target has 1..10, of which 2, 5 and 8 differ: a merge inserts
# 10 rows and updates 3.
SOURCE_ITEMS = "INSERT INTO public.items SELECT g, 'v' || g FROM generate_series(1, 20) g"
TARGET_ITEMS = (
    "INSERT INTO public.items SELECT g, CASE WHEN g IN (2, 5, 8) THEN 'old' ELSE 'v' || g END"
    " FROM generate_series(1, 10) g"
)


def log_statements(dsn: str, table: str) -> None:
    """Creates ``public.sink_log`` and the statement trigger on ``table`` that fills it."""
    pg.execute(dsn, sql.SQL(SINK_LOG).format(table=sql.SQL(table)))


def statements(dsn: str) -> set[tuple[str, str]]:
    """(first word of the statement, trigger op) of every statement of the load's session (not
    a concurrent writer's) that wrote the target."""
    rows = pg.fetch_all(
        dsn,
        "SELECT statement, op FROM public.sink_log"
        " WHERE moment = 'statement' AND session = 'dpone-dagster'",
    )
    return {(str(s), str(o)) for s, o in rows}


def merged_by(dsn: str) -> set[tuple[str, str]]:
    """The log a merge sink leaves on this server: ``MERGE`` since PostgreSQL 15."""
    return MERGED if pg.server_version(dsn) >= 15 else UPSERTED


def merge(source_dsn: str, target_dsn: str, table: str) -> SinkResult:
    """Copies ``table`` with the merge sink; what the sink did."""
    report = copy_tables(source_dsn, target_dsn, [table], sink="merge")
    result = report.tables[0].sink_result
    assert result is not None and result.method == "merge"
    return result


def counts(result: SinkResult) -> tuple[int, int]:
    """(rows inserted, rows updated)."""
    return result.rows_inserted, result.rows_updated


def set_for_new_sessions(dsn: str, setting: str, value: str) -> None:
    """``ALTER DATABASE ... SET``: every session the load opens later starts with it."""
    dbname = conninfo.conninfo_to_dict(dsn)["dbname"]
    pg.execute(
        dsn,
        sql.SQL("ALTER DATABASE {} SET {} = {}").format(
            sql.Identifier(str(dbname)), sql.Identifier(setting), sql.Literal(value)
        ),
    )


def xmins(dsn: str, table: str) -> dict[int, str]:
    """Each row's ``xmin`` by id: a row a statement rewrote has a new one."""
    rows = pg.fetch_all(dsn, sql.SQL("SELECT id, xmin::text FROM {}").format(sql.SQL(table)))
    return {int(i): str(x) for i, x in rows}  # type: ignore[call-overload]


def items(source_dsn: str, target_dsn: str) -> None:
    """``public.items``: 20 rows in the source, 10 in the target (3 of them changed)."""
    pg.execute(source_dsn, ITEMS)
    pg.execute(source_dsn, SOURCE_ITEMS)
    pg.execute(target_dsn, ITEMS)
    pg.execute(target_dsn, TARGET_ITEMS)


def same_items(source_dsn: str, target_dsn: str, where: str = "true") -> bool:
    """The rows of ``public.items`` matching ``where`` are the same in both databases."""
    query = sql.SQL("SELECT id, v FROM public.items WHERE {} ORDER BY id").format(sql.SQL(where))
    return pg.fetch_all(source_dsn, query) == pg.fetch_all(target_dsn, query)


# One change per column of the mixed table, each in 20 rows of ids 1..800 (residues mod 40 that
# are not multiples of 10: those rows have NULLs): typed-first columns and text-only ones.
CHANGES = {
    1: "small = small + 1",
    2: "qty = qty + 1",
    3: "amount = amount + 0.01",
    4: "ratio = ratio + 1",
    5: "label = label || 'x'",
    6: "code = code || 'x'",
    7: "active = NOT active",
    8: "born = born + 1",
    9: "seen_at = seen_at + interval '1 microsecond'",
    11: "happened_at = happened_at + interval '1 microsecond'",
    12: "span = span + interval '1 microsecond'",
    13: "ref = md5((id + 1)::text)::uuid",
    14: "doc = doc || '{\"x\": 1}'",
    15: "tags = tags || 0",
    16: "blob = blob || '\\x00'::bytea",
    17: "label = NULL",
}
REWRITTEN_UNCHANGED = 18
"""Rows rewritten with their own values: a new xmin, but nothing for a merge to change."""


def test_merge_counts_new_and_changed_rows_exactly_and_leaves_unchanged_rows_alone(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=1000)
    pg.create_mixed_table(target_dsn, rows=800)
    rewrite = "UPDATE public.mixed SET {} WHERE mod(id, 40) = %s"
    for residue, change in CHANGES.items():
        pg.execute(target_dsn, sql.SQL(rewrite).format(sql.SQL(change)), (residue,))
    pg.execute(target_dsn, sql.SQL(rewrite).format(sql.SQL("qty = qty")), (REWRITTEN_UNCHANGED,))
    log_statements(target_dsn, "public.mixed")
    before = xmins(target_dsn, "public.mixed")
    assert counts(merge(source_dsn, target_dsn, "public.mixed")) == (200, 20 * len(CHANGES))
    assert statements(target_dsn) == merged_by(target_dsn)
    after = xmins(target_dsn, "public.mixed")
    rewritten = {i for i in before if after[i] != before[i]}
    assert rewritten == {i for i in before if i % 40 in CHANGES}, "only changed rows are updated"
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


PRICES = "CREATE TABLE public.prices (id integer PRIMARY KEY, amount numeric, at timestamptz)"
# (id, target's row, source's row): 1 and 2 differ in the numeric's scale only (equal numbers,
# different text), 3 by a microsecond, 4 from NULL; 5 is the same instant spelled in another
# zone and 6 is identical (neither changes); 7 is new.
PRICE_ROWS = [
    (1, "1.0, '2026-01-01 10:00+00'", "1.00, '2026-01-01 10:00+00'"),
    (2, "2.50, '2026-01-01 10:00+00'", "2.5, '2026-01-01 10:00+00'"),
    (3, "3, '2026-01-01 10:00+00'", "3, '2026-01-01 10:00:00.000001+00'"),
    (4, "NULL, '2026-01-01 10:00+00'", "0, '2026-01-01 10:00+00'"),
    (5, "5, '2026-01-01 12:00+02'", "5, '2026-01-01 10:00+00'"),
    (6, "6.000, NULL", "6.000, NULL"),
    (7, None, "7, '2026-01-01 10:00+00'"),
]


@pytest.mark.parametrize("path", ["merge", "on_conflict"])
def test_a_change_of_the_text_alone_is_a_change_and_an_equal_row_is_not_rewritten(
    source_dsn: str, target_dsn: str, path: str
) -> None:
    for dsn, side in ((target_dsn, 1), (source_dsn, 2)):
        pg.execute(dsn, PRICES)
        for row in PRICE_ROWS:
            if row[side] is not None:
                values = sql.SQL("INSERT INTO public.prices VALUES ({}, {})")
                pg.execute(dsn, values.format(sql.Literal(row[0]), sql.SQL(str(row[side]))))
    if path == "on_conflict":  # counters that stay 0 rule MERGE out (see the track_counts test)
        set_for_new_sessions(target_dsn, "track_counts", "off")
    log_statements(target_dsn, "public.prices")
    before = xmins(target_dsn, "public.prices")
    assert counts(merge(source_dsn, target_dsn, "public.prices")) == (1, 4)
    assert statements(target_dsn) == (merged_by(target_dsn) if path == "merge" else UPSERTED)
    after = xmins(target_dsn, "public.prices")
    assert {i for i in before if after[i] != before[i]} == {1, 2, 3, 4}
    # The fingerprint is of each row's text: 1.00 and 1.0 differ in it.
    assert pg.table_fingerprint(source_dsn, "public", "prices") == pg.table_fingerprint(
        target_dsn, "public", "prices"
    )


PARTITIONED_ITEMS = """
CREATE TABLE public.items (id integer PRIMARY KEY, v text NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE public.items_low PARTITION OF public.items FOR VALUES FROM (MINVALUE) TO (6);
CREATE TABLE public.items_mid PARTITION OF public.items FOR VALUES FROM (6) TO (16);
CREATE TABLE public.items_high PARTITION OF public.items FOR VALUES FROM (16) TO (MAXVALUE)
"""


def partitioned_items(source_dsn: str, target_dsn: str) -> None:
    """``public.items`` as :func:`items` makes it, partitioned in the target."""
    pg.execute(source_dsn, ITEMS)
    pg.execute(source_dsn, SOURCE_ITEMS)
    pg.execute(target_dsn, PARTITIONED_ITEMS)
    pg.execute(target_dsn, TARGET_ITEMS)


def test_a_partitioned_target_is_merged_with_its_partitions_counters_summed(
    source_dsn: str, target_dsn: str
) -> None:
    partitioned_items(source_dsn, target_dsn)
    log_statements(target_dsn, "public.items")
    # Updates land in items_low (2, 5) and items_mid (8), inserts in items_mid and items_high.
    assert counts(merge(source_dsn, target_dsn, "public.items")) == (10, 3)
    assert statements(target_dsn) == merged_by(target_dsn)
    assert same_items(source_dsn, target_dsn)
    assert pg.fetch_all(
        target_dsn,
        "SELECT tableoid::regclass::text, count(*) FROM public.items GROUP BY 1 ORDER BY 1",
    ) == [("items_high", 5), ("items_low", 5), ("items_mid", 10)]


def test_a_partitioned_target_the_merge_cannot_take_gets_exact_counts_from_on_conflict(
    source_dsn: str, target_dsn: str
) -> None:
    # A partitioned target cannot return xmax: the fallback tells inserted rows by their key's
    # absence from the statement's snapshot.
    partitioned_items(source_dsn, target_dsn)
    set_for_new_sessions(target_dsn, "track_counts", "off")  # MERGE's counters stay 0
    log_statements(target_dsn, "public.items")
    assert counts(merge(source_dsn, target_dsn, "public.items")) == (10, 3)
    assert statements(target_dsn) == UPSERTED
    assert same_items(source_dsn, target_dsn)


def test_a_target_with_a_delete_rule_is_merged_by_on_conflict(
    source_dsn: str, target_dsn: str
) -> None:
    items(source_dsn, target_dsn)
    # MERGE refuses a table with any rule; ON CONFLICT only INSERT and UPDATE rules.
    pg.execute(
        target_dsn, "CREATE RULE items_deleted AS ON DELETE TO public.items DO ALSO NOTIFY gone"
    )
    log_statements(target_dsn, "public.items")
    assert counts(merge(source_dsn, target_dsn, "public.items")) == (10, 3)
    assert statements(target_dsn) == UPSERTED
    assert same_items(source_dsn, target_dsn)


@pytest.mark.parametrize("event", ["INSERT", "UPDATE"])
def test_a_target_with_an_insert_or_update_rule_fails_the_merge_and_commits_nothing(
    source_dsn: str, target_dsn: str, event: str
) -> None:
    items(source_dsn, target_dsn)
    pg.execute(
        target_dsn,
        sql.SQL("CREATE RULE items_written AS ON {} TO public.items DO ALSO NOTIFY written").format(
            sql.SQL(event)
        ),
    )
    before = pg.fetch_all(target_dsn, "SELECT id, v FROM public.items ORDER BY id")
    with pytest.raises(CopyError) as err:
        copy_tables(source_dsn, target_dsn, ["public.items"], sink="merge")
    # Neither statement can merge into it: MERGE refuses any rule, and the fallback it takes
    # is refused too (this message is ON CONFLICT's, not MERGE's).
    assert err.value.code == "target_load_failed"
    assert "ON CONFLICT clause cannot be used with table that has INSERT or UPDATE rules" in (
        err.value.message
    )
    assert pg.fetch_all(target_dsn, "SELECT id, v FROM public.items ORDER BY id") == before
    assert pg.staging_tables(target_dsn) == []


SHADOWS = """
CREATE FUNCTION public.shadow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id < 1000000 THEN
        INSERT INTO public.items VALUES (NEW.id + 1000000, 'shadow of ' || NEW.v);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER shadow AFTER INSERT ON public.items FOR EACH ROW EXECUTE FUNCTION public.shadow()
"""


def test_a_trigger_that_writes_the_target_itself_gets_the_on_conflict_counts(
    source_dsn: str, target_dsn: str
) -> None:
    items(source_dsn, target_dsn)
    pg.execute(target_dsn, SHADOWS)  # each inserted row inserts a second one: counters say 20
    log_statements(target_dsn, "public.items")
    # ON CONFLICT counts its own rows (RETURNING), not those its trigger inserted.
    assert counts(merge(source_dsn, target_dsn, "public.items")) == (10, 3)
    assert statements(target_dsn) == UPSERTED
    assert same_items(source_dsn, target_dsn, "id < 1000000")
    assert pg.fetch_all(
        target_dsn, "SELECT id, v FROM public.items WHERE id >= 1000000 ORDER BY id"
    ) == [(1000000 + g, f"shadow of v{g}") for g in range(11, 21)]


def test_with_track_counts_off_the_merge_falls_back_with_exact_counts(
    source_dsn: str, target_dsn: str
) -> None:
    items(source_dsn, target_dsn)
    set_for_new_sessions(target_dsn, "track_counts", "off")  # superuser only
    log_statements(target_dsn, "public.items")
    assert counts(merge(source_dsn, target_dsn, "public.items")) == (10, 3)
    assert statements(target_dsn) == UPSERTED, "the counters stay 0: MERGE's do not add up"
    assert same_items(source_dsn, target_dsn)


AT_COMMIT = """
CREATE CONSTRAINT TRIGGER log_commit AFTER INSERT OR UPDATE ON public.items
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.log_sink('commit')
"""


def test_the_join_methods_are_off_for_the_merge_and_restored_after_it(
    source_dsn: str, target_dsn: str
) -> None:
    items(source_dsn, target_dsn)
    # A setting other than the default: the sink restores the session's value, not 'on'.
    set_for_new_sessions(target_dsn, "enable_mergejoin", "off")
    log_statements(target_dsn, "public.items")
    pg.execute(target_dsn, AT_COMMIT)  # fires at the load's COMMIT, after every sink
    assert counts(merge(source_dsn, target_dsn, "public.items")) == (10, 3)
    assert statements(target_dsn) == merged_by(target_dsn)
    settings = "SELECT DISTINCT hashjoin, mergejoin FROM public.sink_log WHERE moment = %s"
    if pg.server_version(target_dsn) >= 15:
        assert pg.fetch_all(target_dsn, settings, ("statement",)) == [("off", "off")]
    assert pg.fetch_all(target_dsn, settings, ("commit",)) == [("on", "off")]
    assert same_items(source_dsn, target_dsn)


GATE_KEY = 4243
# The load's inserts into the target wait at the gate once MERGE has its snapshot (a BEFORE
# STATEMENT trigger fires when the statement starts to run); other sessions pass.
GATED_INSERTS = f"""
CREATE FUNCTION public.gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('application_name') = 'dpone-dagster' THEN
        PERFORM pg_advisory_xact_lock_shared({GATE_KEY});
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER gate BEFORE INSERT ON public.items FOR EACH STATEMENT EXECUTE FUNCTION public.gate()
"""


@contextmanager
def merge_in_thread(
    source_dsn: str, target_dsn: str, gate: locks.AdvisoryGate
) -> Iterator[list[object]]:
    """Runs the merge of ``public.items`` in a thread; yields the list that receives its sink
    result or its error. On leaving, the gate opens (a failed test never leaves the merge
    waiting) and the thread is joined."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(merge(source_dsn, target_dsn, "public.items"))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, name="dpone-test-merge", daemon=True)
    thread.start()
    try:
        yield outcome
    finally:
        gate.open()
        thread.join(60)
        assert not thread.is_alive(), "the merge did not end in 60s"


def waiting_load(target_dsn: str, wait_event: str) -> list[int]:
    """The load's session, when its merge statement waits for a lock of ``wait_event``."""
    statement = "MERGE" if pg.server_version(target_dsn) >= 15 else "WITH"
    return locks.lock_waiters(
        target_dsn, "dpone-dagster", wait_event=wait_event, query_prefix=statement
    )


# How the writer's row 15 (new to the target, staged with 'v15') meets the merge, and what the
# merge then did: a committed key makes MERGE's insert a unique violation (MERGE does not look
# again at a key its snapshot missed), so ON CONFLICT merges and updates that row instead; a
# key rolled back leaves MERGE to insert it.
WRITER_OUTCOMES = {
    "committed_while_gated": ((9, 4), False),
    "committed_while_merge_waits": ((9, 4), False),
    "rolled_back_while_merge_waits": ((10, 3), True),
}


@pytest.mark.parametrize("writer", list(WRITER_OUTCOMES))
def test_a_key_a_concurrent_writer_inserts_during_the_merge(
    source_dsn: str, target_dsn: str, writer: str
) -> None:
    items(source_dsn, target_dsn)
    pg.execute(target_dsn, GATED_INSERTS)
    log_statements(target_dsn, "public.items")
    with (
        locks.AdvisoryGate(target_dsn, GATE_KEY) as gate,
        merge_in_thread(source_dsn, target_dsn, gate) as outcome,
        psycopg.connect(target_dsn, application_name="dpone-test-writer") as other,
    ):
        pg.wait_until(
            lambda: waiting_load(target_dsn, "advisory"),
            timeout=30,
            what="the load's MERGE waits at the gate",
        )
        other.execute("INSERT INTO public.items VALUES (15, 'written meanwhile')")
        if writer == "committed_while_gated":
            other.commit()
            gate.open()
        else:
            gate.open()
            pg.wait_until(
                lambda: waiting_load(target_dsn, "transactionid"),
                timeout=30,
                what="the load's MERGE waits for the writer's transaction (its key 15)",
            )
            if writer == "committed_while_merge_waits":
                other.commit()
            else:
                other.rollback()
    [result] = outcome
    assert isinstance(result, SinkResult), result
    expected_counts, merged = WRITER_OUTCOMES[writer]
    assert counts(result) == expected_counts
    assert statements(target_dsn) == (merged_by(target_dsn) if merged else UPSERTED)
    assert same_items(source_dsn, target_dsn), "the staged row 15 replaced the writer's"


def test_a_changes_only_merge_writes_every_staged_row_without_comparing_it(
    source_dsn: str, target_dsn: str
) -> None:
    """``changes_only`` (a replication's netted batch): every matched row is updated, also one
    whose values equal the target's; the default merge leaves that row alone."""
    items(source_dsn, target_dsn)
    rows = pg.fetch_all(source_dsn, "SELECT id, v FROM public.items WHERE id <= 12 ORDER BY id")
    items_table = TableName("public", "items")
    for changes_only, rewritten, updated in ((False, {2, 5, 8}, 3), (True, set(range(1, 11)), 10)):
        pg.execute(target_dsn, "DELETE FROM public.items WHERE id > 10")
        pg.execute(target_dsn, "UPDATE public.items SET v = 'old' WHERE id IN (2, 5, 8)")
        pg.execute(target_dsn, "CREATE TABLE public.staged (id integer, v text)")
        staging = "COPY public.staged FROM STDIN"
        with psycopg.connect(target_dsn) as conn, conn.cursor().copy(staging) as copy:
            for row in rows:
                copy.write_row(row)
        before = xmins(target_dsn, "public.items")
        with (
            connect(source_dsn, side="source") as src,
            connect(target_dsn, side="target") as tgt,
        ):
            mapping = TableMapping(items_table, items_table)
            [plan] = plan_tables(src, tgt, [mapping], Sink.MERGE)
            staged = TableName("public", "staged")
            result = apply_sink(tgt, plan, staged, Sink.MERGE, len(rows), changes_only=changes_only)
            tgt.commit()
        after = xmins(target_dsn, "public.items")
        assert {i for i in before if after[i] != before[i]} == rewritten
        assert counts(result) == (2, updated)
        assert same_items(source_dsn, target_dsn, "id <= 12")
