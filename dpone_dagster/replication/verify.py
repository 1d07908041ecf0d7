"""The replication group's check (``dpone_reconciled``): every key the run applied, exactly, and a
rolling slice of each table's key, on the stream check's own pieces (:mod:`dpone_dagster.core.
sweep`, the one digest, the one drill-down compare).

The target holds the source as of the group's applied position ``L`` (the commit LSN of the last
source transaction applied); the source has moved on since. The check reads the source in one
snapshot, taken with the WAL position ``S`` it covers, and the target under the group's lock (no
run applies meanwhile):

1. **The run's keys.** Each target transaction records the keys its net effect touched (the
   apply path's hook, :class:`~.recorder.KeyRecorder`) in the ledger's ``replication_keys``,
   with its rows, in chunks of :data:`~.recorder.KEYS_CHUNK`. The target returns each chunk
   with its digest (how many of its keys it holds a row of, and the sum of their row hashes;
   the next chunks read on a thread of its own meanwhile), the source computes the same digest
   of the same keys (:func:`~dpone_dagster.core.keyed.keys_digest`), and only a chunk whose
   digests differ is compared key by key (:func:`~dpone_dagster.core.keyed.differing_keys`).
   No run's key set is held in Python: a chunk at a time. Checked keys are then removed (those
   that differ for no known reason stay, so the next check fails on them again until they
   agree).
2. **The rolling slice** (:func:`~dpone_dagster.core.sweep.sweep_slices`) of each table, its
   position in the ledger's ``replication_sweeps`` (``<slot>:<schema.table>``).

A run whose recorded keys are a large share of its table (a backlog) is checked by the whole
table's digest instead, which is also a full sweep (:mod:`.verify_whole`); a table without a
primary key is compared whole (:mod:`.verify_keyless`).

A key whose source row differs from the target's is a real difference only if no change to it
arrived after ``L``: those changes are still in the slot (it is advanced only to ``L``), so the
slot is peeked from ``L`` up to ``S`` (:class:`SlotChanges`) for the keys concerned; a key a
transaction committed after ``L`` inserted, updated, deleted (or a ``TRUNCATE`` of its table)
is counted as changed after the applied position, left to the next run. Every other difference
fails the check, naming its keys and the sweep's ranges.

The check run alone (:func:`verify_group` with ``full``) compares both whole tables with the
same rule, and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from psycopg import IsolationLevel, sql

from dpone_dagster.core.keyed import KeyedTables, differing_keys, keys_digest
from dpone_dagster.core.prefetch import prefetched
from dpone_dagster.core.sessions import transaction
from dpone_dagster.core.sweep import (
    Later,
    Sweep,
    SweepLedger,
    SweepPosition,
    classify,
    row_estimate,
    sweep_slices,
)
from dpone_dagster.core.verification import Verification, timed
from dpone_dagster.postgres.catalog import table_catalog
from dpone_dagster.postgres.connection import Connection, server_encoding
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.text_keys import TextKeys
from dpone_dagster.reconcile.compare import Comparison, Key, compare
from dpone_dagster.reconcile.digest import row_hash

from .changes import Lsn, lsn_text
from .group_plan import ReplicationGroup
from .group_state import GroupLedger
from .slot_changes import SlotChanges
from .verify_keyless import KeylessTable, check_keyless
from .verify_whole import WHOLE_SHARE, recorded_keys, whole_run_check

_FETCH_CHUNKS = 4
"""Chunks the check reads from the target per round trip."""


@dataclass(frozen=True)
class _Table:
    """One table of the group being checked."""

    tables: KeyedTables
    stream_id: str
    later: Later
    changes: SlotChanges


def _compared(
    src: Connection, tgt: Connection, table: TableName, soft: str | None
) -> KeyedTables | KeylessTable:
    """The table as its check compares it: the source's columns (generated ones left out) that
    the target has; by key (the source's key, the target's soft-delete column ``soft`` once it
    exists), or whole when it has no primary key (:mod:`.verify_keyless`)."""
    found = table_catalog(src, table)
    have = {
        str(r[0])
        for r in tgt.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = CAST(%s AS regclass)"
            " AND attnum > 0 AND NOT attisdropped",
            (table.ident.as_string(tgt),),
        )
    }
    columns = tuple(c for c in found.columns if not c.generated and c.name in have)
    if not found.key:
        return KeylessTable(table, table, columns)
    by_name = {c.name: c for c in found.columns}
    marked = soft if soft in have else None  # added with the first delete: until then, none
    return KeyedTables(table, table, columns, tuple(by_name[k] for k in found.key), marked)


_CHUNKS = (
    # A chunk is a 2-D array: a row per key column, a column per key. A ledger written before
    # chunks holds one key per row (a 1-D array): read as a chunk of one.
    "SELECT c.key, d.n, d.s FROM (SELECT CASE WHEN array_ndims(key) = 1"
    " THEN ARRAY(SELECT ARRAY[x] FROM unnest(key) AS x) ELSE key END AS key FROM {keys}"
    " WHERE slot = %s AND source_table = %s AND cardinality(key) > 0) AS c CROSS JOIN LATERAL"
    " (SELECT count(r.h) AS n, coalesce(sum(r.h), 0) AS s FROM unnest({columns}) AS u({names})"
    " LEFT JOIN LATERAL (SELECT {h} AS h FROM {t} AS t WHERE {on} AND {live} LIMIT 1) AS r"
    " ON true) AS d"
)


def _run_keys(
    src: Connection, tgt: Connection, keys: sql.Identifier, table: _Table, slot: str
) -> tuple[int, list[Key]]:
    """The keys the runs applied since the last check, and those whose source row differs.

    The target returns each recorded chunk of keys with its digest (how many of its keys it
    holds a row of, the sum of their row hashes); the source computes the same digest of the
    same keys; only a chunk whose digests differ is compared key by key."""
    t = table.tables
    h = row_hash(src, t.columns)
    # A slice per key column, each read once (a subscript per key would read the whole array
    # each time), unnested side by side: a row per key.
    unnested = TextKeys.from_arrays(t.key, [[] for _ in t.key])
    columns = sql.SQL(", ").join(
        sql.SQL("c.key[{}:{}]").format(sql.Literal(i + 1), sql.Literal(i + 1))
        for i in range(len(t.key))
    )
    query = sql.SQL(_CHUNKS).format(
        keys=keys, columns=columns, names=sql.SQL(", ").join(unnested.names), h=h,
        t=t.target.ident, on=unnested.equal("t"), live=t.live(),
    )  # fmt: skip

    def chunks() -> Iterator[tuple[list[list[str]], int, int]]:
        with tgt.cursor("dpone_replication_keys") as cursor:
            cursor.execute(query, (slot, t.source.qualified))
            while rows := cursor.fetchmany(_FETCH_CHUNKS):
                yield from rows

    checked = 0
    differ: list[TextKeys] = []
    # The target digests the next chunks while the source digests this one.
    for arrays, count, total in prefetched(chunks, ahead=2 * _FETCH_CHUNKS):
        given = TextKeys.from_arrays(t.key, arrays)
        checked += len(arrays[0])
        if keys_digest(src, t.source, given, sql.SQL("true"), h) != (count, total):
            differ.append(given)
    differing = [k for given in differ for k in _differing(src, tgt, t, given, h)]
    return checked, differing


def _differing(
    src: Connection, tgt: Connection, t: KeyedTables, given: TextKeys, h: sql.Composable
) -> list[Key]:
    """The keys of a chunk whose digests differ, compared one by one."""
    query = sql.SQL(
        "SELECT r.h FROM {given} LEFT JOIN LATERAL (SELECT {h} AS h FROM {t} AS t"
        " WHERE {on} AND {live} LIMIT 1) AS r ON true"
    ).format(given=given.rows(), h=h, t=t.target.ident, on=given.equal("t"), live=t.live())
    hashes = [None if r[0] is None else int(r[0]) for r in tgt.execute(query, given.params)]
    return differing_keys(src, t.source, t.key, sql.SQL("true"), h, given.arrays, hashes)


def _keep(tgt: Connection, keys: sql.Identifier, slot: str, table: KeyedTables,
          kept: list[Key]) -> None:  # fmt: skip
    """Empties the table's recorded keys, but for ``kept`` (verified again by the next check)."""
    tgt.execute(
        sql.SQL("DELETE FROM {} WHERE slot = %s AND source_table = %s").format(keys),
        (slot, table.source.qualified),
    )
    if not kept:
        return
    chunk = TextKeys.of(table.key, kept).arrays
    tgt.execute(
        sql.SQL("INSERT INTO {} (slot, source_table, key) VALUES (%s, %s, %s::text[])").format(
            keys
        ),
        (slot, table.source.qualified, list(chunk)),
    )


@dataclass(frozen=True)
class CheckContext:
    """What a group's check runs with.

    Attributes:
        group: The group.
        ledger: The group's ledger (its lock, its applied position, its check's tables).
        sweep: The rolling slice's budget.
    """

    group: ReplicationGroup
    ledger: GroupLedger
    sweep: Sweep


def verify_group(
    src: Connection, tgt: Connection, control: Connection, how: CheckContext, *, full: bool
) -> Mapping[TableName, Verification]:
    """Checks every table of the group (see the module); ``full``: both whole tables, writing
    nothing (the check run alone).

    Args:
        src: An idle source session (the check's snapshot is taken in it).
        tgt: An idle target session (the check's transaction, under the group's lock).
        control: An idle source session that may read the slot (the peeks).
        how: The group, its ledger and the sweep's budget.
        full: Compare both whole tables instead of the run's keys and a slice.

    Returns:
        Each table's verification (none before the group's initial copy completed); a table
        without a primary key is compared whole (:mod:`.verify_keyless`).
    """
    group, ledger = how.group, how.ledger
    encoding = server_encoding(src)
    checks: dict[TableName, Verification] = {}
    with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
        ledger.lock(tgt, group.slot)
        state = ledger.fetch(tgt, group.slot)
        if state is None or state.phase != "streaming" or state.applied_lsn is None:
            return checks
        applied = state.applied_lsn
        with transaction(src, IsolationLevel.REPEATABLE_READ, read_only=True):
            # The snapshot is taken by this statement, before the position is read: every
            # transaction it sees committed before that position.
            row = src.execute(
                "SELECT statement_timestamp(), (pg_current_wal_insert_lsn() - '0/0')::int8"
            ).fetchone()
            assert row is not None
            at, upto = row[0], int(row[1])
            slot = SlotChanges(control, group, applied, upto, encoding)
            for name in group.tables:
                compared = _compared(src, tgt, name, group.soft_column)
                started = time.monotonic()
                if isinstance(compared, KeylessTable):
                    found = _keyless(src, tgt, compared, slot, how, (at, applied), full=full)
                else:
                    later = _later(slot, compared)
                    table = _Table(compared, _stream_id(group, name), later, slot)
                    found = (
                        _full(src, tgt, table, at, applied)
                        if full
                        else _by_run(src, tgt, table, how, at, applied)
                    )
                checks[name] = timed(found, started)
    return checks


def _stream_id(group: ReplicationGroup, table: TableName) -> str:
    """The table's row of the group's sweeps (``<slot>:<schema.table>``)."""
    return f"{group.slot}:{table.qualified}"


def _keyless(
    src: Connection,
    tgt: Connection,
    table: KeylessTable,
    slot: SlotChanges,
    how: CheckContext,
    proof: tuple[datetime, Lsn],
    *,
    full: bool,
) -> Verification:
    """A keyless table's check (:mod:`.verify_keyless`): its position is read and written in
    the check's transaction (the check run alone, ``full``, compares it now and writes
    nothing)."""
    sweeps = SweepLedger(how.ledger.store, how.ledger.store.tables.replication_sweeps)
    stream_id = _stream_id(how.group, table.source)
    position = SweepPosition(stream_id=stream_id) if full else sweeps.fetch(tgt, stream_id)
    found, moved = check_keyless(src, tgt, table, slot, proof, sweep=None if full else how.sweep,
                                 position=position)  # fmt: skip
    if not full:
        sweeps.save(tgt, moved)
    return found


def _later(slot: SlotChanges, keyed: KeyedTables) -> Later:
    names = [k.name for k in keyed.key]
    return lambda keys: slot.changed(keyed.source, names, keys)


def _full(
    src: Connection, tgt: Connection, table: _Table, at: datetime, applied: Lsn
) -> Verification:
    """Both whole tables compared (the one drill-down compare)."""
    found = compare(*table.tables.sides(src, tgt, rows=True))
    d = classify(found, table.later, gone_allowed=False)
    return Verification(
        ok=not d.unexplained, keys_compared=found.keys_compared,
        ranges_differing=found.ranges_differing, changed_since_mark=d.later, deleted_kept=0,
        unexplained=len(d.unexplained), examples=d.unexplained[:20], proved_at=at,
        applied_lsn=lsn_text(applied),
    )  # fmt: skip


def _by_run(
    src: Connection, tgt: Connection, table: _Table, how: CheckContext, at: datetime,
    applied: Lsn,
) -> Verification:  # fmt: skip
    """The run's keys and this run's slice of the sweep; the sweep's position and the keys left
    to verify again are written in the check's transaction."""
    tables = how.ledger.store.tables
    keys, slot = tables.replication_keys, how.group.slot
    sweeps = SweepLedger(how.ledger.store, tables.replication_sweeps)
    whole = _whole(src, tgt, table, how, (at, applied), sweeps)
    if whole is not None:
        verification, moved, kept = whole
        sweeps.save(tgt, moved)
        _keep(tgt, keys, slot, table.tables, kept)
        return verification
    checked, differing = _run_keys(src, tgt, keys, table, slot)
    own = classify(_as_comparison(differing), table.later, gone_allowed=False)
    position = sweeps.fetch(tgt, table.stream_id)
    swept = sweep_slices(src, tgt, table.tables, position, how.sweep, later=table.later, at=at,
                         gone_allowed=False)  # fmt: skip
    sweeps.save(tgt, swept.position)
    _keep(tgt, keys, slot, table.tables, list(own.unexplained))
    unexplained = sorted({*own.unexplained, *swept.found.unexplained})
    pos = swept.position
    return Verification(
        ok=not unexplained, keys_compared=2 * checked + swept.keys_compared,
        ranges_differing=0, changed_since_mark=own.later + swept.found.later, deleted_kept=0,
        unexplained=len(unexplained), examples=tuple(unexplained[:20]), scope="run",
        keys_checked=checked, ranges_checked=swept.ranges, ranges_total=swept.ranges_total,
        rows_swept=swept.rows, sweep_started_at=pos.started_at, swept_at=pos.last_full_at,
        swept_from=pos.last_full_started_at, proved_at=at, differing_ranges=swept.differing,
        applied_lsn=lsn_text(applied),
    )  # fmt: skip


def _whole(
    src: Connection, tgt: Connection, table: _Table, how: CheckContext,
    proof: tuple[datetime, Lsn], sweeps: SweepLedger,
) -> tuple[Verification, SweepPosition, list[Key]] | None:  # fmt: skip
    """The run's check by the whole table, when its recorded keys are a large share of it
    (:mod:`.verify_whole`); None to check them key by key."""
    t, slot = table.tables, how.group.slot
    keys = how.ledger.store.tables.replication_keys
    recorded, marked = recorded_keys(tgt, keys, slot, t.source)
    estimate = row_estimate(src, t.source)  # 0 when unknown: by key then
    if not marked and (not recorded or not estimate or recorded * WHOLE_SHARE < estimate):
        return None
    # After a TRUNCATE (None), every key differs for a known reason: compared range by range.
    excluded = table.changes.all_keys(t.source, [k.name for k in t.key]) or set()
    position = sweeps.fetch(tgt, table.stream_id)
    return whole_run_check(src, tgt, t, (excluded, table.later), proof, (how.sweep, position),
                           recorded)  # fmt: skip


def _as_comparison(differing: list[Key]) -> Comparison:
    """The run's differing keys, as a comparison (missing, extra or changed are one here)."""
    return Comparison(differing=dict.fromkeys(differing, ""))


__all__ = [
    "CheckContext",
    "SlotChanges",
    "verify_group",
]
