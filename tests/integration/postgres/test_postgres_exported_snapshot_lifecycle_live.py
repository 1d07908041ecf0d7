"""Live certification of the snapshot lifecycle against a real PostgreSQL server.

Distinct worker sessions, snapshot import, concurrent source mutation, automatic-bounds
ordering, whole-COPY timing by the server's clock, and sessions terminated mid-copy with
``pg_terminate_backend`` on either side.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.lifecycle import ReceiptState, token_digest
from dpone_dagster.postgres import ConnectionOptions, SnapshotSession, TableName
from dpone_dagster.postgres.catalog import table_columns
from dpone_dagster.postgres.snapshot import EXPORTED_SNAPSHOT, POSTGRES_CLOCK
from dpone_dagster.snapshot_copy import (
    CopyError,
    CopyOptions,
    CopyProgress,
    CopyReport,
    SnapshotCopyOptions,
    copy_tables,
)
from dpone_dagster.snapshot_copy.partitioned_copy import PartitionedCopy
from tests.helpers import locks, pg

STRATEGIES = ["whole_copy", "stream_rows", "batched_copy", "partitioned_copy"]
SOURCE_APP, TARGET_APP = "dpone-cert-source", "dpone-cert-target"
STAGING_TABLES = r"SELECT relname FROM pg_class WHERE relname LIKE '\_dpone\_stg\_%%'"
ORDERS, ITEMS = TableName("public", "mixed"), TableName("Shop Floor", "Items")
pytestmark = pytest.mark.cross_server


def _fingerprint(dsn: str, table: TableName) -> tuple[int, str]:
    return pg.table_fingerprint(dsn, table.schema, table.name)


def _two_tables(dsn: str, rows: int) -> None:
    pg.create_mixed_table(dsn, rows=rows)
    pg.create_mixed_table(dsn, ITEMS.schema, ITEMS.name, rows=rows // 2)


def test_workers_are_distinct_sessions_that_import_one_snapshot_and_split_it_in_order(
    source_dsn: str, target_dsn: str
) -> None:
    _two_tables(source_dsn, 3000)
    expected = {t: _fingerprint(source_dsn, t) for t in (ORDERS, ITEMS)}
    coordinator = SnapshotSession.open(source_dsn, export=True)
    # Committed after the export: no worker and no bound may see any of it.
    pg.execute(source_dsn, "DELETE FROM public.mixed WHERE id <= 10 OR id > 2990")
    pg.create_mixed_table(source_dsn, rows=500, start=100_000)
    pg.execute(source_dsn, 'UPDATE "Shop Floor"."Items" SET label = \'moved\'')
    copy = PartitionedCopy(coordinator, workers=2)
    stagings = []
    with psycopg.connect(source_dsn) as conn:
        for table in (ORDERS, ITEMS):
            copy.add_table(table, table_columns(conn, table), key=["id"])
            stagings.append(TableName("public", f"staged_{table.name.lower()}"))
    pg.create_mixed_table(target_dsn, name=stagings[0].name, rows=0)
    pg.create_mixed_table(target_dsn, name=stagings[1].name, rows=0)
    copy.run(target_dsn, stagings)

    coordinator_pid = coordinator.backend_pid
    pids = set().union(*(a.worker_pids for a in copy.artifacts))
    assert len(pids) == 2 and coordinator_pid not in pids, "two distinct worker sessions"
    for artifact, staging, table in zip(copy.artifacts, stagings, (ORDERS, ITEMS), strict=True):
        rows = expected[table][0]
        assert (artifact.bounds.minimum, artifact.bounds.maximum, artifact.bounds.count) == (
            1,
            rows,
            rows,
        ), "bounds computed inside the exported snapshot, not on the mutated table"
        ranges = artifact.ranges
        assert ranges[0].lower == 1 and ranges[-1].upper == rows
        assert all(
            a.upper is not None and b.lower == a.upper + 1 for a, b in itertools.pairwise(ranges)
        ), "ordered, contiguous, not overlapping"
        assert len(ranges) >= 2
        receipt = artifact.extraction_receipt
        assert receipt.state is ReceiptState.COMPLETED and receipt.row_count == rows
        assert receipt.snapshot_authority == EXPORTED_SNAPSHOT
        assert receipt.source_token == token_digest(coordinator.evidence.token)
        assert receipt.clock_authority == POSTGRES_CLOCK
        assert _fingerprint(target_dsn, staging) == expected[table]
    assert len(pg.open_transactions(source_dsn)) == 1, "only the coordinator, until the outcome"
    for artifact in copy.artifacts:
        assert artifact.success().source_action == "commit"
    assert pg.open_transactions(source_dsn) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_concurrent_mutation_leaves_the_target_equal_to_the_snapshot(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    _two_tables(source_dsn, 6000)
    expected = {t: _fingerprint(source_dsn, t) for t in (ORDERS, ITEMS)}
    started: list[pg.ConcurrentWriter] = []
    once = threading.Lock()  # partitioned workers report progress from their own threads
    with ExitStack() as writers:

        def start_writers(progress: CopyProgress) -> None:
            # Once the copy reads (its snapshot exists), writers insert, update and delete in
            # both tables, committing while the copy is still running.
            with once:
                if started:
                    return
                started[:] = [
                    writers.enter_context(pg.concurrent_writer(source_dsn, t.schema, t.name))
                    for t in (ORDERS, ITEMS)
                ]
                pg.wait_until(
                    lambda: any(w.errors for w in started) or min(w.deleted for w in started) >= 5,
                    timeout=30,
                    what="both writers have committed deletes while the copy reads",
                )

        report = copy_tables(
            source_dsn,
            target_dsn,
            [ORDERS, ITEMS],
            options=SnapshotCopyOptions(strategy=strategy, batch_size=1000),  # type: ignore[arg-type]
            tuning=CopyOptions(progress=start_writers, progress_every=32 << 10),
        )
    assert report.outcome == "success"
    for table in (ORDERS, ITEMS):
        assert _fingerprint(source_dsn, table) != expected[table], "the writers changed the source"
        assert _fingerprint(target_dsn, table) == expected[table], "the target is the snapshot"
    tokens = {t.extraction_receipt.source_token for t in report.tables}  # type: ignore[union-attr]
    assert tokens == {report.source_token} and report.snapshot_label == "single_snapshot"


def test_whole_copy_timing_brackets_every_read_by_the_server_clock(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=20_000)
    pg.execute(
        source_dsn,
        "CREATE VIEW public.timed AS SELECT id, label, clock_timestamp() AS read_at FROM mixed",
    )
    report = copy_tables(source_dsn, target_dsn, ["public.timed"], strategy="whole_copy")
    receipt = report.tables[0].extraction_receipt
    assert receipt is not None and receipt.clock_authority == POSTGRES_CLOCK
    first, last = pg.fetch_all(target_dsn, "SELECT min(read_at), max(read_at) FROM public.timed")[0]
    assert receipt.snapshot_acquired_at is not None and receipt.extraction_started_at is not None
    assert receipt.snapshot_acquired_at <= receipt.extraction_started_at <= first  # type: ignore[operator]
    assert last <= receipt.extraction_completed_at, "completed after the last row was read"  # type: ignore[operator]
    assert receipt.row_count == 20_000 and receipt.byte_count


def _terminator(dsn: str, app: str, phase: str | None) -> Callable[[CopyProgress], None]:
    killed: list[int] = []

    def terminate(progress: CopyProgress) -> None:
        if not killed and phase in (None, progress.phase):
            killed.extend(pg.backends(dsn, app))
            assert killed, f"no session named {app}"
            pg.terminate(killed, dsn)

    return terminate


@pytest.fixture
def loaded_target(source_dsn: str, target_dsn: str) -> Iterator[tuple[int, str]]:
    pg.create_mixed_table(source_dsn, rows=20_000)
    pg.create_mixed_table(target_dsn, rows=10, start=7)
    yield _fingerprint(target_dsn, ORDERS)
    assert pg.fetch_all(target_dsn, STAGING_TABLES) == [], "no staging table is left"
    assert pg.open_transactions(source_dsn) == [], "no transaction stays open on the source"
    assert pg.open_transactions(target_dsn) == [], "no transaction stays open on the target"


@pytest.mark.parametrize("side", ["source", "target"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_session_terminated_mid_copy_aborts_and_leaves_the_target_unchanged(
    source_dsn: str, target_dsn: str, loaded_target: tuple[int, str], strategy: str, side: str
) -> None:
    dsn, app, phase = (
        (source_dsn, SOURCE_APP, None) if side == "source" else (target_dsn, TARGET_APP, "load")
    )
    with pytest.raises(CopyError) as err:
        copy_tables(
            source_dsn,
            target_dsn,
            ["public.mixed"],
            options=SnapshotCopyOptions(strategy=strategy, batch_size=4000),  # type: ignore[arg-type]
            tuning=CopyOptions(
                source_options=ConnectionOptions(application_name=SOURCE_APP),
                target_options=ConnectionOptions(application_name=TARGET_APP),
                progress=_terminator(dsn, app, phase),
                progress_every=256 << 10,
            ),
        )
    assert err.value.code == ("source_read_failed" if side == "source" else "target_load_failed")
    assert "terminat" in err.value.message or "closed" in err.value.message
    report = err.value.report
    assert report is not None and report.outcome == "abort"
    terminal = report.tables[0].terminal_receipt
    assert terminal is not None and terminal.outcome == "abort" and terminal.sources_closed
    assert terminal.retained_files == ()
    assert _fingerprint(target_dsn, ORDERS) == loaded_target
    assert pg.fetch_one(target_dsn, sql.SQL("SELECT count(*) FROM {}").format(ORDERS.ident)) == 10


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_interrupt_mid_copy_settles_everything_and_propagates(
    source_dsn: str,
    target_dsn: str,
    loaded_target: tuple[int, str],
    strategy: str,
    tmp_path: Path,
) -> None:
    def interrupt(progress: CopyProgress) -> None:
        # What Dagster raises to stop a step: a BaseException that `except Exception` misses.
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_tables(
            source_dsn,
            target_dsn,
            ["public.mixed"],
            strategy=strategy,  # type: ignore[arg-type]
            tuning=CopyOptions(progress=interrupt, progress_every=256 << 10, spool_dir=tmp_path),
        )
    assert list(tmp_path.iterdir()) == [], "a partial COPY file is released"
    assert _fingerprint(target_dsn, ORDERS) == loaded_target


def test_the_internal_query_reads_every_table_in_one_snapshot(source_dsn: str) -> None:
    """A writer commits rows into both tables in one transaction, over and over, while the
    internal query copies them one statement after the other. The first statement waits at a
    gate until the writer has committed more rows: one snapshot for the set means both copies
    hold the same ids; a snapshot per statement would give the second more."""
    pg.create_mixed_table(source_dsn, name="first", rows=100_000)
    pg.create_mixed_table(source_dsn, name="second", rows=10)
    pg.execute(source_dsn, 'CREATE SCHEMA "Copies"')
    app = "dpone-test-internal-snapshot"
    stop = threading.Event()
    commits: list[int] = []
    errors: list[BaseException] = []
    outcome: dict[str, CopyReport] = {}

    def write() -> None:
        try:
            with psycopg.connect(source_dsn, autocommit=True) as conn:
                next_id = 1_000_000
                while not stop.is_set():
                    with conn.transaction():
                        for table in ("first", "second"):
                            conn.execute(
                                sql.SQL("INSERT INTO {} (id, qty) VALUES (%s, 1)").format(
                                    sql.Identifier("public", table)
                                ),
                                (next_id,),
                            )
                    commits.append(next_id)
                    next_id += 1
        except BaseException as exc:
            errors.append(exc)

    def copy() -> None:
        try:
            outcome["report"] = copy_tables(
                source_dsn,
                source_dsn,
                [("public.first_gated", '"Copies".first'), ("public.second", '"Copies".second')],
                strategy="internal_query",
                tuning=CopyOptions(
                    source_options=ConnectionOptions(application_name=app),
                    target_options=ConnectionOptions(application_name=app),
                ),
            )
        except BaseException as exc:
            errors.append(exc)

    def at_gate() -> list[int]:
        return locks.lock_waiters(source_dsn, app, wait_event="advisory", query_prefix="INSERT")

    writer = threading.Thread(target=write, daemon=True)
    copier = threading.Thread(target=copy, daemon=True)
    writer.start()
    try:
        with locks.AdvisoryGate(source_dsn) as gate:
            gate.create_view("public.first_gated", over="public.first")
            pg.wait_until(lambda: errors or len(commits) >= 5, timeout=30, what="5 commits")
            copier.start()
            pg.wait_until(
                lambda: errors or at_gate(),
                timeout=30,
                what="the copy's first INSERT ... SELECT waits at the gate",
            )
            before = len(commits)
            pg.wait_until(
                lambda: errors or len(commits) >= before + 5,
                timeout=30,
                what="the writer commits while the copy's first statement waits",
            )
        copier.join(60)
        assert not copier.is_alive(), "the copy did not finish once the gate opened"
    finally:
        stop.set()
        writer.join(10)
    assert not errors, errors
    new_ids = 'SELECT array_agg(id ORDER BY id) FROM "Copies".{} WHERE id >= 1000000'
    first = pg.fetch_one(source_dsn, new_ids.format("first"))
    second = pg.fetch_one(source_dsn, new_ids.format("second"))
    assert first == second and first, "both tables were read in one snapshot"
    assert len(first) < before + 5, "rows committed while the copy ran are in neither copy"  # type: ignore[arg-type]
    report = outcome["report"]
    assert report.snapshot_label == "single_snapshot"
    receipts = [t.extraction_receipt for t in report.tables]
    assert all(r is not None and r.source_token == report.source_token for r in receipts)


def test_the_internal_query_session_terminated_mid_statement_aborts(source_dsn: str) -> None:
    """The internal query is one INSERT ... SELECT in the target session: killing that session
    while the statement runs aborts the copy, drops nothing that existed, leaves no staging."""
    pg.create_mixed_table(source_dsn, rows=5_000)
    app = "dpone-test-internal-kill"
    with locks.terminated_at_gate(source_dsn, app, "INSERT INTO") as gate:
        # The statement reads through a gate the test holds shut: it is still running (waiting
        # at the gate, as pg_stat_activity shows) when its session is terminated.
        gate.create_view("public.gated", over="public.mixed")
        with pytest.raises(CopyError) as err:
            copy_tables(
                source_dsn,
                source_dsn,
                [("public.gated", "copies.gated")],
                strategy="internal_query",
                tuning=CopyOptions(
                    source_options=ConnectionOptions(application_name=app),
                    target_options=ConnectionOptions(application_name=app),
                ),
            )
    assert err.value.code == "target_load_failed", err.value
    assert "terminat" in err.value.message or "closed" in err.value.message
    report = err.value.report
    assert report is not None and report.outcome == "abort"
    assert not pg.table_exists(source_dsn, "copies", "gated")
    assert pg.fetch_all(source_dsn, STAGING_TABLES) == [], "no staging table is left"
    assert pg.open_transactions(source_dsn) == [], "no transaction stays open"
