"""Whole COPY: every table ``COPY``'d whole into a file under one snapshot, then loaded.

The source is read in one ``REPEATABLE READ READ ONLY`` transaction; each table's window opens
(server clock) before its COPY starts and its receipt completes once the file is written and
counted (rows by the COPY command tag, bytes by the file's size). The read-only transaction
commits when every file is written: the source is released before the load begins. The files
are evidence: ``success`` and ``abort`` delete them, ``retain_commit_unknown`` keeps them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dpone_dagster.lifecycle import ExtractResult, TerminalOutcome
from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import (
    CopyFormat,
    copy_in_statement,
    copy_out_statement,
    select_columns,
)
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.snapshot import SnapshotSession

from .copy_progress import ProgressCallback, ProgressMeter, progress_hook
from .options import Strategy
from .strategy import ExtractionStrategy, SourceReads
from .table_artifact import TableArtifact, open_window

FILE_CHUNK = 1 << 20
"""Bytes read from a COPY file per write to the target."""


class WholeCopyArtifact(TableArtifact):
    """A table copied whole into one COPY file (binary where both ends allow) before loading.

    The file is evidence: ``success`` and ``abort`` delete it, ``retain_commit_unknown`` keeps
    it. The receipt completes once the file is written and its row count (the COPY command tag)
    and byte count (the file's size) are known.

    Args:
        table: The source table.
        columns: The columns read.
        copy_format: The file's COPY format.
        directory: Where the file goes; it is named after the artifact and registered before
            the first byte is written, so a failed extraction's partial file is released too.

    Attributes:
        path: The COPY file.
    """

    def __init__(
        self,
        table: TableName,
        columns: Sequence[Column],
        copy_format: CopyFormat | None,
        *,
        directory: str | os.PathLike[str],
    ) -> None:
        super().__init__(table, columns, copy_format)
        self.path = Path(directory) / f"{self.artifact_id}.copy"
        self.register_file(self.path)

    def write(
        self,
        session: SnapshotSession,
        *,
        progress: ProgressCallback | None = None,
        progress_every: int = 64 << 20,
    ) -> None:
        """Writes the file under ``session``'s snapshot and completes the receipt.

        The window opens (server clock) before the COPY starts; the receipt completes after
        the last byte is written and its row count (the COPY command tag) and byte count (the
        file's size) are known. The read-only transaction stays open for the caller to commit.
        """
        meter = progress_hook(progress, self.table, "extract", progress_every)
        statement = copy_out_statement(select_columns(self.table, self.columns), self.copy_format)
        open_window(self.lifecycle, session)
        cur = session.conn.cursor()
        with open(self.path, "wb") as handle, cur.copy(statement) as copy:
            for block in copy:
                handle.write(block)
                if meter is not None:
                    meter(len(block))
        self.lifecycle.complete(
            row_count=cur.rowcount,
            byte_count=self.path.stat().st_size,
            completed_at=session.clock_timestamp(),
        )

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """Streams the file into ``staging`` with ``COPY ... FROM STDIN``."""
        cur = conn.cursor()
        with (
            open(self.path, "rb") as handle,
            cur.copy(
                copy_in_statement(staging, self.columns, self.copy_format, freeze=self.freeze_load)
            ) as copy,
        ):
            while chunk := handle.read(FILE_CHUNK):
                copy.write(chunk)
                if meter is not None:
                    meter(len(chunk))
        return cur.rowcount


def extract_whole_copy(
    session: SnapshotSession,
    table: TableName,
    columns: Sequence[Column],
    directory: str | os.PathLike[str],
    *,
    copy_format: CopyFormat | None = None,
    progress: ProgressCallback | None = None,
    progress_every: int = 64 << 20,
) -> ExtractResult[WholeCopyArtifact]:
    """Copies a table whole into a COPY file under ``session``'s snapshot.

    The window opens (server clock) inside the session's
    ``REPEATABLE READ READ ONLY`` transaction before the COPY starts, the receipt completes
    after the last byte is written and counted, and the caller then commits the read-only
    transaction (``session.commit_and_close()``) once every table of the snapshot is written.

    Args:
        session: The snapshot session to read in.
        table: The source table.
        columns: The columns to read.
        directory: Where the file goes.
        copy_format: ``binary`` or ``text``; chosen from the column types when omitted.
        progress: Called as bytes are written.
        progress_every: Bytes between two progress calls.

    Returns:
        The completed artifact (on failure it is settled with ``abort`` and the error raised).
    """
    artifact = WholeCopyArtifact(table, columns, copy_format, directory=directory)
    try:
        artifact.write(session, progress=progress, progress_every=progress_every)
    except BaseException:
        artifact.abort()  # releases a partial file; nobody else holds the artifact yet
        raise
    return ExtractResult(artifact)


class WholeCopyStrategy(ExtractionStrategy):
    """Writes and receipts every table's file before the load, then commits the read."""

    name = Strategy.WHOLE_COPY

    def __init__(self, reads: SourceReads) -> None:
        super().__init__(reads)
        self.spool: Path | None = None

    def plan_reads(self) -> None:
        """Writes every table's COPY file under one snapshot, then commits the read-only
        transaction."""
        session = self.reads.open_session()
        tuning = self.reads.tuning
        if tuning.spool_dir is not None:
            directory = Path(tuning.spool_dir)
        else:
            directory = self.spool = Path(tempfile.mkdtemp(prefix="dpone-copy-"))
        for index, plan in enumerate(self.reads.plans):
            artifact = WholeCopyArtifact(
                plan.source, plan.columns, plan.copy_format, directory=directory
            )
            self.artifacts[index] = artifact
            artifact.write(session, progress=tuning.progress, progress_every=tuning.progress_every)
        session.commit_and_close()

    def settle(self, outcome: TerminalOutcome) -> None:
        """Settles every artifact; removes an emptied spool directory."""
        super().settle(outcome)
        if self.spool is not None and outcome is not TerminalOutcome.RETAIN_COMMIT_UNKNOWN:
            with contextlib.suppress(OSError):
                self.spool.rmdir()
