"""The rolling sweep every stream check shares: a slice of the key per run, so that every key
range is verified within a bounded number of runs, and the lookups of a run's own keys.

Used by the incremental stream's check (:mod:`dpone_dagster.incremental.sweep`) and the
replication group's (:mod:`dpone_dagster.replication.verify`); each engine says which differing
keys are explained (its ``later`` rule: a cursor above the mark, a change after the applied
position still in the slot). Both sides are digested with the one reconciliation digest
(:func:`dpone_dagster.reconcile.digest.row_hash`, the same expression on both sides):

* **A slice.** The key is walked in order, a slice per run: the slice's end is found on the
  source's primary-key index, then both sides digest the rows of the key range ``(after, end]``
  (the last slice is open-ended, so target keys above the source's largest one are in it). A
  slice whose digests differ is compared key by key (it is at most the budget's size). The
  slice's size is :class:`Sweep`'s budget: ``rows`` per run, or enough for a full sweep in
  ``runs`` runs (the source's row estimate over ``runs``), or as many slices of
  :data:`SECONDS_SLICE` rows as fit in ``seconds``. A range that differed is verified again by
  every run until it agrees (the check keeps failing until it is repaired), and a sweep that met
  one is not counted as a full sweep.

The tables compared, their sides and the lookups of given keys are :mod:`.keyed`'s.

The position (the key the next slice starts after, when the current sweep began, when the last
one completed) is one ledger row per stream (:class:`SweepLedger`), written in the check's
target transaction: a crashed run leaves it where the last committed one put it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile.compare import Comparison, Key, both, compare
from dpone_dagster.reconcile.digest import digest_query, row_hash, run_digest

from .documents import Count, Document
from .errors import engine_error
from .keyed import SweptTables, key_cols, key_text, key_value
from .ledger import LedgerStore, as_json

SECONDS_SLICE = 10_000
"""Rows per slice when the budget is in seconds."""
MIN_SLICE = 1_000
"""The smallest slice a ``runs`` budget takes (a small table is swept in fewer runs)."""
MAX_DIFFERING = 16
"""Ranges that differed kept for verifying again (more are found again by the next sweep)."""
DEFAULT_SWEEP_RUNS = 288
"""A full sweep in 288 runs: about once a day at a five-minute schedule."""


@dataclass(frozen=True)
class Sweep:
    """The rolling slice's per-run budget (exactly one of ``rows`` and ``seconds``, else
    ``runs``).

    Attributes:
        runs: A full sweep within about this many runs (default 288: once a day at a five-minute
            schedule); the slice is the source's row estimate over ``runs``.
        rows: Rows per run, whatever the table's size (a full sweep then takes the table's
            rows over ``rows`` runs).
        seconds: Seconds per run: slices of :data:`SECONDS_SLICE` rows until they are spent (at
            least one slice).

    Raises:
        EngineError: ``incremental_options_invalid`` for a budget that is not positive, or both
            ``rows`` and ``seconds``.
    """

    runs: int = DEFAULT_SWEEP_RUNS
    rows: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        bad = [
            f"{name}={value!r}"
            for name, value in (("runs", self.runs), ("rows", self.rows), ("seconds", self.seconds))
            if value is not None and (isinstance(value, bool) or not value > 0)
        ]
        if self.rows is not None and self.seconds is not None:
            bad.append("rows and seconds both set")
        if bad:
            raise engine_error(
                "incremental_options_invalid",
                f"sweep: {', '.join(bad)}.",
                ["Give Sweep(runs=N), Sweep(rows=N) or Sweep(seconds=S), with N, S > 0."],
            )


class SweepPosition(Document):
    """Where a stream's rolling sweep is (one ledger row per stream).

    Attributes:
        stream_id: The stream (an incremental stream, or a replicated table of a group).
        after: The key the next slice starts after (``None``: the start of the key).
        started_at: When the current sweep's first slice was verified.
        slices: Slices verified in the current sweep.
        last_full_started_at: When the last complete sweep began.
        last_full_at: When it completed (every range verified between the two).
        sweeps: Complete sweeps.
        dirty: A range of the current sweep differed (its completion is then no full sweep's:
            ``last_full_at`` stays).
        differing: Ranges (``(after, end]``) that differed, verified again by every run until
            they agree, so a difference keeps failing the check until it is repaired (at most
            :data:`MAX_DIFFERING`).
    """

    stream_id: str
    after: tuple[str, ...] | None = None
    started_at: datetime | None = None
    slices: Count = 0
    last_full_started_at: datetime | None = None
    last_full_at: datetime | None = None
    sweeps: Count = 0
    dirty: bool = False
    differing: tuple[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ...] = ()


KeyRange = tuple[Key | None, Key | None]
"""A range of the key, ``(after, end]`` (``None``: open)."""

Later = Callable[[list[Key]], set[Key]]
"""Of keys that differ, those the source changed after the point the check proves (the next
run's): each engine's rule."""


@dataclass(frozen=True)
class Differences:
    """Keys a comparison found differing, classified.

    Attributes:
        later: Differing because the source changed them after the point proved (the next
            run's).
        gone: Only the target holds them (the source deleted them), when that is allowed.
        unexplained: Differing with no such reason.
    """

    later: int = 0
    gone: tuple[Key, ...] = ()
    unexplained: tuple[Key, ...] = ()


@dataclass(frozen=True)
class SliceResult:
    """What the sweep's slices of this run verified, and the position after them (``differing``:
    the key ranges ``(after, end]`` in which this run found unexplained differences;
    ``target_rows``: the target's rows, when this run's slices covered the whole key, from the
    start of a sweep to its end, and so counted every target row in the check's transaction)."""

    rows: int
    ranges: int
    ranges_total: int
    keys_compared: int
    found: Differences
    position: SweepPosition
    differing: tuple[KeyRange, ...] = ()
    target_rows: int | None = None


def classify(found: Comparison, later: Later, *, gone_allowed: bool) -> Differences:
    """Classifies the keys that differ between the source and the target: ``later`` (the
    engine's rule), ``gone`` (target-only keys, when allowed), or unexplained."""
    differing = found.to_copy
    target_only = sorted(found.target_only)
    candidates = differing + target_only
    late = later(candidates) if candidates else set()
    gone = tuple(sorted(k for k in target_only if k not in late)) if gone_allowed else ()
    unexplained = [k for k in differing if k not in late]
    if not gone_allowed:
        unexplained += [k for k in target_only if k not in late]
    count_later = sum(1 for k in candidates if k in late)
    return Differences(count_later, gone, tuple(sorted(unexplained)))


def row_estimate(src: Connection, table: TableName) -> int:
    """The planner's estimate of ``table``'s rows (``pg_class.reltuples``, 0 when unknown)."""
    row = src.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = CAST(%s AS regclass)",
        (table.ident.as_string(src),),
    ).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def slice_rows(sweep: Sweep, estimate: int) -> int:
    """The rows of one slice under ``sweep`` for a source of about ``estimate`` rows."""
    if sweep.rows is not None:
        return sweep.rows
    if sweep.seconds is not None:
        return SECONDS_SLICE
    return max(MIN_SLICE, math.ceil(estimate / sweep.runs))


class _Slicer:
    """One slice's queries on both sides."""

    def __init__(self, src: Connection, tgt: Connection, tables: SweptTables) -> None:
        self.src, self.tgt, self.tables = src, tgt, tables
        self.h = row_hash(src, tables.columns)

    def _range(self, after: Key | None, end: Key | None) -> tuple[sql.Composable, list[object]]:
        parts: list[sql.Composable] = []
        params: list[object] = []
        cols = sql.SQL("ROW({})").format(key_cols(self.tables.key))
        if after is not None:
            parts.append(sql.SQL("{} > {}").format(cols, key_value(self.tables.key)))
            params += list(after)
        if end is not None:
            parts.append(sql.SQL("{} <= {}").format(cols, key_value(self.tables.key)))
            params += list(end)
        return (sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")), params

    def end(self, after: Key | None, rows: int) -> Key | None:
        """The key ``rows`` keys after ``after`` on the source (``None``: no key follows it, so
        the slice is the last one and open-ended)."""
        where, params = self._range(after, None)
        key = self.tables.key
        query = sql.SQL(
            "SELECT {kt} FROM {t} WHERE {w} ORDER BY {k} OFFSET %s LIMIT 2"
        ).format(kt=key_text(key), t=self.tables.source.ident, w=where,
                 k=key_cols(key))  # fmt: skip
        found = self.src.execute(query, [*params, rows - 1]).fetchall()
        return tuple(found[0][0]) if len(found) == 2 else None

    def compare(self, after: Key | None, end: Key | None) -> Comparison:
        """The slice ``(after, end]`` compared: its digests first (one ``(count, sum)`` per side);
        when they differ, key by key (the one drill-down compare; a slice is at most the
        budget's size, so its keys are sent at once). Its ``target_rows`` is the target's
        count of the slice."""
        where, params = self._range(after, end)
        source, target, rows = self.tables.sides(self.src, self.tgt, rows=True, where=where,
                                                 params=params)  # fmt: skip
        a, b = both(
            lambda: run_digest(self.src, *digest_query(self.tables.source, self.h, where, params)),
            lambda: run_digest(
                self.tgt, *digest_query(self.tables.target, self.h, target.where, params)
            ),
        )
        if a == b:
            return Comparison(target_rows=b.count)
        return compare(source, target, rows, direct=True)


def sweep_slices(
    src: Connection,
    tgt: Connection,
    tables: SweptTables,
    position: SweepPosition,
    sweep: Sweep,
    *,
    later: Later,
    at: datetime,
    gone_allowed: bool,
) -> SliceResult:
    """Verifies this run's slice(s) of the key from ``position``; the position after them.

    Args:
        src: The source session, in the check's snapshot.
        tgt: The target session, in its transaction.
        tables: The stream's tables.
        position: Where the sweep is.
        sweep: The budget.
        later: The engine's rule: of differing keys, those the source changed after the point
            proved (the next run's).
        at: When the slice is proved (the snapshot's time).
        gone_allowed: Target keys the source lost are expected (``ignore``, or deletes found by
            the sweep), not differences.
    """
    estimate = row_estimate(src, tables.source)
    size = slice_rows(sweep, estimate)
    slicer = _Slicer(src, tgt, tables)
    started = time.monotonic()
    rows = ranges = compared = count_later = 0
    gone: list[Key] = []
    unexplained: list[Key] = []
    recheck: list[KeyRange] = []
    named: list[KeyRange] = []

    def verify(after: Key | None, end: Key | None) -> tuple[bool, int]:
        """Whether the range agrees (every difference explained), and its target rows."""
        nonlocal compared, count_later
        diff = slicer.compare(after, end)
        there = diff.target_rows or 0
        if diff.empty:
            return True, there
        found = classify(diff, later, gone_allowed=gone_allowed)
        count_later, compared = count_later + found.later, compared + diff.keys_compared
        gone.extend(found.gone)
        unexplained.extend(found.unexplained)
        if found.unexplained:
            named.append((after, end))
        return not found.unexplained, there

    for after, end in position.differing:  # ranges that differed: verified until they agree
        if not verify(after, end)[0]:
            recheck.append((after, end))
    pos = position.model_copy(update={"differing": tuple(recheck)})
    held = 0  # the target rows of this run's slices
    while True:
        after = pos.after
        end = slicer.end(after, size)
        clean, there = verify(after, end)
        held += there
        if not clean and len(pos.differing) < MAX_DIFFERING:
            pos = pos.model_copy(update={"differing": (*pos.differing, (after, end))})
        dirty = pos.dirty or not clean or bool(recheck)
        ranges += 1
        rows += size if end is not None else 0
        first = pos.started_at or at
        if end is None:  # the last slice: the sweep is complete (clean: every range agreed)
            full = {} if dirty else {"last_full_started_at": first, "last_full_at": at}
            pos = pos.model_copy(
                update={"after": None, "started_at": None, "slices": 0, "dirty": False,
                        "sweeps": pos.sweeps + 1, **full}
            )  # fmt: skip
        else:
            pos = pos.model_copy(
                update={"after": end, "started_at": first, "slices": pos.slices + 1,
                        "dirty": dirty}
            )  # fmt: skip
        if sweep.seconds is None or end is None or time.monotonic() - started >= sweep.seconds:
            break
    total = max(math.ceil(estimate / size), position.slices + ranges, 1)
    found = Differences(count_later, tuple(gone), tuple(sorted(unexplained)))
    whole = position.after is None and end is None  # from the key's start to its end
    return SliceResult(rows, ranges, total, compared, found, pos, tuple(named),
                       held if whole else None)  # fmt: skip


class SweepLedger:
    """Reads and writes sweep positions in one ledger table (``incremental_sweeps`` by default;
    the replication groups' ``replication_sweeps``); the caller owns the transaction."""

    def __init__(self, store: LedgerStore, table: sql.Identifier | None = None) -> None:
        name = table or store.tables.stream_sweeps
        self._fetch = sql.SQL("SELECT sweep_json FROM {} WHERE stream_id = %s").format(name)
        self._save = sql.SQL(
            "INSERT INTO {} (stream_id, sweep_json) VALUES (%s, %s)"
            " ON CONFLICT (stream_id) DO UPDATE SET sweep_json = EXCLUDED.sweep_json,"
            " updated_at = clock_timestamp()"
        ).format(name)

    def fetch(self, conn: Connection, stream_id: str) -> SweepPosition:
        """The stream's position (the start of the key when it has none)."""
        row = conn.execute(self._fetch, (stream_id,)).fetchone()
        if row is None:
            return SweepPosition(stream_id=stream_id)
        return SweepPosition.model_validate(row[0])

    def save(self, conn: Connection, position: SweepPosition) -> None:
        """Stores the position."""
        conn.execute(self._save, (position.stream_id, as_json(position)))
