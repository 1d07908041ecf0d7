"""The target's live rows, kept in the ledger: what a run reports as the target's size without
counting it.

The count is a column of the stream's state row (``target_rows``, ledger migration 7) and moves
with the state, in the transaction of the batch that changes the target: the state's
compare-and-swap commits it with the batch's rows, so a crash never skews it.

* **Set once.** A stream's first state takes it from the target (:func:`count_target`): 0 when
  the target does not exist yet (the first run creates it and copies the whole table, so the
  count is then what that run inserted), else the target's own count, once: a target a
  complete backfill filled (a stream that continues it), one the user made, or that of a stream
  an earlier release began (its ledger had no count; it is counted on the stream's next run
  rather than left unknown until a re-base, which a stream with ``ignore`` deletes and a sweep
  spread over many runs may never reach).
* **Moved by each batch** (:func:`moved`): plus the rows its merge inserted and the marked rows
  a key arriving again made live (``soft``), minus the rows its deletes removed (``hard``,
  ``sweep``) or marked (``soft``).
* **Re-based** when a final batch's check counts the whole target anyway, in its transaction:
  the key comparison of ``hard`` and ``soft`` deletes (its range counts, or the first level of
  its key digests), the ``full`` check, and the rolling sweep when one run's slices cover the
  key from its start to its end. A sweep spread over many runs counts each slice at a different
  moment: their sum is no count of the table, and the stream keeps its own.
* **A repair** rewrites keys the target changed behind the stream's back: it restores what the
  count already says, so its writes move the count only after a re-base in the same transaction
  (which counted the target as the repair found it).

So the count is the target's size as the stream's own writes tell it, corrected to the target's
own count whenever a run counts it anyway; a write behind the stream's back shows until then.
"""

from __future__ import annotations

from psycopg import sql

from dpone_dagster.postgres.catalog import relation_oid, table_columns
from dpone_dagster.postgres.connection import Connection

from .shape import StreamShape


def count_target(tgt: Connection, shape: StreamShape) -> int:
    """The target's live rows, counted (0 when it does not exist yet): a stream's first state
    only (see the module)."""
    if relation_oid(tgt, shape.target) is None:
        return 0
    marked = shape.soft_column in {c.name for c in table_columns(tgt, shape.target)}
    live = shape.live() if marked else sql.SQL("true")  # the column comes with the first delete
    row = tgt.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE {}").format(shape.target.ident, live)
    ).fetchone()
    return int(row[0]) if row is not None else 0


def moved(previous: int | None, *, gained: int, lost: int) -> int | None:
    """The count after a write that made ``gained`` rows live and ``lost`` rows not (``None``
    stays unknown)."""
    return None if previous is None else previous + gained - lost
