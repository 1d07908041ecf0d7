"""Staging a generic source's rows on the PostgreSQL target with COPY.

Rows go into the staging table through ``cursor.copy(...).write_row()``: one COPY stream per
load, never row-by-row INSERTs. Text format is used because the adapters hand over values that
PostgreSQL parses exactly in text (JSON text, bit strings, aware datetimes); psycopg escapes each
value for COPY.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import owned_staging_handle
from dpone_dagster.postgres import PostgresStagingTable, TableName, staging_name_for

from .protocol import RowStreamArtifact, SourceColumn


def staging_columns(columns: Sequence[SourceColumn]) -> sql.Composed:
    """The column list of a staging table for ``columns``: ``"a" bigint, "b" jsonb``."""
    return sql.SQL(", ").join(column.definition for column in columns)


ProgressHook = Callable[[int], None]
"""Called with the rows written so far, every ``PROGRESS_EVERY`` rows (progress, fault tests)."""

PROGRESS_EVERY = 10_000


def copy_rows(
    cursor: psycopg.Cursor[tuple[object, ...]],
    table: TableName,
    artifact: RowStreamArtifact,
    *,
    on_progress: ProgressHook | None = None,
) -> int:
    """Streams every row of ``artifact`` into ``table`` with one COPY.

    Args:
        cursor: A cursor of the target session (its transaction is the caller's).
        table: The staging table, shaped by :func:`staging_columns`.
        artifact: The pending stream; reading it opens and completes its receipt.
        on_progress: Called with the rows written so far every ``PROGRESS_EVERY`` rows.

    Returns:
        The rows the target's COPY command tag reported.
    """
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        table.ident, sql.SQL(", ").join(sql.Identifier(c.name) for c in artifact.columns)
    )
    with cursor.copy(statement) as copy:
        for written, row in enumerate(artifact.rows(), 1):
            copy.write_row(row)
            if on_progress is not None and written % PROGRESS_EVERY == 0:
                on_progress(written)
    return cursor.rowcount


@dataclass(frozen=True)
class StagedRows:
    """A staging table filled from a generic source, now owned by the caller.

    Attributes:
        staging: The staging table (the caller drops it or hands it to a sink).
        columns: The staged columns.
        copied: Rows the COPY command tag reported.
    """

    staging: PostgresStagingTable
    columns: tuple[SourceColumn, ...]
    copied: int


def stage_rows(
    conn: psycopg.Connection[tuple[object, ...]],
    target: TableName,
    artifact: RowStreamArtifact,
    *,
    dsn: str | None = None,
    on_progress: ProgressHook | None = None,
) -> StagedRows:
    """Creates a staging table beside ``target`` and fills it from ``artifact``.

    The table is created under :class:`~dpone_dagster.lifecycle.owned_staging_handle`: any
    failure before this function returns (a lost source connection, a record that fails
    validation, an interrupt) drops it.

    Args:
        conn: The target session; the staging table is created in its current transaction.
        target: The target table the rows are meant for (the staging table lives in its schema).
        artifact: The pending stream.
        dsn: The target DSN, to drop the staging table from a fresh session if ``conn`` broke.
        on_progress: See :func:`copy_rows`.

    Returns:
        The filled staging table, owned by the caller.
    """
    staging = PostgresStagingTable(
        conn, staging_name_for(target), columns=staging_columns(artifact.columns), dsn=dsn
    )
    with owned_staging_handle(staging) as guard:
        with conn.cursor() as cursor:
            copied = copy_rows(cursor, staging.name, artifact, on_progress=on_progress)
        return guard.transfer(StagedRows(staging, artifact.columns, copied))
