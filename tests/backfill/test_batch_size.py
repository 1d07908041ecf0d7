"""The batch size a backfill chooses from its table's width, once, when its run is planned."""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import Backfill, BackfillOptions, BackfillRun
from dpone_dagster.backfill.batch_size import EVIDENCE_KIND, batch_size_for
from dpone_dagster.core import EngineError
from dpone_dagster.cursor.run_rules import next_request
from dpone_dagster.postgres import BACKFILL_BATCH_SIZE
from tests.backfill.conftest import Pair, make_pair
from tests.helpers import pg

NARROW = "CREATE TABLE public.narrow (id bigint PRIMARY KEY, a integer, b text)"
FILL_NARROW = (
    "INSERT INTO public.narrow SELECT g, g %% 1000, 'n' || g FROM generate_series(1, %s) g"
)
WIDTH = """SELECT pg_table_size(c.oid), c.reltuples FROM pg_class AS c
WHERE c.oid = 'public.{}'::regclass"""
# About 1.9 KB a row of text that does not compress: far wider than the mixed table's rows.
WIDEN = """UPDATE mixed SET label = (SELECT string_agg(md5(random()::text || i || id), '')
    FROM generate_series(1, 60) i)"""


def planned_size(run: BackfillRun) -> int | None:
    found = [e.subject for e in run.evidence if e.kind == EVIDENCE_KIND]
    return int(found[0]) if found else None


SIXTY_FOUR_MIB = 64 * 1024 * 1024
"""What the docs promise a batch sized from the width reads (written here, not imported)."""


def bytes_a_row(dsn: str, table: str) -> float:
    """The server's bytes a row of ``table``: its size on disk over its estimated rows."""
    size, rows = pg.fetch_all(dsn, WIDTH.format(table))[0]
    return int(size) / float(rows)


def test_the_plan_sizes_batches_from_the_table_width_about_the_same_bytes_each(
    source_dsn: str, target_dsn: str
) -> None:
    """The plan sizes batches at about 64 MiB of the table: a narrow table's hold more rows."""
    pair = make_pair(source_dsn, target_dsn, 20_000)
    for dsn, rows in ((pair.source, 20_000), (pair.target, 0)):
        pg.execute(dsn, NARROW)
        pg.execute(dsn, FILL_NARROW, (rows,))
    pg.execute(pair.source, "ANALYZE")
    sizes = {}
    for table in ("mixed", "narrow"):
        run = Backfill(pair.source, pair.target, f"public.{table}", cursor="id").plan()
        sizes[table] = planned_size(run)
        assert sizes[table] is not None
        read = sizes[table] * bytes_a_row(pair.source, table)
        assert abs(read - SIXTY_FOUR_MIB) < 0.01 * SIXTY_FOUR_MIB, (table, read)
        assert batch_size_for(run, None) == sizes[table]
    # The same bytes a batch: a narrow row is a fraction of a mixed one, so many more a batch.
    assert sizes["narrow"] is not None and sizes["mixed"] is not None
    assert sizes["narrow"] > 4 * sizes["mixed"]


def test_a_table_of_very_wide_rows_gets_batches_of_a_thousand_rows(
    source_dsn: str, target_dsn: str
) -> None:
    """Rows of about 200 KB each (TOASTed): 64 MiB would be a few hundred rows; a batch takes
    at least 1,000."""
    pair = make_pair(source_dsn, target_dsn, 10)
    wide = "CREATE TABLE public.wide (id bigint PRIMARY KEY, t text)"
    for dsn in (pair.source, pair.target):
        pg.execute(dsn, wide)
    pg.execute(
        pair.source,
        "INSERT INTO public.wide SELECT g, (SELECT string_agg(md5(random()::text || i), '')"
        " FROM generate_series(1, 6000) i) FROM generate_series(1, 40) g",
    )
    pg.execute(pair.source, "ANALYZE public.wide")
    assert SIXTY_FOUR_MIB / bytes_a_row(pair.source, "wide") < 1_000
    run = Backfill(pair.source, pair.target, "public.wide", cursor="id").plan()
    assert planned_size(run) == 1_000


def test_every_orchestrator_of_a_run_asks_for_the_batch_size_planned_for_it(pair: Pair) -> None:
    """The size is the run's: a second orchestrator's batch is a replay after the width changed."""
    pg.execute(pair.source, "ANALYZE mixed")
    first = Backfill(pair.source, pair.target, "public.mixed", cursor="id")
    planned = first.plan()
    size = planned_size(planned)
    assert size is not None
    narrow_row = bytes_a_row(pair.source, "mixed")
    assert abs(size * narrow_row - SIXTY_FOUR_MIB) < 0.01 * SIXTY_FOUR_MIB
    # The source's rows grow wider after the plan: sized now, its batches would be smaller.
    pg.execute(pair.source, WIDEN)
    pg.execute(pair.source, "VACUUM FULL mixed")
    pg.execute(pair.source, "ANALYZE mixed")
    wide_row = bytes_a_row(pair.source, "mixed")
    assert wide_row > 4 * narrow_row
    first.run(max_batches=1)
    # A second orchestrator that read the run before the first committed asks for the same
    # batch: the same request, answered by replay (a batch sized anew would be a changed one).
    second = Backfill(pair.source, pair.target, "public.mixed", cursor="id")
    assert batch_size_for(second.plan(), second.options.batch_size) == size
    again = second.apply(next_request(planned, batch_size_for(planned, second.options.batch_size)))
    assert again.replayed and again.receipt == first.receipts()[0]
    resized = next_request(planned, int(SIXTY_FOUR_MIB / wide_row))  # sized anew
    with pytest.raises(EngineError) as err:
        second.apply(resized)
    assert err.value.code == "backfill_batch_changed"


def test_a_table_the_server_has_no_row_estimate_for_gets_the_default_and_a_given_size_wins(
    source_dsn: str, target_dsn: str
) -> None:
    """A table never analyzed gets the default batch size; a size given explicitly wins."""
    for dsn in (source_dsn, target_dsn):
        pg.execute(dsn, NARROW + " WITH (autovacuum_enabled = false)")
    pg.execute(source_dsn, FILL_NARROW, (3000,))
    assert pg.fetch_all(source_dsn, WIDTH.format("narrow"))[0][1] < 0  # never analyzed
    run = Backfill(source_dsn, target_dsn, "public.narrow", cursor="id").plan()
    assert planned_size(run) is None and batch_size_for(run, None) == BACKFILL_BATCH_SIZE
    options = BackfillOptions(batch_size=700)
    given = Backfill(source_dsn, target_dsn, "public.narrow", cursor="id", options=options)
    result = given.run()
    assert [r.observation.source_count for r in given.receipts()] == [700] * 4 + [200]
    assert result.run.progress.copied_count == 3000
