"""The source side of a snapshot copy: one strategy's sessions and one artifact per table."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import SnapshotEvidence, TerminalOutcome

from .artifacts import TableArtifact, WholeCopyArtifact
from .batched import BatchedCopyArtifact
from .identifiers import TableName
from .internal import InternalQueryArtifact
from .options import CopyOptions
from .partitioned import PartitionedCopy
from .plan import TablePlan
from .report import Strategy
from .snapshot import LazySnapshot, SnapshotSession, read_snapshot, set_transaction_snapshot
from .streamed import StreamedRowsArtifact

_BEGIN_TARGET = sql.SQL("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
# The internal query reads the source in the target session: REPEATABLE READ gives every
# table of the set the one snapshot of that transaction.
_BEGIN_INTERNAL = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE")


class Extraction:
    """One strategy's extraction of a set of tables, all under one snapshot.

    The snapshot is the strategy's own, or the caller's when ``options.snapshot_token`` is set:
    then every source session imports that token, and so does the ``internal`` strategy's
    target session, so every table is read exactly as the caller's exporting session sees it.

    Args:
        source_dsn: The source database.
        plans: The tables' plans.
        strategy: The extraction strategy.
        workers: Worker sessions of a partitioned copy.
        options: Tuning and hooks.

    Attributes:
        artifacts: One artifact per table, in plan order (None until the strategy opens it).
        sessions: Every source session opened, for the closing backstop.
    """

    def __init__(
        self,
        source_dsn: str,
        plans: Sequence[TablePlan],
        strategy: Strategy,
        *,
        workers: int,
        options: CopyOptions,
    ) -> None:
        self.source_dsn = source_dsn
        self.plans = list(plans)
        self.strategy: Strategy = strategy
        self.workers = workers
        self.options = options
        self.artifacts: list[TableArtifact | None] = [None] * len(self.plans)
        self.sessions: list[SnapshotSession] = []
        self.partitioned: PartitionedCopy | None = None
        self.internal_evidence: SnapshotEvidence | None = None
        self.spool: Path | None = None

    def extract(self) -> None:
        """Acquires the snapshot and extracts what the strategy extracts before the load."""
        if self.strategy == "whole":
            self._extract_files()
        elif self.strategy == "batched":
            self._prepare_batches()
        elif self.strategy == "partitioned":
            self._prepare_partitions()
        elif self.strategy == "streamed":
            self._open_session()

    def begin(self, target: psycopg.Connection[tuple[object, ...]]) -> None:
        """Begins the target transaction the load runs in, with explicit isolation."""
        if self.strategy == "internal":
            target.execute(_BEGIN_INTERNAL)
            token = self.options.snapshot_token
            if token is None:
                self.internal_evidence, _ = read_snapshot(target)
            else:  # the first statement: the caller's snapshot becomes the transaction's
                self.internal_evidence = set_transaction_snapshot(target, token)
        else:
            target.execute(_BEGIN_TARGET)

    def run_workers(self, target_dsn: str, stagings: Sequence[TableName]) -> None:
        """Partitioned COPY only: the workers load the committed staging tables."""
        if self.partitioned is not None:
            self.partitioned.run(
                target_dsn,
                stagings,
                target_options=self.options.target_options,
                progress=self.options.progress,
                progress_every=self.options.progress_every,
            )

    def _open_session(self, *, export: bool = False) -> SnapshotSession:
        options, token = self.options.source_options, self.options.snapshot_token
        if token is not None:
            # An imported snapshot is exported evidence: partitioned workers import it too.
            session = SnapshotSession.import_snapshot(self.source_dsn, token, options)
        else:
            session = SnapshotSession.open(self.source_dsn, options, export=export)
        self.sessions.append(session)
        return session

    def _extract_files(self) -> None:
        session = self._open_session()
        if self.options.spool_dir is not None:
            directory = Path(self.options.spool_dir)
        else:
            directory = self.spool = Path(tempfile.mkdtemp(prefix="dpone-copy-"))
        for index, plan in enumerate(self.plans):
            artifact = WholeCopyArtifact(
                plan.source, plan.columns, plan.copy_format, directory=directory
            )
            self.artifacts[index] = artifact
            artifact.write(
                session, progress=self.options.progress, progress_every=self.options.progress_every
            )
        # Every file is written and receipted: the read-only transaction commits now.
        session.commit_and_close()

    def _prepare_batches(self) -> None:
        lazy = LazySnapshot(self._open_session)
        for index, plan in enumerate(self.plans):
            self.artifacts[index] = BatchedCopyArtifact(
                lazy,
                plan.source,
                plan.columns,
                plan.copy_format,
                key=plan.key,
                batch_rows=self.options.batch_rows,
            )

    def _prepare_partitions(self) -> None:
        self.partitioned = PartitionedCopy(self._open_session(export=True), workers=self.workers)
        for index, plan in enumerate(self.plans):
            self.artifacts[index] = self.partitioned.add_table(
                plan.source, plan.columns, key=plan.key, copy_format=plan.copy_format
            ).artifact

    def artifact(self, index: int) -> TableArtifact:
        """The table's artifact; streamed rows and internal queries open theirs at the read."""
        artifact = self.artifacts[index]
        if artifact is None:
            plan = self.plans[index]
            if self.strategy == "streamed":
                rows = StreamedRowsArtifact(
                    self.sessions[0], plan.source, plan.columns, fetch_rows=self.options.fetch_rows
                )
                self.artifacts[index] = artifact = rows
                rows.declare()
            else:
                artifact = InternalQueryArtifact(
                    plan.source, plan.columns, session_snapshot=self.internal_evidence
                )
                self.artifacts[index] = artifact
        return artifact

    @property
    def evidence(self) -> SnapshotEvidence | None:
        """The evidence of the snapshot every table was read under."""
        if self.strategy == "internal":
            return self.internal_evidence
        return self.sessions[0].evidence if self.sessions else None

    def source_failed(self, target: psycopg.Connection[tuple[object, ...]]) -> bool:
        """True when a failure came from a source session rather than the target."""
        sources = [s.conn for s in self.sessions]
        if any(c.broken for c in sources):
            return True
        if target.broken:
            return False
        errored = pq.TransactionStatus.INERROR
        return any(c.info.transaction_status == errored for c in sources) and (
            target.info.transaction_status != errored
        )

    def settle(self, outcome: TerminalOutcome) -> None:
        """Settles every artifact with ``outcome``; removes an emptied spool directory."""
        for artifact in self.artifacts:
            if artifact is not None:
                artifact.settle(outcome)
        if self.spool is not None and outcome is not TerminalOutcome.RETAIN_COMMIT_UNKNOWN:
            with contextlib.suppress(OSError):
                self.spool.rmdir()

    def close(self) -> None:
        """Rolls back and closes any session still open (settling closed the attached ones)."""
        for session in self.sessions:
            with contextlib.suppress(psycopg.Error):
                session.rollback_and_close()
