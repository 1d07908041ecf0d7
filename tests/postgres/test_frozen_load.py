"""A snapshot copy writes its staging rows frozen (``COPY ... FREEZE``), against a real server."""

from __future__ import annotations

import psycopg
import pytest

from dpone_dagster.snapshot_copy import copy_tables
from tests.helpers import pg

ROWS = 3000


def explain(dsn: str, query: str, *settings: str) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``query`` in a session of its own, as text."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in settings:
            conn.execute(f"SET {setting}")
        return "\n".join(str(r[0]) for r in conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}"))


@pytest.mark.parametrize("strategy", ["batched_copy", "whole_copy", "stream_rows"])
def test_a_replace_writes_its_rows_frozen_so_their_first_read_dirties_no_page(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    """A ``replace`` (a new target, then a swap of an existing one) loads its staging table with
    ``COPY ... FREEZE``: when the load commits, its rows are frozen and their pages all-visible,
    so the first read after it (the check's, a user's), once the load's pages were written out,
    dirties no page to set hint bits, and an index-only scan fetches no heap row; a binary
    load's rows still carry the load's transaction id, so row versions prove them without
    hashing."""
    pg.create_mixed_table(source_dsn, rows=ROWS)
    for _ in ("create", "swap"):
        report = copy_tables(
            source_dsn, target_dsn, ["public.mixed"], strategy=strategy, sink="replace"
        )
        pg.execute(target_dsn, "CHECKPOINT")  # the load's pages written out: clean again
        first_read = explain(
            target_dsn,
            "SELECT count(*) FROM public.mixed",
            "enable_indexonlyscan = off",
            "enable_indexscan = off",
            "enable_bitmapscan = off",
        )
        scan = first_read.split("Seq Scan", 1)[-1].split("Planning", 1)[0]  # not the catalog's
        assert f"rows={ROWS} loops" in scan and "Buffers: shared" in scan, first_read
        assert "dirtied" not in scan, first_read
        index_only = explain(
            target_dsn,
            "SELECT count(*) FROM public.mixed WHERE id > 0",
            "enable_seqscan = off",
            "enable_bitmapscan = off",
        )
        assert "Index Only Scan" in index_only and "Heap Fetches: 0" in index_only, index_only
        evidence = report.tables[0].row_versions
        if strategy == "stream_rows":  # text: no row-version evidence to keep
            assert evidence is None
            continue
        assert evidence is not None
        written = pg.fetch_one(
            target_dsn,
            "SELECT count(*) FROM public.mixed WHERE xmin = ANY(%s::text[]::xid[])",
            ([str(x) for x in evidence.target_xids],),
        )
        assert written == ROWS
