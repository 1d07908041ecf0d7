"""A batch whose rows may already be in the target: staged, then applied set-based.

The range is copied (same snapshot, same COPY stream, same hash) into a temporary staging table,
then new rows are inserted, rows equal to the target's are counted as duplicates, and a row that
differs is refused with ``backfill_record_changed``. The copier takes this path only when a
direct COPY meets a row that exists (a unique violation); the reconciliation's repair always
takes it.

The reconciliation's repair with ``on_changed="repair"`` takes :func:`apply_repair` instead:
the same staging, then the target's rows of the range are made equal to the staged ones
(rows gone from the source deleted, changed rows updated, missing rows inserted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import RelayResult, copy_out_statement, relay

from .shape import TableShape

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


def _compare(target: Connection, shape: TableShape) -> tuple[int, int, object]:
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
    return int(row[0]), int(row[1]), row[2]


def _stage(
    source: Connection,
    target: Connection,
    shape: TableShape,
    copy_out: sql.Composed,
    params: Sequence[str],
) -> RelayResult:
    """COPYs the source's rows of ``copy_out`` into a temporary staging table of the target."""
    cols = column_list(shape.columns)
    target.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            _STAGE, cols, shape.target.ident
        )
    )
    return relay(
        source,
        copy_out,
        target,
        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(_STAGE, cols, sql.SQL(shape.fmt)),
        params=params,
        hashed=True,
    )


def _insert_missing(target: Connection, shape: TableShape) -> int:
    """Inserts the staged rows whose key the target does not hold; returns how many."""
    cols = column_list(shape.columns)
    return target.execute(
        sql.SQL(
            "INSERT INTO {target} ({cols}) SELECT {cols} FROM {stage} AS s"
            " WHERE NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {match})"
        ).format(
            target=shape.target.ident, cols=cols, stage=_STAGE, match=_key_match(shape, "s", "t")
        )
    ).rowcount


def _changed(shape: TableShape) -> sql.Composed:
    """A staged row ``s`` and a target row ``t`` with the same key and other values."""
    return sql.SQL("{} AND {} <> {}").format(
        _key_match(shape, "s", "t"), _row_text(shape, "s"), _row_text(shape, "t")
    )


def _delete_changed(target: Connection, shape: TableShape) -> None:
    """Deletes the target's rows whose key is staged with other values (re-inserted next)."""
    target.execute(
        sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {}").format(
            shape.target.ident, _STAGE, _changed(shape)
        )
    )


def apply_existing(
    source: Connection,
    target: Connection,
    shape: TableShape,
    copy_out: sql.Composed,
    params: Sequence[str],
    *,
    overwrite: bool = False,
) -> Staged:
    """COPY into a temporary staging table, then insert new rows and count equal ones.

    Runs in the sessions' open transactions (the source's snapshot, the target's transaction).

    Args:
        source: The source session, in the batch's (or the reconciliation's) snapshot.
        target: The target session, in its open transaction.
        shape: The resolved tables.
        copy_out: The ``COPY (SELECT ...) TO STDOUT`` of the rows.
        params: Its parameters.
        overwrite: A target row that differs from the staged row with its key (the source
            changed it, or moved its cursor value into this range, after an earlier batch
            copied it) is replaced and counted as inserted, instead of refused
            (``on_changed="repair"``).

    Raises:
        EngineError: ``backfill_record_changed`` when a staged row differs from the target's
            (unless ``overwrite``).
    """
    relayed = _stage(source, target, shape, copy_out, params)
    equal, changed, first_key = _compare(target, shape)
    if changed and not overwrite:
        raise engine_error(
            "backfill_record_changed",
            f"{changed} row(s) of {shape.target} differ from the source (first key {first_key}).",
        )
    if changed:
        _delete_changed(target, shape)
    inserted = _insert_missing(target, shape)
    target.execute(sql.SQL("DROP TABLE {}").format(_STAGE))
    return Staged(relayed, inserted, equal)


@dataclass(frozen=True)
class Repaired:
    """What :func:`apply_repair` changed in one range of the target.

    Attributes:
        relayed: What the relay moved (the source's rows of the range).
        inserted: Rows the target lacked.
        updated: Rows the target held with other values (or under another cursor value).
        deleted: Rows of the range the source no longer holds there.
    """

    relayed: RelayResult
    inserted: int
    updated: int
    deleted: int


def _delete_gone(
    target: Connection, shape: TableShape, after: str | None, upper: str | None
) -> int:
    """Deletes the target's rows of the range whose key the staged rows do not hold."""
    where, params = shape.where(after, upper)
    return target.execute(
        sql.SQL(
            "DELETE FROM {target} AS t WHERE {where}"
            " AND NOT EXISTS (SELECT 1 FROM {stage} AS s WHERE {match})"
        ).format(
            target=shape.target.ident, where=where, stage=_STAGE, match=_key_match(shape, "s", "t")
        ),
        params,
    ).rowcount


def _update_changed(target: Connection, shape: TableShape) -> int:
    """Sets every target row whose key is staged but whose values differ to the staged values
    (wherever its cursor value puts it: a row the source moved into the range moves too)."""
    values = [c.name for c in shape.columns if c.name not in shape.key]
    if not values:  # every column is the key: a row with the key is equal
        return 0
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(c), sql.Identifier("s", c)) for c in values
    )
    return target.execute(
        sql.SQL("UPDATE {} AS t SET {} FROM {} AS s WHERE {}").format(
            shape.target.ident, assignments, _STAGE, _changed(shape)
        )
    ).rowcount


def apply_repair(
    source: Connection, target: Connection, shape: TableShape, after: str | None, upper: str | None
) -> Repaired:
    """Makes the target's range ``(after, upper]`` hold exactly the source's rows of it.

    The source's rows are read in ``source``'s open transaction (the reconciliation's snapshot)
    and staged; then, in ``target``'s open transaction and set-based: the range's rows whose key
    is not staged are deleted, rows whose values differ are updated, missing rows are inserted.
    Deleting first lets a row the source moved to another range of the run be inserted there.

    Returns:
        The rows relayed, inserted, updated and deleted.
    """
    select, params = shape.select_range(shape.source, after, upper)
    relayed = _stage(source, target, shape, copy_out_statement(select, shape.fmt), params)
    deleted = _delete_gone(target, shape, after, upper)
    updated = _update_changed(target, shape)
    inserted = _insert_missing(target, shape)
    target.execute(sql.SQL("DROP TABLE {}").format(_STAGE))
    return Repaired(relayed, inserted, updated, deleted)
