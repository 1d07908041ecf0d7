"""The stream check whose cost follows the run: the run's own keys, exactly, and a rolling slice
of the key, so that every key range is verified within a bounded number of runs.

Both parts use the one reconciliation digest (:func:`dpone_dagster.reconcile.digest.row_hash`,
the same expression on both sides) and read the final batch's source snapshot and target
transaction (after its merge and deletes):

1. **The run's keys.** Every source row whose cursor lies in the run's ``(lower, mark]`` (read
   through the cursor's index) is looked up by its key in the target and their row hashes are
   compared. A key the run copied that the source changed again after the mark has its cursor
   above the mark: it is the next run's, and counted (``changed_since_mark``). A run with more
   than :data:`RUN_KEYS_LIMIT` such rows is verified whole instead (:func:`.compare.compare`).
2. **The rolling slice.** The key is walked in order, a slice per run: the slice's end is found
   on the source's primary-key index, then both sides digest the rows of the key range
   ``(after, end]`` (the last slice is open-ended, so target keys above the source's largest
   one are in it). A slice whose digests differ is compared key by key (it is at most the
   budget's size). The slice's size is :class:`Sweep`'s budget: ``rows`` per run, or enough
   for a full sweep in ``runs`` runs (the source's row estimate over ``runs``), or as many
   slices of :data:`SECONDS_SLICE` rows as fit in ``seconds``. A range that differed is
   verified again by every run until it agrees (the check keeps failing until it is repaired),
   and a sweep that met one is not counted as a full sweep.

The position (the key the next slice starts after, when the current sweep began, when the last
one completed) is one row of the ledger (``incremental_sweeps``), written in the final batch's
transaction: a crashed run leaves it where the last committed one put it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.core.documents import Count, Document
from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.core.ledger import LedgerStore, as_json
from dpone_dagster.lifecycle import Vocabulary
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.reconcile.compare import Comparison, Key, both, compare
from dpone_dagster.reconcile.digest import digest_query, row_hash, run_digest

from .shape import StreamShape

RUN_KEYS_LIMIT = 200_000
"""A run that copied more rows than this is verified by comparing both whole tables."""
SECONDS_SLICE = 10_000
"""Rows per slice when the budget is in seconds."""
MIN_SLICE = 1_000
"""The smallest slice a ``runs`` budget takes (a small table is swept in fewer runs)."""
MAX_DIFFERING = 16
"""Ranges that differed kept for verifying again (more are found again by the next sweep)."""
DEFAULT_SWEEP_RUNS = 288
"""A full sweep in 288 runs: about once a day at a five-minute schedule."""


class CheckScope(
    Vocabulary, option="check", refusal="incremental_options_invalid", error=EngineError
):
    """What a verified run's check compares."""

    RUN = "run"
    """The run's keys exactly, and a rolling slice of the key (:class:`Sweep`)."""
    FULL = "full"
    """Both whole tables, every run."""


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
        stream_id: The stream.
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


@dataclass(frozen=True)
class Differences:
    """Keys a comparison found differing, classified.

    Attributes:
        later: Differing because the source changed or inserted them after the mark.
        gone: Only the target holds them (the source deleted them).
        unexplained: Differing with no such reason.
    """

    later: int = 0
    gone: tuple[Key, ...] = ()
    unexplained: tuple[Key, ...] = ()


@dataclass(frozen=True)
class RunKeys:
    """What the check of the run's keys found (``None`` ``checked``: too many; whole tables),
    and how many source rows lie above the mark (changed or inserted since: the next run's)."""

    checked: int | None
    found: Differences
    later: int = 0


@dataclass(frozen=True)
class SliceResult:
    """What the sweep's slices of this run verified, and the position after them (``differing``:
    the key ranges ``(after, end]`` in which this run found unexplained differences)."""

    rows: int
    ranges: int
    ranges_total: int
    keys_compared: int
    found: Differences
    position: SweepPosition
    differing: tuple[KeyRange, ...] = ()


def _key_cols(shape: StreamShape, alias: str = "") -> sql.Composed:
    prefix = sql.SQL(alias + ".") if alias else sql.SQL("")
    return sql.SQL(", ").join(sql.SQL("{}{}").format(prefix, k.ident) for k in shape.key)


def _key_text(shape: StreamShape, alias: str = "") -> sql.Composed:
    prefix = sql.SQL(alias + ".") if alias else sql.SQL("")
    return sql.SQL("ARRAY[{}]").format(
        sql.SQL(", ").join(sql.SQL("{}{}::text").format(prefix, k.ident) for k in shape.key)
    )


def _key_value(shape: StreamShape) -> sql.Composed:
    """``ROW(CAST(%s::text AS t1), ...)``: a key given as text, one parameter per column."""
    return sql.SQL("ROW({})").format(
        sql.SQL(", ").join(
            sql.SQL("CAST(%s::text AS {})").format(sql.SQL(k.type_sql)) for k in shape.key
        )
    )


def _cursor_above(
    src: Connection, shape: StreamShape, keys: list[Key], mark: str | None
) -> set[Key]:
    """Of ``keys``, those whose source row's cursor lies above ``mark`` (every present one,
    without a mark)."""
    if not keys:
        return set()
    cols = [f"k{i}" for i in range(len(shape.key))]
    on = sql.SQL(" AND ").join(
        sql.SQL("s.{} = CAST(u.{} AS {})").format(k.ident, sql.Identifier(c), sql.SQL(k.type_sql))
        for k, c in zip(shape.key, cols, strict=True)
    )
    above = (
        sql.SQL("true")
        if mark is None
        else sql.SQL("s.{c} > CAST(%s::text AS {t})").format(
            c=shape.cursor.ident, t=sql.SQL(shape.cursor.type_sql)
        )
    )
    query = sql.SQL(
        "SELECT {kt} FROM unnest({arrays}) AS u({names}) JOIN {t} AS s ON {on} WHERE {above}"
    ).format(
        kt=_key_text(shape, "s"),
        arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in cols),
        names=sql.SQL(", ").join(sql.Identifier(c) for c in cols),
        t=shape.source.ident, on=on, above=above,
    )  # fmt: skip
    params: list[object] = [[k[i] for k in keys] for i in range(len(cols))]
    if mark is not None:
        params.append(mark)
    return {tuple(r[0]) for r in src.execute(query, params)}


def _classify(
    src: Connection,
    shape: StreamShape,
    found: Comparison,
    mark: str | None,
    *,
    gone_allowed: bool,
) -> Differences:
    """Classifies the keys that differ between the source and the target."""
    differing = found.to_copy
    target_only = sorted(found.target_only)
    later = _cursor_above(src, shape, differing + target_only, mark)
    gone = tuple(sorted(k for k in target_only if k not in later)) if gone_allowed else ()
    unexplained = [k for k in differing if k not in later]
    if not gone_allowed:
        unexplained += [k for k in target_only if k not in later]
    count_later = sum(1 for k in differing + target_only if k in later)
    return Differences(count_later, gone, tuple(sorted(unexplained)))


def _target_differing(
    tgt: Connection, shape: StreamShape, h: sql.Composable, columns: list[list[str]],
    hashes: list[int],
) -> list[Key]:  # fmt: skip
    """Of the given keys (one text array per key column) and their source row hashes, those
    whose target row is missing or hashes otherwise; computed by the target, which returns
    only them."""
    cols = [f"k{i}" for i in range(len(shape.key))]
    on = sql.SQL(" AND ").join(
        sql.SQL("t.{} = CAST(u.{} AS {})").format(k.ident, sql.Identifier(c), sql.SQL(k.type_sql))
        for k, c in zip(shape.key, cols, strict=True)
    )
    # One index probe per key (LIMIT 1 keeps the planner from turning the lookup into a hash
    # join over the whole target): the cost follows the run's keys, not the table.
    query = sql.SQL(
        "SELECT ARRAY[{uk}] FROM unnest({arrays}, %s::int8[]) AS u({names}, h) LEFT JOIN LATERAL"
        " (SELECT {h} AS h FROM {t} AS t WHERE {on} AND {live} LIMIT 1) AS r ON true"
        " WHERE r.h IS DISTINCT FROM u.h"
    ).format(
        uk=sql.SQL(", ").join(sql.SQL("u.{}").format(sql.Identifier(c)) for c in cols),
        h=h, t=shape.target.ident, on=on,
        arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in cols),
        names=sql.SQL(", ").join(sql.Identifier(c) for c in cols), live=shape.live(),
    )  # fmt: skip
    return sorted(tuple(r[0]) for r in tgt.execute(query, [*columns, hashes]))


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
        order=_key_cols(shape),  # in key order: the target's probes walk its index in order
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
    differing = _target_differing(tgt, shape, h, list(row[1:-1]), list(row[-1])) if checked else []
    later = src.execute(
        sql.SQL("SELECT count(*) FROM {t} WHERE {c} > CAST(%s::text AS {ct})").format(
            t=shape.source.ident, c=shape.cursor.ident, ct=sql.SQL(shape.cursor.type_sql)
        ),
        (mark,),
    ).fetchone()
    count = int(later[0]) if later is not None else 0
    return RunKeys(checked, Differences(unexplained=tuple(differing)), count)


def _estimate(src: Connection, shape: StreamShape) -> int:
    row = src.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = CAST(%s AS regclass)",
        (shape.source.ident.as_string(src),),
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

    def __init__(self, src: Connection, tgt: Connection, shape: StreamShape) -> None:
        self.src, self.tgt, self.shape = src, tgt, shape
        self.h = row_hash(src, shape.columns)

    def _range(self, after: Key | None, end: Key | None) -> tuple[sql.Composable, list[object]]:
        parts: list[sql.Composable] = []
        params: list[object] = []
        cols = sql.SQL("ROW({})").format(_key_cols(self.shape))
        if after is not None:
            parts.append(sql.SQL("{} > {}").format(cols, _key_value(self.shape)))
            params += list(after)
        if end is not None:
            parts.append(sql.SQL("{} <= {}").format(cols, _key_value(self.shape)))
            params += list(end)
        return (sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")), params

    def end(self, after: Key | None, rows: int) -> Key | None:
        """The key ``rows`` keys after ``after`` on the source (``None``: no key follows it, so
        the slice is the last one and open-ended)."""
        where, params = self._range(after, None)
        query = sql.SQL(
            "SELECT {kt} FROM {t} WHERE {w} ORDER BY {k} OFFSET %s LIMIT 2"
        ).format(kt=_key_text(self.shape), t=self.shape.source.ident, w=where,
                 k=_key_cols(self.shape))  # fmt: skip
        found = self.src.execute(query, [*params, rows - 1]).fetchall()
        return tuple(found[0][0]) if len(found) == 2 else None

    def compare(self, after: Key | None, end: Key | None) -> Comparison:
        """The slice ``(after, end]`` compared: its digests first (one ``(count, sum)`` per side);
        when they differ, key by key (the one drill-down compare; a slice is at most the
        budget's size, so its keys are sent at once)."""
        where, params = self._range(after, end)
        source, target, rows = self.shape.sides(self.src, self.tgt, rows=True, where=where,
                                                params=params)  # fmt: skip
        a, b = both(
            lambda: run_digest(self.src, *digest_query(self.shape.source, self.h, where, params)),
            lambda: run_digest(
                self.tgt, *digest_query(self.shape.target, self.h, target.where, params)
            ),
        )
        if a == b:
            return Comparison()
        return compare(source, target, rows, direct=True)


def sweep_slices(
    src: Connection,
    tgt: Connection,
    shape: StreamShape,
    position: SweepPosition,
    sweep: Sweep,
    *,
    mark: str | None,
    at: datetime,
    gone_allowed: bool,
) -> SliceResult:
    """Verifies this run's slice(s) of the key from ``position``; the position after them.

    Args:
        src: The source session, in the final batch's snapshot.
        tgt: The target session, in its transaction (after the merge and deletes).
        shape: The stream.
        position: Where the sweep is.
        sweep: The budget.
        mark: The run's mark (a differing row whose source cursor is above it is the next run's).
        at: When the slice is proved (the snapshot's time).
        gone_allowed: Target keys the source lost are expected (``ignore``, or deletes found by
            the sweep), not differences.
    """
    estimate = _estimate(src, shape)
    size = slice_rows(sweep, estimate)
    slicer = _Slicer(src, tgt, shape)
    started = time.monotonic()
    rows = ranges = compared = later = 0
    gone: list[Key] = []
    unexplained: list[Key] = []
    pos = position
    recheck: list[KeyRange] = []
    named: list[KeyRange] = []
    for after, end in position.differing:  # ranges that differed: verified until they agree
        diff = slicer.compare(after, end)
        found = _classify(src, shape, diff, mark, gone_allowed=gone_allowed)
        later, compared = later + found.later, compared + diff.keys_compared
        gone += found.gone
        unexplained += found.unexplained
        if found.unexplained:
            recheck.append((after, end))
            named.append((after, end))
    pos = pos.model_copy(update={"differing": tuple(recheck)})
    while True:
        after = pos.after
        end = slicer.end(after, size)
        diff = slicer.compare(after, end)
        clean = True
        if not diff.empty:
            found = _classify(src, shape, diff, mark, gone_allowed=gone_allowed)
            later += found.later
            gone += found.gone
            unexplained += found.unexplained
            compared += diff.keys_compared
            clean = not found.unexplained
            if not clean:
                named.append((after, end))
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
    found = Differences(later, tuple(gone), tuple(sorted(unexplained)))
    return SliceResult(rows, ranges, total, compared, found, pos, tuple(named))


class SweepLedger:
    """Reads and writes the sweep positions in the ledger's ``incremental_sweeps`` table (the
    caller owns the transaction)."""

    def __init__(self, store: LedgerStore) -> None:
        tables = store.tables
        self._fetch = tables.sql("SELECT sweep_json FROM {stream_sweeps} WHERE stream_id = %s")
        self._save = tables.sql(
            "INSERT INTO {stream_sweeps} (stream_id, sweep_json) VALUES (%s, %s)"
            " ON CONFLICT (stream_id) DO UPDATE SET sweep_json = EXCLUDED.sweep_json,"
            " updated_at = clock_timestamp()"
        )

    def fetch(self, conn: Connection, stream_id: str) -> SweepPosition:
        """The stream's position (the start of the key when it has none)."""
        row = conn.execute(self._fetch, (stream_id,)).fetchone()
        if row is None:
            return SweepPosition(stream_id=stream_id)
        return SweepPosition.model_validate(row[0])

    def save(self, conn: Connection, position: SweepPosition) -> None:
        """Stores the position."""
        conn.execute(self._save, (position.stream_id, as_json(position)))
