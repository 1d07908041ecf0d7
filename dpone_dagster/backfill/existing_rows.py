"""A batch whose rows may already be in the target: staged, then applied set-based.

The range is copied (same snapshot, same COPY stream, same hash) into a temporary staging table,
then new rows are inserted, rows equal to the target's are counted as duplicates, and a row that
differs is refused with ``backfill_record_changed``. The copier takes this path only when a
direct COPY meets a row that exists (a unique violation).

The reconciliation's repair with ``on_changed="fail"`` takes :func:`apply_missing`: the one
drill-down compare names the keys of the range that differ first, and only their source rows
are staged (then applied as above). With ``on_changed="repair"`` it takes :func:`apply_repair`:
the one drill-down compare (:func:`dpone_dagster.reconcile.compare.compare`) names the keys of
the range that differ, only the source rows of those keys are staged, and only those keys of
the target are rewritten (rows gone from the source deleted, changed rows updated, missing rows
inserted): every other row of the range is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import column_list, columns_equal
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import RelayResult, copy_out_statement, relay
from dpone_dagster.postgres.text_keys import TextKeys
from dpone_dagster.reconcile.compare import DIRECT_ROWS, Comparison, Key, Rows, Side, compare

from .shape import TableShape

_STAGE = sql.Identifier("_dpone_backfill_stage")


@dataclass(frozen=True)
class Staged:
    """A staged apply: what the relay moved, rows inserted and existing equal rows."""

    relayed: RelayResult
    inserted: int
    duplicates: int


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
            k=sql.Identifier("t", shape.key[0].name),
            a=_row_text(shape, "s"),
            b=_row_text(shape, "t"),
            keytext=sql.SQL("ROW({})::text").format(
                sql.SQL(", ").join(sql.Identifier("s", k) for k in shape.key_names)
            ),
            stage=_STAGE,
            target=shape.target.ident,
            match=columns_equal("s", "t", shape.key_names),
        )
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), row[2]


def _stage(
    source: Connection,
    target: Connection,
    shape: TableShape,
    copy_out: sql.Composed,
    params: Sequence[object],
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
            target=shape.target.ident,
            cols=cols,
            stage=_STAGE,
            match=columns_equal("s", "t", shape.key_names),
        )
    ).rowcount


def _changed(shape: TableShape) -> sql.Composed:
    """A staged row ``s`` and a target row ``t`` with the same key and other values."""
    return sql.SQL("{} AND {} <> {}").format(
        columns_equal("s", "t", shape.key_names), _row_text(shape, "s"), _row_text(shape, "t")
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
    return _apply_staged(target, shape, relayed, overwrite=overwrite)


def _apply_staged(
    target: Connection, shape: TableShape, relayed: RelayResult, *, overwrite: bool
) -> Staged:
    """The staged rows applied: new ones inserted, equal ones counted, a differing one refused
    (or, ``overwrite``, replaced); the staging table dropped."""
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


def apply_missing(
    source: Connection, target: Connection, shape: TableShape, after: str | None,
    upper: str | None, *, rows: int,
) -> Staged:  # fmt: skip
    """The reconciliation's repair with ``on_changed="fail"``: inserts the source rows of the
    range ``(after, upper]`` that the target lacks, and refuses a row the target holds with
    other values, as :func:`apply_existing` does, but stages only the keys that differ.

    The one drill-down compare (:func:`differing_keys`) names them first (in the sessions' open
    transactions), so a range that lacks a few rows stages those rows, not the range.

    Args:
        rows: The most rows either side holds in the range (see :func:`differing_keys`).

    Raises:
        EngineError: ``backfill_record_changed`` when a source row of the range differs from the
            target's row of its key (wherever its cursor puts it).
    """
    found = differing_keys(source, target, shape, after, upper, rows=rows)
    relayed = _stage_keys(source, target, shape, after, upper, found.to_copy)
    return _apply_staged(target, shape, relayed, overwrite=False)


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


def _keys_in(
    shape: TableShape, alias: str, keys: Sequence[Key]
) -> tuple[sql.Composed, list[object]]:
    """``<alias>.key = <one of keys>`` (the keys as text, cast to each key column's type): an
    ``EXISTS`` over one text array per key column, and its parameters."""
    given = TextKeys.of(shape.key, keys)
    query = sql.SQL("EXISTS (SELECT 1 FROM {} WHERE {})").format(given.rows(), given.equal(alias))
    return query, given.params


def _stage_keys(
    source: Connection, target: Connection, shape: TableShape, after: str | None,
    upper: str | None, keys: Sequence[Key],
) -> RelayResult:  # fmt: skip
    """Stages the source's rows of the range ``(after, upper]`` with one of ``keys``."""
    among, keyed = _keys_in(shape, "s", keys)
    where, range_params = shape.where(after, upper)
    select = sql.SQL("SELECT {} FROM {} AS s WHERE {} AND {}").format(
        column_list(shape.columns), shape.source.ident, where, among
    )
    copy_out = copy_out_statement(select, shape.fmt)
    return _stage(source, target, shape, copy_out, [*range_params, *keyed])


def _delete_keys(
    target: Connection, shape: TableShape, after: str | None, upper: str | None, keys: list[Key]
) -> int:
    """Deletes the target's rows of the range ``(after, upper]`` with one of ``keys``."""
    if not keys:
        return 0
    where, params = shape.where(after, upper)
    among, keyed = _keys_in(shape, "t", keys)
    return target.execute(
        sql.SQL("DELETE FROM {} AS t WHERE {} AND {}").format(shape.target.ident, where, among),
        [*params, *keyed],
    ).rowcount


def differing_keys(
    source: Connection, target: Connection, shape: TableShape, after: str | None,
    upper: str | None, *, rows: int,
) -> Comparison:  # fmt: skip
    """The keys of the range ``(after, upper]`` whose rows differ between the source (its open
    snapshot) and the target (its open transaction): the one drill-down compare, whole rows.

    Args:
        rows: The most rows either side holds in the range (a small range sends its keys at
            once, :data:`~dpone_dagster.reconcile.compare.DIRECT_ROWS`).
    """
    where, params = shape.where(after, upper)
    compared = Rows(shape.key, shape.columns)
    return compare(
        Side(source, shape.source, where, tuple(params)),
        Side(target, shape.target, where, tuple(params)),
        compared,
        direct=rows <= DIRECT_ROWS,
    )


def _update_changed(target: Connection, shape: TableShape) -> int:
    """Sets every target row whose key is staged but whose values differ to the staged values
    (wherever its cursor value puts it: a row the source moved into the range moves too)."""
    values = [c.name for c in shape.columns if c.name not in shape.key_names]
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
    source: Connection, target: Connection, shape: TableShape, after: str | None,
    upper: str | None, *, rows: int,
) -> Repaired:  # fmt: skip
    """Makes the target's range ``(after, upper]`` hold exactly the source's rows of it,
    rewriting only the keys that differ.

    The one drill-down compare (:func:`differing_keys`) names the keys whose rows differ, in
    ``source``'s open transaction (the reconciliation's snapshot) and ``target``'s (which sees
    the repairs of earlier ranges); only the source rows of those keys are staged; then,
    set-based: the range's target rows whose key the source's range lacks are deleted, rows
    whose values differ are updated, missing rows are inserted. Deleting first lets a row the
    source moved to another range of the run be inserted there.

    Args:
        rows: The most rows either side holds in the range (see :func:`differing_keys`).

    Returns:
        The rows relayed, inserted, updated and deleted.
    """
    found = differing_keys(source, target, shape, after, upper, rows=rows)
    relayed = _stage_keys(source, target, shape, after, upper, found.to_copy)
    deleted = _delete_keys(target, shape, after, upper, sorted(found.target_only))
    updated = _update_changed(target, shape)
    inserted = _insert_missing(target, shape)
    target.execute(sql.SQL("DROP TABLE {}").format(_STAGE))
    return Repaired(relayed, inserted, updated, deleted)
