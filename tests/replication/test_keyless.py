"""Tables without a primary key under ``REPLICA IDENTITY FULL`` against real servers: equal rows
are inserted, updated and deleted one at a time (``replication/keyless.py``), in the batch's
order, NULL told from an empty string and 1.0 from 1.00; an unchanged TOASTed value keeps its
value; a ``kill -9`` at any moment loses and doubles nothing; a keyless table without ``FULL``
(or under ``soft`` deletes) is refused at plan time with a code."""

from __future__ import annotations

import random

import psycopg
import pytest

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.replication.changes import UNCHANGED, Update
from dpone_dagster.replication.pgoutput import decode
from tests.helpers import crash, pg
from tests.helpers.logical import OWN_SLOTS
from tests.replication.group import Group, ledger_state
from tests.replication.test_change_kinds import HOSTILE, HOSTILE_ROWS

KEYLESS = """
CREATE TABLE public.k (a int, b text, c numeric, j json);
ALTER TABLE public.k REPLICA IDENTITY FULL;
INSERT INTO public.k VALUES
 (1, 'x', 1.0, '{"v": 1}'), (1, 'x', 1.0, '{"v": 1}'), (1, 'x', 1.0, '{"v": 1}'),
 (2, NULL, NULL, NULL), (2, '', NULL, NULL), (3, 'n', 1.0, '[]'), (3, 'n', 1.00, '[]'),
 (NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL);
"""
ONE = "(SELECT ctid FROM public.k WHERE {} LIMIT 1)"


def _one(where: str) -> str:
    """The ``ctid`` of one row of ``public.k`` matching ``where`` (one of equal rows)."""
    return ONE.format(where)


def test_equal_rows_are_changed_one_at_a_time_in_the_batchs_order(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, KEYLESS)
    group = Group(src, target_dsn, ("public.k",))
    first = group.run()
    assert first.initial_copy is not None and first.initial_copy.rows_loaded == 9
    group.assert_equal()
    with psycopg.connect(src, autocommit=True) as conn:
        # One of three equal rows updated, another deleted; the third stays as it was.
        conn.execute(f"UPDATE public.k SET b = 'y' WHERE ctid = {_one('a = 1')}")
        conn.execute(f"DELETE FROM public.k WHERE ctid = {_one('a = 1 AND b = $$x$$')}")
        # NULL is not '' and 1.00 is not 1.0: the right one of each pair goes.
        conn.execute("DELETE FROM public.k WHERE a = 2 AND b IS NULL")
        conn.execute("DELETE FROM public.k WHERE a = 3 AND c::text = '1.00'")
        conn.execute(f"UPDATE public.k SET c = 9 WHERE ctid = {_one('a IS NULL')}")
        with conn.transaction():  # order inside one transaction: a row comes, changes, returns
            conn.execute("INSERT INTO public.k VALUES (5, 'a', 5, '{}'), (5, 'a', 5, '{}')")
            conn.execute(f"UPDATE public.k SET b = 'b' WHERE ctid = {_one('a = 5')}")
            conn.execute(f"UPDATE public.k SET b = 'a' WHERE ctid = {_one('a = 5 AND b = $$b$$')}")
            conn.execute(f"DELETE FROM public.k WHERE ctid = {_one('a = 5')}")
            conn.execute("INSERT INTO public.k VALUES (6, 'gone', 6, '{}')")
            conn.execute("DELETE FROM public.k WHERE a = 6")
    report = group.run()
    counts = report.tables[0]
    assert (counts.inserted, counts.updated, counts.deleted) == (3, 4, 5)
    group.assert_equal()
    assert pg.fetch_all(target_dsn, "SELECT count(*) FROM public.k WHERE a = 1 AND b = 'x'") == [
        (1,)
    ]
    assert pg.fetch_one(target_dsn, "SELECT b FROM public.k WHERE a = 2") == ""
    assert pg.fetch_one(target_dsn, "SELECT c::text FROM public.k WHERE a = 3") == "1.0"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.k WHERE a = 5") == 1
    # A TRUNCATE splits the batch: the rows before it are gone, the ones after it stay.
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute("INSERT INTO public.k VALUES (7, 'before', 7, '{}')")
        conn.execute("TRUNCATE public.k")
        conn.execute("INSERT INTO public.k VALUES (8, 'after', 8, '{}'), (8, 'after', 8, '{}')")
        conn.execute(f"DELETE FROM public.k WHERE ctid = {_one('a = 8')}")
    report = group.run()
    assert report.tables[0].truncated == 1
    group.assert_equal()
    assert pg.fetch_all(target_dsn, "SELECT a, b FROM public.k") == [(8, "after")]


def test_hostile_rows_without_a_key_are_found_by_their_values(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """The hostile types (arrays, enums, domains, NaN and infinities, bytea, json, which has no
    ``=``, intervals, escapes) name their rows exactly: every row updated, one deleted, equal
    copies inserted."""
    src = logical_source_dsn
    pg.execute(src, HOSTILE)
    pg.execute(src, "ALTER TABLE public.h DROP CONSTRAINT h_pkey, REPLICA IDENTITY FULL")
    pg.execute(src, HOSTILE_ROWS)
    group = Group(src, target_dsn, ("public.h",))
    group.run()
    pg.execute(src, HOSTILE_ROWS)  # equal copies of both rows
    pg.execute(src, "UPDATE public.h SET t = t || E'\\\\x'")
    pg.execute(src, "DELETE FROM public.h WHERE ctid = (SELECT ctid FROM public.h WHERE id = 2"
                    " LIMIT 1)")  # fmt: skip
    report = group.run()
    assert (report.tables[0].inserted, report.tables[0].updated, report.tables[0].deleted) == (
        2, 4, 1
    )  # fmt: skip
    group.assert_equal()
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.h") == 3


DOCS = """
CREATE TABLE public.docs (title text, body text);
ALTER TABLE public.docs ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE public.docs REPLICA IDENTITY FULL;
"""
BIG = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 400) g)"


def test_an_unchanged_toasted_value_under_full_takes_the_old_rows_value(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """What ``pgoutput`` sends for a keyless ``FULL`` table's update that leaves a TOASTed
    value alone: the new row still marks it unchanged (``u``), the old row carries it whole;
    the target keeps it (equal rows included)."""
    src = logical_source_dsn
    pg.execute(src, DOCS)
    pg.execute(src, f"INSERT INTO public.docs SELECT 't', {BIG} FROM generate_series(1, 2)")
    pg.execute(src, "INSERT INTO public.docs SELECT * FROM public.docs")  # equal pairs
    group = Group(src, target_dsn, ("public.docs",))
    group.run()
    pg.execute(src, "SELECT pg_create_logical_replication_slot('probe', 'pgoutput')")
    pg.execute(
        src,
        "UPDATE public.docs SET title = 'x'"
        " WHERE ctid = (SELECT ctid FROM public.docs ORDER BY body LIMIT 1)",
    )
    rows = pg.fetch_all(
        src,
        "SELECT data FROM pg_logical_slot_peek_binary_changes('probe', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'dpone_test_pub')",
    )
    pg.execute(src, "SELECT pg_drop_replication_slot('probe')")
    updates = [m for m in (decode(bytes(r[0])) for r in rows) if isinstance(m, Update)]  # type: ignore[arg-type]
    assert len(updates) == 1
    (update,) = updates
    assert update.new[1] is UNCHANGED
    assert update.old is not None and isinstance(update.old[1], bytes)
    assert len(update.old[1]) == 12800
    report = group.run()
    assert report.tables[0].updated == 1
    group.assert_equal()
    whole = "SELECT count(*) FROM public.docs WHERE length(body) = 12800"
    assert pg.fetch_one(target_dsn, whole) == 4


def test_a_column_added_between_runs_still_finds_the_old_rows(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, KEYLESS)
    group = Group(src, target_dsn, ("public.k",))
    group.run()
    pg.execute(src, "ALTER TABLE public.k ADD COLUMN d int DEFAULT 7")
    pg.execute(src, f"UPDATE public.k SET d = 8 WHERE ctid = {_one('a = 1')}")
    pg.execute(src, "DELETE FROM public.k WHERE a IS NULL")
    report = group.run()
    assert {(c.column, c.kind) for c in report.tables[0].schema_changes} == {("d", "added")}
    group.assert_equal()


def test_a_row_the_target_lost_fails_the_run_and_nothing_is_committed(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, KEYLESS)
    group = Group(src, target_dsn, ("public.k",))
    group.run()
    pg.execute(target_dsn, "DELETE FROM public.k WHERE a = 3")  # changed outside the stream
    pg.execute(src, "INSERT INTO public.k VALUES (9, 'new', 9, '{}')")
    pg.execute(src, "DELETE FROM public.k WHERE a = 3")
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "replication_row_missing"
    assert "2 of the 2 row(s)" in err.value.message
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.k WHERE a = 9") == 0
    group.run(resync=True)
    group.assert_equal()


def test_keyless_tables_without_full_identity_or_under_soft_deletes_are_refused(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.nokey (a int, b text)")
    group = Group(src, target_dsn, ("public.nokey",))
    with pytest.raises(DponeError) as err:
        group.run()  # REPLICA IDENTITY DEFAULT, no key
    assert err.value.code == "replica_identity_missing"
    pg.execute(src, "ALTER TABLE public.nokey REPLICA IDENTITY FULL")
    with pytest.raises(DponeError) as err:
        group.run(deletes="soft")
    assert err.value.code == "replication_options_invalid"
    assert "public.nokey" in err.value.message
    assert pg.fetch_one(src, OWN_SLOTS) == 0
    assert pg.fetch_one(src, "SELECT count(*) FROM pg_publication") == 0
    group.run()  # FULL and hard deletes: replicated
    # Back to DEFAULT at the source: its next change is refused where the table is planned.
    pg.execute(src, "ALTER TABLE public.nokey REPLICA IDENTITY DEFAULT")
    pg.execute(src, "INSERT INTO public.nokey VALUES (1, 'a')")
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "replica_identity_missing"
    assert "DEFAULT" in err.value.message
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.nokey") == 0


def test_an_identity_changed_from_full_inside_a_run_fails_it_and_commits_nothing(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """An update before and after ``REPLICA IDENTITY USING INDEX`` in one run's read: the second
    comes without the old row's image, and the run fails before any of it is committed."""
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.u (code text NOT NULL, n int)")
    pg.execute(src, "CREATE UNIQUE INDEX u_code ON public.u (code)")
    pg.execute(src, "ALTER TABLE public.u REPLICA IDENTITY FULL")
    pg.execute(src, "INSERT INTO public.u SELECT 'c' || g, g FROM generate_series(1, 10) g")
    group = Group(src, target_dsn, ("public.u",))
    group.run()
    before = group.rows(target_dsn, "public.u")
    pg.execute(src, "UPDATE public.u SET n = n + 100 WHERE code = 'c1'")
    pg.execute(src, "ALTER TABLE public.u REPLICA IDENTITY USING INDEX u_code")
    pg.execute(src, "UPDATE public.u SET n = n + 100 WHERE code = 'c2'")  # its new row only
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "replica_identity_missing"
    assert group.rows(target_dsn, "public.u") == before


EVENTS = """
CREATE SCHEMA shop;
CREATE TABLE shop.events (kind text, n int, note text);
ALTER TABLE shop.events REPLICA IDENTITY FULL;
INSERT INTO shop.events SELECT 'k' || g %% 50, g %% 7, NULL FROM generate_series(1, 20000) g;
"""


def _mutate(src: str, rng: random.Random, round_: int, big: bool) -> int:
    """Source transactions over ``shop.events``, each changing rows that have equal twins
    (one large one when ``big``); how many."""
    one = "(SELECT ctid FROM shop.events WHERE kind = %s LIMIT 1)"
    made = 0
    with psycopg.connect(src, autocommit=True) as conn:
        for i in range(5):
            kind = f"k{rng.randrange(50)}"
            with conn.transaction():
                conn.execute(
                    "INSERT INTO shop.events SELECT %s, 1, NULL FROM generate_series(1, 10)",
                    (kind,),
                )
                conn.execute(f"UPDATE shop.events SET note = %s WHERE ctid = {one}",
                             (f"r{round_}.{i}", kind))  # fmt: skip
                conn.execute(f"DELETE FROM shop.events WHERE ctid = {one}", (kind,))
            made += 1
        if big:  # one transaction of 20,000 changes: two staging blocks before its commit
            conn.execute(
                "INSERT INTO shop.events SELECT 'big', %s, NULL FROM generate_series(1, 20000)",
                (round_,),
            )
            made += 1
    return made


def test_kill_9_at_many_moments_applies_every_keyless_change_exactly_once(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, EVENTS)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    plan = [("copy", 1), ("timer", 1), ("copy", 2), ("apply", 1), ("commit", 1),
            ("committed", 1), ("advanced", 1), ("timer", 1), ("copy", 3)]  # fmt: skip
    expected, outcomes = 0, []
    for i, (mode, nth) in enumerate(plan):
        phase, _ = ledger_state(target_dsn)
        if i >= 2:
            made = _mutate(src, rng, i, big=True)
            expected += made if phase == "streaming" else 0
        child = crash.start_child("replication_keyless", src, target_dsn, 15_000)
        outcomes.append((mode, crash.kill_at(child, mode, nth, rng, timer=1.5, inside_copy=0.05)))
        phase, applied = ledger_state(target_dsn)
        assert applied <= expected, f"seed {seed}: {outcomes}: {applied} > {expected}"
    killed = sum(1 for _, o in outcomes if o == "killed")
    assert killed >= 6, f"seed {seed}: {outcomes}"
    group = Group(src, target_dsn, ("shop.events",), slot="dpone_crash_keyless",
                  publication="dpone_crash_keyless")  # fmt: skip
    report = group.run(batch_changes=15_000)
    assert report.initial_copy is None
    group.assert_equal()
    assert ledger_state(target_dsn) == ("streaming", expected), f"seed {seed}: {outcomes}"
    assert pg.staging_tables(target_dsn) == []
