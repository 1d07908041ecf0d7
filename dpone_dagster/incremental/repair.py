"""Repair by range: the keys a stream's check found differing, re-copied through the stream's own
apply path, and nothing else.

With ``IncrementalSync(..., repair=True)``, a final batch whose check (:mod:`.verify`) found rows
that differ for no reason the stream knows (the target changed behind its back) rewrites exactly
those keys, in the final batch's own transactions (its source snapshot, its target transaction,
before the COMMIT that also writes its receipt):

1. the source rows of those keys (at the final batch's snapshot, so at or below the mark) are
   copied into a temporary staging table of the target and applied by the ``merge`` sink of the
   one load path (:func:`dpone_dagster.postgres.sinks.apply_sink`), as every batch's rows are;
   a ``soft`` delete's mark on such a key is cleared first (:func:`.deletes.revive`);
2. those keys the source does not hold are deleted (``soft``: marked) by the stream's delete
   path (:func:`.deletes.apply_deletes`).

The check's verification then says what was repaired (``repaired_keys``, the sweep's key ranges
in ``repaired_ranges``) and passes; the next check verifies those ranges again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import copy_in_statement, copy_out_statement, relay
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.sinks import apply_sink
from dpone_dagster.postgres.target_plan import Sink, TablePlan
from dpone_dagster.reconcile.compare import Key

from .deletes import apply_deletes, matching, revive
from .shape import StreamShape

_STAGE = TableName("pg_temp", "_dpone_stream_repair")


@dataclass(frozen=True)
class RepairedKeys:
    """What a repair wrote: rows the merge inserted and updated, rows deleted (or marked), and
    marked rows live again (``soft``)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    revived: int = 0

    @property
    def rows(self) -> int:
        """Every row the repair wrote."""
        return self.inserted + self.updated + self.deleted


def repair_keys(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    plan: TablePlan,
    keys: Sequence[Key],
    at: datetime,
) -> RepairedKeys:
    """Makes the target's rows of ``keys`` equal to the source's (see the module).

    Args:
        src: The source session, in the final batch's snapshot.
        tgt: The target session, in the final batch's transaction.
        shape: The stream.
        plan: The final batch's load plan (its columns and the target's key).
        keys: The keys to repair (as text, in key order).
        at: The snapshot's time (what a ``soft`` delete records).
    """
    if not keys:
        return RepairedKeys()
    names = column_list(plan.column_names)
    tgt.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            sql.Identifier(_STAGE.name), names, shape.target.ident
        )
    )
    among, params = matching(shape, keys)
    select = sql.SQL("SELECT {} FROM {} AS t, {}").format(
        sql.SQL(", ").join(sql.SQL("t.{}").format(c.ident) for c in plan.columns),
        shape.source.ident,
        among,
    )
    fmt = plan.copy_format
    copy_in = copy_in_statement(_STAGE, list(plan.column_names), fmt)
    moved = relay(src, copy_out_statement(select, fmt), tgt, copy_in, params=params)
    found = {
        tuple(r[0])
        for r in tgt.execute(
            sql.SQL("SELECT ARRAY[{}] FROM {}").format(
                sql.SQL(", ").join(sql.SQL("{}::text").format(k.ident) for k in shape.key),
                _STAGE.ident,
            )
        )
    }
    gone = [k for k in keys if tuple(k) not in found]
    revived = revive(tgt, shape, _STAGE)
    sink = apply_sink(tgt, plan, _STAGE, Sink.MERGE, moved.rows_in)
    deleted = apply_deletes(tgt, shape, gone, at)
    return RepairedKeys(sink.rows_inserted, sink.rows_updated, deleted, revived)
