"""Staging a generic source's rows on a real PostgreSQL target, and reading them back."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import ExtractResult
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import RowStreamArtifact, SourceAdapter, StagedRows, stage_rows


def stage_and_read(
    source: SourceAdapter, dsn: str, table: TableName
) -> tuple[ExtractResult[RowStreamArtifact], StagedRows, list[tuple[Any, ...]], dict[str, str]]:
    """Stages ``source`` beside ``table``, then returns (result, staged, rows, column types).

    The staging table is read in its own transaction and rolled back (so it disappears); the
    artifact is settled ``success``.
    """
    result = source.extract()
    with psycopg.connect(dsn) as conn:
        staged = stage_rows(conn, table, result.artifact, dsn=dsn)
        rows = conn.execute(
            sql.SQL("SELECT * FROM {} ORDER BY 1").format(staged.staging.name.ident)
        ).fetchall()
        types = dict(
            conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                " WHERE attrelid = %s::regclass AND attnum > 0",
                (staged.staging.name.qualified,),
            ).fetchall()
        )
        conn.rollback()
    result.artifact.success()
    return result, staged, rows, types  # type: ignore[return-value]
