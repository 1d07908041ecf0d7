"""The check of a replicated table without a primary key: the whole table, by its digest.

Such a table (``REPLICA IDENTITY FULL``) has no key to record a run's changes by, nor to slice a
sweep by. Its check compares the one reconciliation digest of the whole table
(:func:`~dpone_dagster.reconcile.digest.row_hash`: the row count and the sum of the rows'
64-bit hashes, which no order of rows changes) on both sides, as of the group's applied position
``L``: the target holds ``L`` (the check holds the group's lock); the source is read at ``S``, and
the images that transactions committed after ``L`` added and removed (still in the slot,
:meth:`~.slot_changes.SlotChanges.images`) are taken out of its digest, on the source's server,
by the same hash. Equal digests prove the target holds the same multiset of rows; a row changed,
added or lost behind the replication's back changes the target's.

Its cost is the table's size on both sides, so it runs within the sweep's budget
(:class:`~dpone_dagster.core.sweep.Sweep`): a table of at most ``max(the sweep's per-run
slice, KEYLESS_ROWS)`` rows is compared at every run, a larger one once every ``ceil(rows /
that)`` runs (its stated bound, ``ranges_total``). A run that compares nothing says so
(``ranges_checked`` 0): its ``dpone_reconciled`` is a warning, never a pass. A table that
differed is compared again at every run until it agrees, and fails each time; one whose
changes after ``L`` cannot be taken out (a ``TRUNCATE``, a column the change did not carry) is
compared by the next run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.core.sweep import Sweep, SweepPosition, row_estimate, slice_rows
from dpone_dagster.core.verification import Verification
from dpone_dagster.postgres.catalog import Column, column_type
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.threads import at_once
from dpone_dagster.reconcile.digest import digest_sums, row_hash

from .changes import Lsn, lsn_text
from .slot_changes import Image, SlotChanges

KEYLESS_ROWS = 200_000
"""Rows a keyless table may have and still be compared whole at every run, whatever the
sweep's slice (the comparison of such a table takes a fraction of a second)."""


@dataclass(frozen=True)
class KeylessTable:
    """A keyless table of the group, as its check compares it.

    Attributes:
        source: The source table.
        target: The target table.
        columns: The compared columns (the source's, generated ones left out, that the target
            has).
    """

    source: TableName
    target: TableName
    columns: tuple[Column, ...]


def every_runs(sweep: Sweep, estimate: int) -> int:
    """Runs between two comparisons of a keyless table of about ``estimate`` rows (see the
    module)."""
    budget = slice_rows(sweep, estimate)
    if sweep.rows is None:
        budget = max(budget, KEYLESS_ROWS)
    return max(1, math.ceil(estimate / budget))


def check_keyless(
    src: Connection,
    tgt: Connection,
    table: KeylessTable,
    slot: SlotChanges,
    proof: tuple[datetime, Lsn],
    *,
    sweep: Sweep | None,
    position: SweepPosition,
) -> tuple[Verification, SweepPosition]:
    """Compares the whole table when it is due (see the module); its verification and its
    position after this run.

    Args:
        src: The source session, in the check's snapshot.
        tgt: The target session, in the check's transaction (under the group's lock).
        table: The table.
        slot: The slot's changes after the applied position.
        proof: The snapshot's time and the applied position the target holds.
        sweep: The sweep's budget; ``None``: compare now (the check run alone).
        position: The table's position (its last comparison, the runs since).
    """
    at, applied = proof
    every = 1 if sweep is None else every_runs(sweep, row_estimate(src, table.source))
    due = position.last_full_at is None or bool(position.differing) or position.slices >= every
    if not due:
        moved = position.model_copy(update={"slices": position.slices + 1})
        return _result(table, at, applied, every, None, moved), moved
    compared = _compare(src, tgt, table, slot)
    if compared is None:  # its changes after L could not be taken out: the next run's
        return _result(table, at, applied, every, None, position, later=True), position
    equal, rows, missing = compared
    if equal:
        moved = position.model_copy(update={
            "slices": 1, "started_at": at, "last_full_started_at": at, "last_full_at": at,
            "sweeps": position.sweeps + 1, "dirty": False, "differing": (),
        })  # fmt: skip
    else:
        moved = position.model_copy(update={"dirty": True, "differing": ((None, None),)})
    return _result(table, at, applied, every, (equal, rows, missing), moved), moved


def _compare(
    src: Connection, tgt: Connection, table: KeylessTable, slot: SlotChanges
) -> tuple[bool, int, int] | None:
    """Both digests, the source's as of ``L``: equal, the source's rows, how many rows the
    counts differ by (at least 1 when only the hashes differ)."""
    names = [c.name for c in table.columns]
    images = slot.images(table.source, names)
    if images is None:
        return None
    h = row_hash(src, table.columns)

    def source_side() -> tuple[int, int]:  # the source as of ``L``: the later images taken out
        count, total = digest_sums(src, table.source, h)
        later_count, later_total = _images_digest(src, table.columns, h, images)
        return count - later_count, total - later_total

    (count, total), (target_count, target_total) = at_once(
        source_side, lambda: digest_sums(tgt, table.target, h)
    )
    equal = (count, total) == (target_count, target_total)
    missing = 0 if equal else max(1, abs(count - target_count))
    return equal, count, missing


def _images_digest(
    src: Connection, columns: Sequence[Column], h: sql.Composable, images: list[Image]
) -> tuple[int, int]:
    """The signed count and hash sum of the images, hashed by the source's server as its rows
    are (each value cast from its text to its column's type)."""
    if not images:
        return 0, 0
    slots = sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in columns)
    names = sql.SQL(", ").join(sql.Identifier(f"v{i}") for i in range(len(columns)))
    typed = sql.SQL(", ").join(
        sql.SQL("CAST(u.{} AS {}) AS {}").format(sql.Identifier(f"v{i}"), column_type(c), c.ident)
        for i, c in enumerate(columns)
    )
    query = sql.SQL(
        "SELECT coalesce(sum(x.sign), 0), coalesce(sum(x.sign * ({h})::numeric), 0) FROM"
        " (SELECT u.sign, {typed} FROM unnest(%s::int4[], {slots}) AS u(sign, {names})) AS x"
    ).format(h=h, typed=typed, slots=slots, names=names)
    params: list[object] = [[sign for sign, _ in images]]
    params += [[values[i] for _, values in images] for i in range(len(columns))]
    row = src.execute(query, params).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _result(
    table: KeylessTable,
    at: datetime,
    applied: Lsn,
    every: int,
    compared: tuple[bool, int, int] | None,
    position: SweepPosition,
    *,
    later: bool = False,
) -> Verification:
    """The table's verification: compared (``ranges_checked`` 1) or not this run (0)."""
    ok, rows, missing = compared if compared is not None else (True, 0, 0)
    return Verification(
        ok=ok, keys_compared=0, ranges_differing=0 if ok else 1, changed_since_mark=int(later),
        deleted_kept=0, unexplained=missing, scope="table",
        ranges_checked=int(compared is not None), ranges_total=every, rows_swept=rows,
        swept_at=position.last_full_at, swept_from=position.last_full_started_at,
        sweep_started_at=position.started_at, proved_at=at,
        differing_ranges=() if ok else ((None, None),), applied_lsn=lsn_text(applied),
    )  # fmt: skip


__all__ = ["KEYLESS_ROWS", "KeylessTable", "check_keyless", "every_runs"]
