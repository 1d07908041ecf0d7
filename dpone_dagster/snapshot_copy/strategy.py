"""The extraction strategies' one protocol.

A snapshot copy reads its tables with one of five strategies, each named the same way in the
core, the Dagster assets, the job, the component and the docs (:class:`Strategy`, the one
vocabulary, declared beside the options that name it, :mod:`.options`). Each is an
object behind one small protocol (:class:`ExtractionStrategy`): it plans its reads (what it must
read before the load: files, split bounds, a snapshot session) and opens one artifact per table,
which the load path then writes into that table's staging table. The registry
(:mod:`.registry`) picks the class for a name; each strategy lives in a module named after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import ClassVar

import psycopg
from psycopg import pq

from dpone_dagster.lifecycle import SnapshotEvidence, TerminalOutcome
from dpone_dagster.postgres.connection import Connection, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import SnapshotSession
from dpone_dagster.postgres.target_plan import TablePlan

from .options import SnapshotCopyOptions, Strategy
from .table_artifact import TableArtifact
from .tuning import CopyOptions


class SourceReads:
    """What every strategy of one copy shares: the source, the plans, and its sessions.

    Args:
        source_dsn: The source database.
        plans: The tables' plans, in copy order.
        options: The copy's options (its workers, its batch size).
        tuning: Sessions, hooks and spool; ``tuning.snapshot_token`` makes every session
            import the caller's exported snapshot instead of taking its own.

    Attributes:
        sessions: Every source session opened, for the closing backstop.
    """

    def __init__(
        self,
        source_dsn: str,
        plans: Sequence[TablePlan],
        *,
        options: SnapshotCopyOptions,
        tuning: CopyOptions,
    ) -> None:
        self.source_dsn = source_dsn
        self.plans = list(plans)
        self.options = options
        self.tuning = tuning
        self.sessions: list[SnapshotSession] = []

    def open_session(self, *, export: bool = False) -> SnapshotSession:
        """Opens a snapshot session: the caller's snapshot when one is held, else a new one.

        An imported snapshot is exported evidence, so partitioned workers can import it too.
        """
        options, token = self.tuning.source_options, self.tuning.snapshot_token
        if token is not None:
            session = SnapshotSession.import_snapshot(self.source_dsn, token, options)
        else:
            session = SnapshotSession.open(self.source_dsn, options, export=export)
        self.sessions.append(session)
        return session

    def close(self) -> None:
        """Rolls back and closes any session still open (settling closed the attached ones)."""
        for session in self.sessions:
            session.close()


class ExtractionStrategy:
    """One strategy's extraction of a set of tables, all under one snapshot.

    Subclasses set :attr:`name`, implement :meth:`_open` and, where the strategy reads ahead of
    the load, :meth:`plan_reads`.

    Args:
        reads: The copy's source side.

    Attributes:
        artifacts: One artifact per table, in plan order (None until opened).
    """

    name: ClassVar[Strategy]

    def __init__(self, reads: SourceReads) -> None:
        self.reads = reads
        self.artifacts: list[TableArtifact | None] = [None] * len(reads.plans)

    def plan_reads(self) -> None:
        """Acquires the snapshot and reads what must be read before the load (default: nothing:
        the artifacts acquire when the load opens them)."""

    def begin_load(self, target: Connection) -> None:
        """Sets the target transaction the load runs in: ``READ COMMITTED READ WRITE``."""
        set_transaction_mode(target, psycopg.IsolationLevel.READ_COMMITTED, read_only=False)

    def fill_stagings(
        self, target: Connection, target_dsn: str, stagings: Sequence[TableName]
    ) -> None:
        """Loads the staging tables from other sessions before the load's own writes (only the
        partitioned strategy does: its workers write through sessions of their own)."""

    def artifact(self, index: int) -> TableArtifact:
        """The table's artifact, opened now if the strategy opens it at the read.

        The load path asks for it right before writing its rows into the staging table it
        created in the same transaction (:mod:`~dpone_dagster.postgres.load`), so a ``COPY``
        into it writes them frozen (:attr:`~.table_artifact.TableArtifact.freeze_load`). The
        partitioned strategy's workers write committed staging tables from their own sessions,
        unfrozen; its artifact's own load writes nothing.
        """
        artifact = self.artifacts[index]
        if artifact is None:
            artifact = self.artifacts[index] = self._open(index)
        artifact.freeze_load = True
        if artifact.load_meter is None:
            tuning = self.reads.tuning
            artifact.report_progress(tuning.progress, tuning.progress_every)
        return artifact

    def _open(self, index: int) -> TableArtifact:
        raise NotImplementedError

    @property
    def evidence(self) -> SnapshotEvidence | None:
        """The evidence of the snapshot every table was read under."""
        sessions = self.reads.sessions
        return sessions[0].evidence if sessions else None

    def source_failed(self, target: Connection) -> bool:
        """True when a failure came from a source session rather than the target."""
        sources = [s.conn for s in self.reads.sessions]
        if any(c.broken for c in sources):
            return True
        if target.broken:
            return False
        errored = pq.TransactionStatus.INERROR
        return any(c.info.transaction_status == errored for c in sources) and (
            target.info.transaction_status != errored
        )

    def settle(self, outcome: TerminalOutcome) -> None:
        """Settles every artifact opened with ``outcome``."""
        for artifact in self.artifacts:
            if artifact is not None:
                artifact.settle(outcome)

    def close(self) -> None:
        """Closes every source session still open."""
        with contextlib.suppress(psycopg.Error):
            self.reads.close()
