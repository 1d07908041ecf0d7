"""The sinks (replace, append, merge) and a failed load, against real databases."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from dpone_dagster.postgres import (
    CopyError,
    CopyOptions,
    CopyPlanError,
    CopyProgress,
    TableName,
    copy_tables,
)
from tests.helpers import pg

STAGING_TABLES = r"SELECT relname FROM pg_class WHERE relname LIKE '\_dpone\_stg\_%%'"


class CountingReader:
    """A thread that counts a table's rows in a loop (READ COMMITTED) and records what it saw."""

    def __init__(self, dsn: str, table: str) -> None:
        self.dsn, self.table = dsn, table
        self.counts: set[int] = set()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    row = conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
                    assert row is not None
                    self.counts.add(int(row[0]))  # type: ignore[call-overload]
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> CountingReader:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("method", ["swap", "rewrite"])
def test_replace_is_atomic_for_readers(source_dsn: str, target_dsn: str, method: str) -> None:
    pg.create_mixed_table(source_dsn, rows=4000)
    pg.create_mixed_table(source_dsn, name="later", rows=3000)
    pg.create_mixed_table(target_dsn, rows=1500)
    if method == "rewrite":  # a dependent view rules out the swap: rows are replaced instead
        pg.execute(target_dsn, "CREATE VIEW public.mixed_ids AS SELECT id FROM public.mixed")

    def slow_second_table(progress: CopyProgress) -> None:
        # "mixed" is already replaced (uncommitted) while "later" loads: readers of "mixed"
        # must see the old table or wait, never an empty or a half table.
        if progress.table.name == "later" and progress.phase == "load":
            time.sleep(0.05)

    with CountingReader(target_dsn, "public.mixed") as reader:
        report = copy_tables(
            source_dsn,
            target_dsn,
            ["public.mixed", "public.later"],
            options=CopyOptions(progress=slow_second_table, progress_every=64 << 10),
        )
    assert reader.errors == []
    assert reader.counts == {1500, 4000}
    assert report.tables[0].sink_result is not None
    assert report.tables[0].sink_result.method == method
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
    if method == "rewrite":
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.mixed_ids") == 4000
    else:
        assert pg.fetch_all(
            target_dsn,
            "SELECT conname, contype::text FROM pg_constraint "
            "WHERE conrelid = 'public.mixed'::regclass",
        ) == [("mixed_pkey", "p")], "the swapped-in table keeps the key and its name"


def test_merge_inserts_new_keys_and_updates_only_changed_rows(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=1000)
    pg.create_mixed_table(target_dsn, rows=800)
    pg.execute(target_dsn, "UPDATE public.mixed SET label = 'stale' WHERE id %% 16 = 0")
    pg.create_mixed_table(target_dsn, rows=1, start=5000)
    untouched = "SELECT xmin::text FROM public.mixed WHERE id = 7"
    before = pg.fetch_one(target_dsn, untouched)
    report = copy_tables(source_dsn, target_dsn, ["public.mixed"], sink="merge")
    result = report.tables[0].sink_result
    assert result is not None
    assert (result.method, result.rows_inserted, result.rows_updated) == ("merge", 200, 50)
    assert pg.fetch_one(target_dsn, untouched) == before, "an unchanged row is not rewritten"
    pg.execute(target_dsn, "DELETE FROM public.mixed WHERE id = 5000")
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


def test_append_adds_every_row_and_fills_target_only_columns_with_defaults(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=300)
    pg.create_mixed_table(target_dsn, name="events", rows=20, start=10_000)
    pg.execute(target_dsn, "ALTER TABLE public.events ADD loaded_by text NOT NULL DEFAULT 'dpone'")
    report = copy_tables(source_dsn, target_dsn, [("public.mixed", "public.events")], sink="append")
    assert report.tables[0].sink_result is not None
    assert report.tables[0].sink_result.rows_inserted == 300
    assert pg.fetch_all(
        target_dsn,
        "SELECT count(*), count(*) FILTER (WHERE loaded_by = 'dpone') FROM public.events",
    ) == [(320, 320)]


def test_merge_needs_a_target_key_and_every_source_column_needs_a_target_column(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=10)
    pg.execute(target_dsn, "CREATE TABLE public.mixed (id bigint, label text)")
    with pytest.raises(CopyPlanError) as err:
        copy_tables(source_dsn, target_dsn, ["public.mixed"], sink="merge")
    assert err.value.code == "target_columns_mismatch"
    pg.create_mixed_table(target_dsn, name="nokey", rows=0)
    pg.execute(target_dsn, "ALTER TABLE public.nokey DROP CONSTRAINT nokey_pkey")
    with pytest.raises(CopyPlanError) as err:
        copy_tables(source_dsn, target_dsn, [("public.mixed", "public.nokey")], sink="merge")
    assert err.value.code == "merge_needs_primary_key"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.nokey") == 0


@pytest.mark.parametrize("strategy", ["whole_copy", "batched_copy", "partitioned_copy"])
def test_a_failed_load_leaves_every_target_unchanged_and_no_staging_table(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=2000)
    pg.create_mixed_table(target_dsn, rows=10)
    pg.create_mixed_table(target_dsn, name="strict", rows=0)
    pg.execute(target_dsn, "ALTER TABLE public.strict ADD CHECK (qty < 999)")
    before = pg.table_fingerprint(target_dsn, "public", "mixed")
    with pytest.raises(CopyError) as err:
        copy_tables(
            source_dsn,
            target_dsn,
            [TableName("public", "mixed"), ("public.mixed", "public.strict")],
            strategy=strategy,  # type: ignore[arg-type]
        )
    assert err.value.code == "target_load_failed"
    assert "strict_qty_check" in err.value.message
    report = err.value.report
    assert report is not None and report.outcome == "abort"
    assert all(t.terminal_receipt and t.terminal_receipt.outcome == "abort" for t in report.tables)
    assert pg.table_fingerprint(target_dsn, "public", "mixed") == before
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.strict") == 0
    assert pg.fetch_all(target_dsn, STAGING_TABLES) == []
    assert pg.open_transactions(source_dsn) == pg.open_transactions(target_dsn) == []


def test_a_commit_the_target_refuses_is_an_abort_not_an_unknown(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=100)
    pg.create_mixed_table(target_dsn, rows=1, start=5000)
    pg.execute(target_dsn, "UPDATE public.mixed SET code = 'code-7'")
    pg.execute(
        target_dsn,
        "ALTER TABLE public.mixed ADD CONSTRAINT one_code UNIQUE (code) "
        "DEFERRABLE INITIALLY DEFERRED",
    )
    before = pg.table_fingerprint(target_dsn, "public", "mixed")
    with pytest.raises(CopyError) as err:
        copy_tables(source_dsn, target_dsn, ["public.mixed"], sink="append")
    # The deferred check runs at COMMIT: the server answered, and its answer was no.
    assert err.value.code == "target_load_failed" and "one_code" in err.value.message
    assert err.value.report is not None and err.value.report.outcome == "abort"
    assert pg.table_fingerprint(target_dsn, "public", "mixed") == before
    assert pg.fetch_all(target_dsn, STAGING_TABLES) == []
