"""A batch whose rows may already be in the target: staged, then applied set-based.

The range is copied (same snapshot, same COPY stream, same hash) into a temporary staging table,
then new rows are inserted, rows equal to the target's are counted as duplicates, and a row that
differs is refused with ``backfill_record_changed``. The copier takes this path only when a
direct COPY meets a row that exists (a unique violation); the reconciliation's repair always
takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.copy import RelayResult, relay

from .errors import backfill_error
from .shape import TableShape

Conn = psycopg.Connection[tuple[object, ...]]

_STAGE = sql.Identifier("_dpone_backfill_stage")


@dataclass(frozen=True)
class Staged:
    """A staged apply: what the relay moved, rows inserted and existing equal rows."""

    relayed: RelayResult
    inserted: int
    duplicates: int


def _key_match(shape: TableShape, left: str, right: str) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier(left, k), sql.Identifier(right, k))
        for k in shape.key
    )


def _row_text(shape: TableShape, alias: str) -> sql.Composed:
    # Compared as text: exact spelling (1.50 is not 1.5) and works for types without "=".
    return sql.SQL("ROW({})::text").format(
        sql.SQL(", ").join(sql.Identifier(alias, c.name) for c in shape.columns)
    )


def _compare(target: Conn, shape: TableShape) -> tuple[int, int, object]:
    """Staged rows the target holds equal, those it holds different, and the first different
    key (as row text)."""
    row = target.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE {k} IS NOT NULL AND {a} = {b}),"
            " count(*) FILTER (WHERE {k} IS NOT NULL AND {a} <> {b}),"
            " min(CASE WHEN {k} IS NOT NULL AND {a} <> {b} THEN {keytext} END)"
            " FROM {stage} AS s LEFT JOIN {target} AS t ON {match}"
        ).format(
            k=sql.Identifier("t", shape.key[0]),
            a=_row_text(shape, "s"),
            b=_row_text(shape, "t"),
            keytext=sql.SQL("ROW({})::text").format(
                sql.SQL(", ").join(sql.Identifier("s", k) for k in shape.key)
            ),
            stage=_STAGE,
            target=shape.target.ident,
            match=_key_match(shape, "s", "t"),
        )
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), row[2]  # type: ignore[call-overload]


def apply_existing(
    source: Conn, target: Conn, shape: TableShape, copy_out: sql.Composed, params: Sequence[str]
) -> Staged:
    """COPY into a temporary staging table, then insert new rows and count equal ones.

    Runs in the sessions' open transactions (the source's snapshot, the target's transaction).

    Raises:
        BackfillError: ``backfill_record_changed`` when a staged row differs from the target's.
    """
    cols = column_list(shape.columns)
    target.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            _STAGE, cols, shape.target.ident
        )
    )
    relayed = relay(
        source,
        copy_out,
        target,
        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(_STAGE, cols, sql.SQL(shape.fmt)),
        params=params,
        hashed=True,
    )
    equal, changed, first_key = _compare(target, shape)
    if changed:
        raise backfill_error(
            "backfill_record_changed",
            f"{changed} row(s) of {shape.target} differ from the source (first key {first_key}).",
        )
    match = _key_match(shape, "s", "t")
    inserted = target.execute(
        sql.SQL(
            "INSERT INTO {target} ({cols}) SELECT {cols} FROM {stage} AS s"
            " WHERE NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {match})"
        ).format(target=shape.target.ident, cols=cols, stage=_STAGE, match=match)
    ).rowcount
    target.execute(sql.SQL("DROP TABLE {}").format(_STAGE))
    return Staged(relayed, inserted, equal)
