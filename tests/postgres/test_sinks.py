"""The sinks (replace, append, merge) and a failed load, against real databases."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.postgres import CopyPlanError, TableName
from dpone_dagster.postgres.schema_change import SchemaChangeError
from dpone_dagster.snapshot_copy import (
    CopyError,
    CopyOptions,
    CopyProgress,
    SnapshotCopyOptions,
    copy_tables,
)
from tests.helpers import locks, pg

STAGING_TABLES = r"SELECT relname FROM pg_class WHERE relname LIKE '\_dpone\_stg\_%%'"
MIXED = TableName("public", "mixed")


class Count:
    """``SELECT count(*)`` of a table, run in a thread from its own session (READ COMMITTED)."""

    def __init__(self, dsn: str, table: TableName) -> None:
        self.dsn, self.table = dsn, table
        self.pid = 0
        self.rows: int | None = None
        self.error: BaseException | None = None
        connected = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(connected,), daemon=True)
        self._thread.start()
        assert connected.wait(30), "the reader did not connect in 30s"

    def _run(self, connected: threading.Event) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                self.pid = conn.info.backend_pid
                connected.set()
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(self.table.ident)
                ).fetchone()
                self.rows = int(row[0])  # type: ignore[index, call-overload]
        except BaseException as exc:
            self.error = exc
        finally:
            connected.set()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 30) -> int:
        self._thread.join(timeout)
        assert self.done, f"the count of {self.table} did not return in {timeout}s"
        assert self.error is None and self.rows is not None, self.error
        return self.rows


@dataclass
class ReadWhileReplaced:
    """The progress hook: once ``public.later`` loads, ``public.mixed`` is already replaced in
    the copy's open transaction. It records who holds which lock on the old ``mixed``, starts a
    reader of ``mixed`` and waits (on ``pg_locks``) until that reader has its count or waits
    for a lock: the interleaving is fixed by the server's state, not by timing."""

    dsn: str
    holders: dict[int, set[str]] = field(default_factory=dict)
    reader: Count | None = None
    reader_waits_for: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, progress: CopyProgress) -> None:
        if progress.table.name != "later" or progress.phase != "load" or self.reader:
            return
        self.holders = locks.held_lock_modes(self.dsn, "public.mixed")
        reader = self.reader = Count(self.dsn, MIXED)
        pg.wait_until(
            lambda: reader.done or locks.awaited_locks(self.dsn, reader.pid),
            timeout=30,
            what="the reader of public.mixed has its count or waits for a lock",
        )
        if not reader.done:
            self.reader_waits_for = locks.awaited_locks(self.dsn, reader.pid)


# What the replacing transaction holds on the old table, and what a reader gets meanwhile:
# the swap drops it (a reader waits for the lock, then reads the new table); the rewrite
# deletes and inserts (a reader does not wait, and sees the old rows until the commit).
REPLACED = {
    "swap": ("AccessExclusiveLock", [("relation", "mixed", "AccessShareLock")], 4000),
    "rewrite": ("RowExclusiveLock", [], 1500),
}


@pytest.mark.parametrize("method", ["swap", "rewrite"])
def test_replace_is_atomic_for_readers(source_dsn: str, target_dsn: str, method: str) -> None:
    pg.create_mixed_table(source_dsn, rows=4000)
    pg.create_mixed_table(source_dsn, name="later", rows=3000)
    pg.create_mixed_table(target_dsn, rows=1500)
    if method == "rewrite":  # a dependent view rules out the swap: rows are replaced instead
        pg.execute(target_dsn, "CREATE VIEW public.mixed_ids AS SELECT id FROM public.mixed")
    hook = ReadWhileReplaced(target_dsn)
    report = copy_tables(
        source_dsn,
        target_dsn,
        ["public.mixed", "public.later"],
        tuning=CopyOptions(progress=hook, progress_every=64 << 10),
    )
    assert report.tables[0].sink_result is not None
    assert report.tables[0].sink_result.method == method
    lock, waits_for, rows = REPLACED[method]
    assert [p for p, modes in hook.holders.items() if lock in modes], (
        f"while 'later' loads, the copy's session holds {lock} on the old table: {hook.holders}"
    )
    assert hook.reader is not None and hook.reader_waits_for == waits_for
    assert hook.reader.result() == rows, "the old table or, after waiting, the new one, whole"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.mixed") == 4000
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
    if method == "rewrite":
        assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.mixed_ids") == 4000
    else:
        assert pg.fetch_all(
            target_dsn,
            # PostgreSQL 18 also lists each NOT NULL as a constraint (contype 'n').
            "SELECT conname, contype::text FROM pg_constraint "
            "WHERE conrelid = 'public.mixed'::regclass AND contype <> 'n'",
        ) == [("mixed_pkey", "p")], "the swapped-in table keeps the key and its name"


def test_replace_swaps_a_table_with_storage_parameters_and_keeps_them(
    source_dsn: str, target_dsn: str
) -> None:
    # Its own parameters go to the staging table it is swapped for; its TOAST table's would be
    # lost by a swap, so that target is rewritten in place instead, its parameters untouched.
    pg.create_mixed_table(source_dsn, rows=2000)
    pg.create_mixed_table(source_dsn, name="later", rows=500)
    pg.create_mixed_table(target_dsn, rows=300)
    pg.create_mixed_table(target_dsn, name="later", rows=100)
    pg.execute(target_dsn, "ALTER TABLE public.mixed SET (fillfactor = 70,"
                           " autovacuum_enabled = false)")  # fmt: skip
    pg.execute(target_dsn, "ALTER TABLE public.later SET (toast.autovacuum_enabled = false)")
    report = copy_tables(source_dsn, target_dsn, ["public.mixed", "public.later"])
    methods = [t.sink_result.method if t.sink_result else None for t in report.tables]
    assert methods == ["swap", "rewrite"]
    options = (
        "SELECT c.reloptions, t.reloptions FROM pg_class c LEFT JOIN pg_class t"
        " ON t.oid = c.reltoastrelid WHERE c.oid = %s::regclass"
    )
    assert pg.fetch_all(target_dsn, options, ("public.mixed",)) == [
        (["fillfactor=70", "autovacuum_enabled=false"], None)
    ]
    assert pg.fetch_all(target_dsn, options, ("public.later",)) == [
        (None, ["autovacuum_enabled=false"])
    ]
    for table in ("mixed", "later"):
        assert pg.table_fingerprint(source_dsn, "public", table) == pg.table_fingerprint(
            target_dsn, "public", table
        )


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
    with pytest.raises(SchemaChangeError) as refused:  # freeze: no column is added
        copy_tables(
            source_dsn,
            target_dsn,
            ["public.mixed"],
            options=SnapshotCopyOptions(schema_changes="freeze"),
        )
    assert refused.value.code == "schema_change_incompatible"
    assert "added 'qty' integer DEFAULT 0 (NOT NULL, as in the source)" in refused.value.message
    with pytest.raises(CopyPlanError) as err:  # evolve would add them, but there is no key
        copy_tables(source_dsn, target_dsn, ["public.mixed"], sink="merge")
    assert err.value.code == "merge_needs_primary_key"
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
