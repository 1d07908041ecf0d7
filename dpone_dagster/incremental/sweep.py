"""The stream check whose cost follows the run: the run's own keys, exactly, and a rolling slice
of the key (:mod:`dpone_dagster.core.sweep`, shared with the replication group's check), so that
every key range is verified within a bounded number of runs.

Both parts read the final batch's source snapshot and target transaction (after its merge and
deletes):

1. **The run's keys.** Every source row whose cursor lies in the run's ``(lower, mark]`` (read
   through the cursor's index) is looked up by its key in the target and their row hashes are
   compared (:func:`dpone_dagster.core.keyed.differing_keys`). A key the run copied that the
   source changed again after the mark has its cursor above the mark: it is the next run's, and
   counted (``changed_since_mark``). A run with more than :data:`RUN_KEYS_LIMIT` such rows is
   verified whole instead (:func:`.compare.compare`).
2. **The rolling slice** (:func:`dpone_dagster.core.sweep.sweep_slices`), whose differing keys
   are explained when their source cursor is above the mark (:func:`cursor_above`).

The position is one row of the ledger (``incremental_sweeps``), written in the final batch's
transaction: a crashed run leaves it where the last committed one put it.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.core.errors import EngineError
from dpone_dagster.core.keyed import differing_keys, key_cols, key_text
from dpone_dagster.core.sweep import (
    DEFAULT_SWEEP_RUNS,
    MAX_DIFFERING,
    MIN_SLICE,
    SECONDS_SLICE,
    Differences,
    KeyRange,
    SliceResult,
    Sweep,
    SweepLedger,
    SweepPosition,
    slice_rows,
    sweep_slices,
)
from dpone_dagster.lifecycle import Vocabulary
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.text_keys import TextKeys
from dpone_dagster.reconcile.compare import Key
from dpone_dagster.reconcile.digest import row_hash

from .shape import StreamShape

RUN_KEYS_LIMIT = 200_000
"""A run that copied more rows than this is verified by comparing both whole tables."""

__all__ = [
    "DEFAULT_SWEEP_RUNS",
    "MAX_DIFFERING",
    "MIN_SLICE",
    "RUN_KEYS_LIMIT",
    "SECONDS_SLICE",
    "CheckScope",
    "Differences",
    "KeyRange",
    "RunKeys",
    "SliceResult",
    "Sweep",
    "SweepLedger",
    "SweepPosition",
    "cursor_above",
    "run_keys",
    "slice_rows",
    "sweep_slices",
]


class CheckScope(
    Vocabulary, option="check", refusal="incremental_options_invalid", error=EngineError
):
    """What a verified run's check compares."""

    RUN = "run"
    """The run's keys exactly, and a rolling slice of the key (:class:`Sweep`)."""
    FULL = "full"
    """Both whole tables, every run."""


@dataclass(frozen=True)
class RunKeys:
    """What the check of the run's keys found (``None`` ``checked``: too many; whole tables),
    and how many source rows lie above the mark (changed or inserted since: the next run's)."""

    checked: int | None
    found: Differences
    later: int = 0


def cursor_above(
    src: Connection, shape: StreamShape, keys: list[Key], mark: str | None
) -> set[Key]:
    """Of ``keys``, those whose source row's cursor lies above ``mark`` (every present one,
    without a mark)."""
    if not keys:
        return set()
    among = TextKeys.of(shape.key, keys)
    above = (
        sql.SQL("true")
        if mark is None
        else sql.SQL("s.{c} > CAST(%s::text AS {t})").format(
            c=shape.cursor.ident, t=sql.SQL(shape.cursor.type_sql)
        )
    )
    query = sql.SQL("SELECT {kt} FROM {keys} JOIN {t} AS s ON {on} WHERE {above}").format(
        kt=key_text(shape.key, "s"), keys=among.rows(), t=shape.source.ident,
        on=among.equal("s"), above=above,
    )  # fmt: skip
    params = among.params
    if mark is not None:
        params.append(mark)
    return {tuple(r[0]) for r in src.execute(query, params)}


def run_keys(
    src: Connection, tgt: Connection, shape: StreamShape, lower: str | None, mark: str | None
) -> RunKeys:
    """Verifies every source row whose cursor is in ``(lower, mark]`` against the target's row
    of its key (``checked`` ``None``: more than :data:`RUN_KEYS_LIMIT`; compare whole tables).
    """
    if mark is None:
        return RunKeys(0, Differences())
    h = row_hash(src, shape.columns)
    where = sql.SQL("{c} <= CAST(%s::text AS {t})").format(
        c=shape.cursor.ident, t=sql.SQL(shape.cursor.type_sql)
    )
    params: list[object] = [mark]
    if lower is not None:
        where = sql.SQL("{} AND {c} > CAST(%s::text AS {t})").format(
            where, c=shape.cursor.ident, t=sql.SQL(shape.cursor.type_sql)
        )
        params.append(lower)
    # The run's keys and row hashes come back as one row of arrays, and go to the target as
    # they are: only the keys that differ cross the wire back.
    query = sql.SQL(
        "SELECT count(*), {keys}, coalesce(array_agg(h), '{{}}') FROM"
        " (SELECT {kc}, {h} AS h FROM {t} WHERE {w} ORDER BY {order} LIMIT %s) AS s"
    ).format(
        order=key_cols(shape.key),  # in key order: the target's probes walk its index in order
        keys=sql.SQL(", ").join(
            sql.SQL("coalesce(array_agg({}::text), '{{}}')").format(sql.Identifier(f"k{i}"))
            for i in range(len(shape.key))
        ),
        kc=sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(k.ident, sql.Identifier(f"k{i}"))
            for i, k in enumerate(shape.key)
        ),
        h=h, t=shape.source.ident, w=where,
    )  # fmt: skip
    row = src.execute(query, [*params, RUN_KEYS_LIMIT + 1]).fetchone()
    assert row is not None
    checked = int(row[0])
    if checked > RUN_KEYS_LIMIT:
        return RunKeys(None, Differences())
    differing = (
        differing_keys(tgt, shape.target, shape.key, shape.live(), h, list(row[1:-1]),
                       list(row[-1]))
        if checked
        else []
    )  # fmt: skip
    later = src.execute(
        sql.SQL("SELECT count(*) FROM {t} WHERE {c} > CAST(%s::text AS {ct})").format(
            t=shape.source.ident, c=shape.cursor.ident, ct=sql.SQL(shape.cursor.type_sql)
        ),
        (mark,),
    ).fetchone()
    count = int(later[0]) if later is not None else 0
    return RunKeys(checked, Differences(unexplained=tuple(differing)), count)
