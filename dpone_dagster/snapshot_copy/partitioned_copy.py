"""Partitioned COPY: worker sessions that import one exported snapshot and copy key ranges.

A coordinator session exports its snapshot (``pg_export_snapshot()``). For every table it
computes the split bounds (``min``, ``max`` and ``count(*)`` of the first primary-key column)
inside that snapshot, so the ranges describe exactly the rows the workers will see. Each worker
is a distinct session that imports the snapshot with ``SET TRANSACTION SNAPSHOT`` and relays
ranges, from any of the tables, into the target's staging tables through its own target
session. Several tables share the one coordinator, so the whole set is read in one snapshot.

The staging tables must already be committed (workers write from their own sessions); a worker
commits its target transaction once all its ranges are loaded. The coordinator's transaction
stays open, as the artifacts' live source, until the terminal outcome.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import DponeError, ExtractResult, redact
from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.connection import (
    Connection,
    ConnectionOptions,
    connect,
    set_transaction_mode,
)
from dpone_dagster.postgres.copy import (
    CopyFormat,
    RelayResult,
    copy_in_statement,
    copy_out_statement,
    relay,
    select_columns,
)
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import SnapshotSession

from .bounds import KeyBounds, KeyRange, compute_bounds, split_column, split_ranges
from .copy_progress import ProgressCallback, ProgressMeter, progress_hook
from .options import Strategy
from .strategy import ExtractionStrategy, SourceReads
from .table_artifact import TableArtifact, open_window

RANGES_PER_WORKER = 4
"""Ranges per worker: smaller ranges balance the workers and let a failure stop them sooner."""


class PartitionedCopyError(DponeError):
    """A worker failed, or the workers' rows disagree with the snapshot's count."""


class PartitionedCopyArtifact(TableArtifact):
    """One table of a partitioned copy: its bounds, its ranges, and what the workers moved.

    Args:
        table: The source table.
        columns: The columns read.
        copy_format: The COPY format.
        column: The split column, or None to copy the table as one range.

    Attributes:
        bounds: The split bounds read inside the exported snapshot.
        ranges: The ranges the workers copy, in key order.
        worker_pids: Backend pids of the worker sessions that read this table's ranges.
        writer_xids: 64-bit ids of the worker transactions that wrote its staged rows.
        rows_read: Rows the workers' source command tags reported.
        rows_loaded: Rows the workers' target command tags reported.
        bytes_read: Bytes relayed.
    """

    def __init__(
        self,
        table: TableName,
        columns: Sequence[Column],
        copy_format: CopyFormat | None,
        column: str | None,
    ) -> None:
        super().__init__(table, columns, copy_format)
        self.bounds = KeyBounds(column, None, None, 0)
        self.ranges: tuple[KeyRange, ...] = ()
        self.worker_pids: set[int] = set()
        self.writer_xids: set[int] = set()
        self.rows_read = 0
        self.rows_loaded = 0
        self.bytes_read = 0
        self._lock = threading.Lock()

    def range_statement(self, key_range: KeyRange) -> tuple[sql.Composed, list[int]]:
        """``COPY (SELECT ... WHERE column BETWEEN lower AND upper) TO STDOUT`` and its
        parameters."""
        where, params = None, []
        if (
            self.bounds.column is not None
            and key_range.lower is not None
            and key_range.upper is not None
        ):
            where = sql.SQL("{} BETWEEN %s AND %s").format(sql.Identifier(self.bounds.column))
            params = [key_range.lower, key_range.upper]
        select = select_columns(self.table, self.columns, where=where)
        return copy_out_statement(select, self.copy_format), params

    def _record(self, pid: int, result: RelayResult) -> None:
        with self._lock:
            self.worker_pids.add(pid)
            self.rows_read += result.rows_out
            self.rows_loaded += result.rows_in
            self.bytes_read += result.bytes

    @property
    def writers(self) -> tuple[int, ...]:
        """The worker transactions that wrote the staged rows."""
        return tuple(sorted(self.writer_xids))

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """The workers already loaded the rows (:meth:`PartitionedCopy.run`): their count."""
        return self.rows_loaded


@dataclass(frozen=True)
class _Job:
    artifact: PartitionedCopyArtifact
    key_range: KeyRange
    staging: TableName
    meter: ProgressMeter | None


class PartitionedCopy:
    """A coordinator, its exported snapshot, and the tables its workers will copy.

    Args:
        coordinator: A session opened with ``SnapshotSession.open(dsn, export=True)``.
        workers: Worker sessions to run (each a distinct source and target session).
    """

    def __init__(self, coordinator: SnapshotSession, *, workers: int = 2) -> None:
        if not coordinator.exported:
            raise PartitionedCopyError(
                "snapshot_not_exported",
                "A partitioned copy needs a coordinator that exported its snapshot.",
                ["Open the coordinator with SnapshotSession.open(dsn, export=True)."],
            )
        self.coordinator = coordinator
        self.workers = max(1, workers)
        self.artifacts: list[PartitionedCopyArtifact] = []

    def add_table(
        self,
        table: TableName,
        columns: Sequence[Column],
        *,
        key: Sequence[str] = (),
        copy_format: CopyFormat | None = None,
    ) -> ExtractResult[PartitionedCopyArtifact]:
        """Opens a table's window and computes its bounds inside the exported snapshot.

        Args:
            table: The source table.
            columns: The columns to read.
            key: The primary-key columns; an integer first column is the split column.
            copy_format: ``binary`` or ``text``; chosen from the column types when omitted.
        """
        artifact = PartitionedCopyArtifact(table, columns, copy_format, split_column(columns, key))
        artifact.attach_source(self.coordinator.transaction)
        # The window opens before the bounds query, the table's first read.
        open_window(artifact.lifecycle, self.coordinator)
        artifact.bounds = compute_bounds(self.coordinator, table, artifact.bounds.column)
        artifact.ranges = tuple(split_ranges(artifact.bounds, self.workers * RANGES_PER_WORKER))
        self.artifacts.append(artifact)
        return ExtractResult(artifact)

    def run(
        self,
        target_dsn: str,
        stagings: Sequence[TableName],
        *,
        target_options: ConnectionOptions | None = None,
        progress: ProgressCallback | None = None,
        progress_every: int = 64 << 20,
    ) -> None:
        """Runs the workers: every range of every table into that table's staging table.

        Each worker imports the snapshot in its own source session and writes through its own
        target session, which it commits when its ranges are done. Afterwards every receipt
        completes (coordinator's clock) with the rows the workers read, which must equal the
        count read inside the snapshot.

        Args:
            target_dsn: The target database.
            stagings: The committed staging table of each table, in :attr:`artifacts` order.
            target_options: Options of the workers' target sessions.
            progress: Called as bytes move (per table, over all workers).
            progress_every: Bytes between two progress calls.

        Raises:
            PartitionedCopyError: ``partition_rows_mismatch`` when the rows read differ from
                the snapshot's count. A worker's own error is re-raised as it was.
        """
        jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        for artifact, staging in zip(self.artifacts, stagings, strict=True):
            meter = progress_hook(progress, artifact.table, "load", progress_every)
            for key_range in artifact.ranges:
                jobs.put(_Job(artifact, key_range, staging, meter))
        count = min(self.workers, jobs.qsize())
        shared = _Shared(jobs, target_dsn, target_options, threading.Barrier(count))
        threads = [
            threading.Thread(
                target=self._work, args=(shared,), name=f"dpone-copy-worker-{i}", daemon=True
            )
            for i in range(count)
        ]
        try:
            for thread in threads:
                thread.start()
        finally:
            for thread in threads:
                if thread.ident is not None:  # started
                    thread.join()
        errors = shared.errors
        if errors:
            raise errors[0]
        completed_at = self.coordinator.clock_timestamp()
        for artifact in self.artifacts:
            if artifact.rows_read != artifact.bounds.count:
                raise PartitionedCopyError(
                    "partition_rows_mismatch",
                    f"Workers read {artifact.rows_read} rows of {artifact.table}, but the "
                    f"snapshot counts {artifact.bounds.count}.",
                    ["Report this: the workers did not read the coordinator's snapshot."],
                )
            artifact.lifecycle.complete(
                row_count=artifact.rows_read,
                byte_count=artifact.bytes_read,
                completed_at=completed_at,
            )

    def _work(self, shared: _Shared) -> None:
        source: SnapshotSession | None = None
        target: Connection | None = None
        try:
            source = self.coordinator.worker()
            target = connect(shared.target_dsn, shared.target_options, side="target")
            set_transaction_mode(target, psycopg.IsolationLevel.READ_COMMITTED, read_only=False)
            # Every worker holds the snapshot before any takes a range: the ranges spread.
            shared.ready.wait()
            written = self._relay_ranges(source, target, shared)
            if not shared.failed.is_set():
                if written:  # the evidence of who wrote the staged rows (see .evidence)
                    row = target.execute("SELECT pg_current_xact_id()::text").fetchone()
                    assert row is not None
                    for artifact in written:
                        artifact.writer_xids.add(int(str(row[0])))
                target.commit()
                source.commit_and_close()
        except BaseException as exc:  # reported by run() in the calling thread
            shared.errors.append(_worker_failure(exc, source, target))
            shared.failed.set()
            shared.ready.abort()  # release workers still waiting for this one
        finally:
            if target is not None:
                target.close()  # after a commit: nothing open; otherwise the server rolls back
            if source is not None:
                with contextlib.suppress(psycopg.Error):  # a dead session is closed anyway
                    source.rollback_and_close()  # a no-op after commit_and_close

    @staticmethod
    def _relay_ranges(
        source: SnapshotSession, target: Connection, shared: _Shared
    ) -> set[PartitionedCopyArtifact]:
        """Relays ranges until none is left (or another worker failed); the tables written."""
        written: set[PartitionedCopyArtifact] = set()
        while not shared.failed.is_set():
            try:
                job = shared.jobs.get_nowait()
            except queue.Empty:
                break
            artifact = job.artifact
            copy_out, params = artifact.range_statement(job.key_range)
            result = relay(
                source.conn,
                copy_out,
                target,
                copy_in_statement(job.staging, artifact.columns, artifact.copy_format),
                params=params,
                on_write=job.meter,
            )
            artifact._record(source.backend_pid, result)
            written.add(artifact)
        return written


@dataclass
class _Shared:
    """What the workers of one run share."""

    jobs: queue.SimpleQueue[_Job]
    target_dsn: str = field(repr=False)  # may hold a password
    target_options: ConnectionOptions | None
    ready: threading.Barrier
    failed: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)


def _worker_failure(
    exc: BaseException,
    source: SnapshotSession | None,
    target: Connection | None,
) -> BaseException:
    """Names the side a worker's database error came from (the worker alone can tell)."""
    if not isinstance(exc, psycopg.Error):
        return exc
    source_side = (
        source is None
        or source.conn.broken
        or (
            target is not None
            and not target.broken
            and source.conn.info.transaction_status == pq.TransactionStatus.INERROR
        )
    )
    code = "source_read_failed" if source_side else "target_load_failed"
    what = "reading the source" if source_side else "loading the target"
    error = PartitionedCopyError(
        code,
        f"A partitioned-copy worker failed {what}: {redact(str(exc)).strip().rstrip('.')}.",
        ["Check the server named in the message, then run the copy again."],
    )
    error.__cause__ = exc
    return error


class PartitionedCopyStrategy(ExtractionStrategy):
    """Exports the snapshot and computes every table's bounds before the load; the workers
    then fill the committed staging tables from sessions of their own."""

    name = Strategy.PARTITIONED_COPY

    def __init__(self, reads: SourceReads) -> None:
        super().__init__(reads)
        self.partitioned: PartitionedCopy | None = None

    def plan_reads(self) -> None:
        """Exports the snapshot and reads every table's split bounds inside it."""
        self.partitioned = PartitionedCopy(
            self.reads.open_session(export=True), workers=self.reads.options.workers
        )
        for index, plan in enumerate(self.reads.plans):
            self.artifacts[index] = self.partitioned.add_table(
                plan.source, plan.columns, key=plan.key, copy_format=plan.copy_format
            ).artifact

    def fill_stagings(
        self, target: Connection, target_dsn: str, stagings: Sequence[TableName]
    ) -> None:
        """Commits the staging tables (workers write from their own sessions), runs the
        workers, and leaves ``target`` ready for the load's own transaction."""
        assert self.partitioned is not None, "plan_reads() runs first"
        target.commit()
        tuning = self.reads.tuning
        self.partitioned.run(
            target_dsn,
            stagings,
            target_options=tuning.target_options,
            progress=tuning.progress,
            progress_every=tuning.progress_every,
        )
