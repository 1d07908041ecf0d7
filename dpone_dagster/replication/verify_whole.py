"""A run whose keys are a large share of its table is checked by the whole table's digest.

Looking a key up costs an index probe on each side; reading a row in a scan costs a fraction of
that. When a run's recorded keys reach :data:`WHOLE_SHARE` of the table's rows (a backlog
drained in one run), the check compares the one digest of the whole table on both sides at once
(:func:`~dpone_dagster.reconcile.digest.digest_query`: the row count and the sum of the rows'
hashes), leaving out the keys a transaction changed after the applied position (they are the
next run's, as for the run's keys: :meth:`~.slot_changes.SlotChanges.all_keys`). Equal, every
key of the run is proved equal, and so is every other row: it is also a full sweep. Different,
the table is compared range by range (the one drill-down compare) and the keys that differ are
named (also after a ``TRUNCATE`` after the applied position: its keys are the next run's).
The recorder marks a table whose run's keys reach the share, and stops recording them
(:class:`~.recorder.KeyRecorder`).
"""

from __future__ import annotations

import math
from datetime import datetime

from psycopg import sql

from dpone_dagster.core.keyed import KeyedTables
from dpone_dagster.core.sweep import Later, Sweep, SweepPosition, classify, slice_rows
from dpone_dagster.core.verification import Verification
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.text_keys import TextKeys
from dpone_dagster.postgres.threads import at_once
from dpone_dagster.reconcile.compare import Key, compare
from dpone_dagster.reconcile.digest import digest_sums, row_hash

from .changes import Lsn, lsn_text

WHOLE_SHARE = 8
"""A run whose recorded keys are at least the table's rows over this is checked whole."""


def recorded_keys(
    tgt: Connection, keys: sql.Identifier, slot: str, table: TableName
) -> tuple[int, bool]:
    """The keys recorded for ``table`` since its last check (a key recorded by two target
    transactions counts twice), and whether the recorder marked the table to be compared
    whole (:class:`~.recorder.KeyRecorder`: an empty chunk)."""
    row = tgt.execute(
        sql.SQL(
            "SELECT coalesce(sum(CASE WHEN array_ndims(key) = 1 THEN 1"
            " ELSE array_length(key, 2) END), 0), coalesce(bool_or(cardinality(key) = 0), false)"
            " FROM {} WHERE slot = %s AND source_table = %s"
        ).format(keys),
        (slot, table.qualified),
    ).fetchone()
    return (int(row[0]), bool(row[1])) if row is not None else (0, False)


def whole_digests_equal(
    src: Connection, tgt: Connection, tables: KeyedTables, excluded: set[Key]
) -> tuple[bool, int]:
    """Whether both whole tables have the same digest, the ``excluded`` keys left out of
    both; the source's rows compared. Both servers compute theirs at once."""
    h = row_hash(src, tables.columns)

    def side(conn: Connection, table: TableName, live: sql.Composable) -> tuple[int, int]:
        where, params = _without(tables, table, excluded, live)
        return digest_sums(conn, table, h, where, params)

    source, target = at_once(
        lambda: side(src, tables.source, sql.SQL("true")),
        lambda: side(tgt, tables.target, tables.live()),
    )
    return source == target, source[0]


def _without(
    tables: KeyedTables, table: TableName, excluded: set[Key], live: sql.Composable
) -> tuple[sql.Composable, list[object]]:
    """The rows of ``table`` to compare: ``live`` ones whose key is not ``excluded``."""
    if not excluded:
        return live, []
    given = TextKeys.of(tables.key, sorted(excluded))
    # The digest reads the table by its name (no alias): its columns are qualified by it.
    where = sql.SQL("{} AND NOT EXISTS (SELECT FROM {} WHERE {})").format(
        live, given.rows(), given.equal(table.name)
    )
    return where, given.params


def whole_run_check(
    src: Connection,
    tgt: Connection,
    tables: KeyedTables,
    changes: tuple[set[Key], Later],
    proof: tuple[datetime, Lsn],
    sweep: tuple[Sweep, SweepPosition],
    recorded: int,
) -> tuple[Verification, SweepPosition, list[Key]]:
    """The run's check by the whole table (see the module): its verification, the sweep's
    position after it (a full sweep when the digests agree) and the keys to verify again.

    Args:
        src: The source session, in the check's snapshot.
        tgt: The target session, in the check's transaction.
        tables: The table, compared by key.
        changes: The keys changed after the applied position, and the rule that tells them.
        proof: The snapshot's time and the applied position.
        sweep: The sweep's budget and the table's position.
        recorded: The run's recorded keys.
    """
    (excluded, later), (at, applied), (budget, position) = changes, proof, sweep
    equal, rows = whole_digests_equal(src, tgt, tables, excluded)
    total = math.ceil(rows / slice_rows(budget, rows)) if rows else 1
    if equal:
        moved = position.model_copy(update={
            "after": None, "started_at": None, "slices": 0, "last_full_started_at": at,
            "last_full_at": at, "sweeps": position.sweeps + 1, "dirty": False, "differing": (),
        })  # fmt: skip
        unexplained: list[Key] = []
        counted_later = len(excluded)
    else:  # named range by range, classified as the run's keys are
        found = classify(compare(*tables.sides(src, tgt, rows=True)), later, gone_allowed=False)
        unexplained, counted_later, moved = list(found.unexplained), found.later, position
    verification = Verification(
        ok=not unexplained, keys_compared=0, ranges_differing=0, changed_since_mark=counted_later,
        deleted_kept=0, unexplained=len(unexplained), examples=tuple(unexplained[:20]),
        scope="run", keys_checked=recorded, ranges_checked=total if equal else 0,
        ranges_total=total, rows_swept=rows, sweep_started_at=moved.started_at,
        swept_at=moved.last_full_at, swept_from=moved.last_full_started_at, proved_at=at,
        applied_lsn=lsn_text(applied),
    )  # fmt: skip
    return verification, moved, unexplained
