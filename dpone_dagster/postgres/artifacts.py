"""PostgreSQL extraction artifacts: one table read under a snapshot, loadable into staging.

Every artifact publishes its receipt through its lifecycle authority at the strategy's truthful
boundaries, dated by the server's ``clock_timestamp()`` (clock authority
``postgresql.clock_timestamp``): the window opens with a timestamp read *before* the first row is
read and closes with one read *after* the last byte arrived and was counted.

This module holds the shared base and the whole-COPY artifact; the other strategies live in
``streamed``, ``batched``, ``partitioned`` and ``internal``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import psycopg

from dpone_dagster.lifecycle import ExtractionArtifact, ExtractionLifecycleAuthority, ExtractResult

from .catalog import Column
from .copy import CopyFormat, copy_format_for, copy_in_statement, copy_out_statement, select_columns
from .identifiers import TableName
from .progress import ProgressCallback, ProgressMeter, progress_hook
from .snapshot import POSTGRES_CLOCK, SnapshotSession

Connection = psycopg.Connection[tuple[object, ...]]

FILE_CHUNK = 1 << 20
"""Bytes read from a COPY file per write to the target."""


class TableArtifact(ExtractionArtifact):
    """Base of the PostgreSQL artifacts: one table's rows, on their way to a staging table.

    Args:
        table: The source table.
        columns: The columns read, in order (generated columns excluded by the planner).
        copy_format: The COPY format of the rows (``binary`` unless a column needs ``text``).
        share_with: Build a view sharing another artifact's authorities.
    """

    def __init__(
        self,
        table: TableName,
        columns: Sequence[Column],
        copy_format: CopyFormat | None = None,
        *,
        share_with: ExtractionArtifact | None = None,
    ) -> None:
        super().__init__(share_with=share_with)
        self.table = table
        self.columns = tuple(columns)
        self.copy_format: CopyFormat = copy_format or copy_format_for(self.columns)

    def load_into(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        staging: TableName,
        *,
        progress: ProgressCallback | None = None,
        progress_every: int = 64 << 20,
    ) -> int:
        """Writes this artifact's rows into ``staging`` in ``conn``'s current transaction.

        Args:
            conn: The target session.
            staging: The staging table (its columns carry the same names).
            progress: Called as bytes move.
            progress_every: Bytes between two progress calls.

        Returns:
            The rows the target's command tag reported.
        """
        meter = progress_hook(progress, self.table, "load", progress_every)
        return self._load(conn, staging, meter)

    def _load(self, conn: Connection, staging: TableName, meter: ProgressMeter | None) -> int:
        """Writes the rows (the strategy's own way); ``meter`` counts the bytes, if anyone
        listens."""
        raise NotImplementedError


def open_window(
    lifecycle: ExtractionLifecycleAuthority, session: SnapshotSession
) -> ExtractionLifecycleAuthority:
    """Opens a receipt's window now, by the server's clock, and records the session's snapshot.

    Call it right before the first read: the timestamp is read first, so the window starts at
    or before the first row.
    """
    lifecycle.acquire(started_at=session.clock_timestamp(), clock_authority=POSTGRES_CLOCK)
    lifecycle.acquire_snapshot(session.evidence)
    return lifecycle


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
            cur.copy(copy_in_statement(staging, self.columns, self.copy_format)) as copy,
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

    The boundaries are the seed's: the window opens (server clock) inside the session's
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
