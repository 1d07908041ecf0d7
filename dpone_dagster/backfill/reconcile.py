"""The final reconciliation: the target equals the source at the mark, range by range, or says so.

Every batch range ``(after, upper]`` is checked on the source under ONE ``REPEATABLE READ READ
ONLY`` snapshot and on the target under one snapshot, in two steps:

1. A range whose receipt carries row-version evidence is first tested by row versions
   (:mod:`dpone_dagster.reconcile.row_versions`): a count and "nobody wrote these rows since the
   batch" on each side. A range that passes is proven equal without reading its values.
2. Every other range (and any that failed step 1) is digested: its row count and an
   order-independent hash of the exact content of its rows, computed by each server over its
   own rows (:mod:`dpone_dagster.reconcile.digest`); only the two numbers per range cross the
   wire.

The two sides run concurrently (two sessions, two threads), so each step costs the slower side,
not the sum.

The reconciliation hash is not the batch receipt's content hash, and is not meant to be: the
receipt's ``sha256`` over the COPY stream binds what one batch snapshot sent; the reconciliation
compares what the source and the target hold at the end, both digested the same way, and keeps
the receipt's hash beside its own (``receipt_hash``) for the record.

A range that differs is repaired from the same source snapshot through the staged apply (the one
drill-down compare names the keys that differ; only their rows are staged; rows missing from the
target are inserted, equal rows are left alone) and digested again. Whatever
still differs (a row the source changed or deleted after its batch was copied, a row the target
holds that the source does not) is reported with ``backfill_record_changed``, stored in the
ledger's range checks, and the run becomes ``blocked``: never silently accepted.

With ``on_changed="repair"`` the history may change: in a differing range, the one drill-down
compare (:mod:`dpone_dagster.reconcile.compare`) names the keys that differ, and only those are
rewritten from the same source snapshot (rows gone from the source deleted, changed rows
updated, missing rows inserted; every other row of the range left as it is), so every range
ends equal to the source at that ONE snapshot, and the run is
labelled ``repaired_to_one_snapshot``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from psycopg import IsolationLevel, sql

from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.core.ledger import LedgerStore
from dpone_dagster.core.sessions import Sessions, transaction
from dpone_dagster.cursor.backfill_documents import BackfillStatus, BatchReceipt
from dpone_dagster.cursor.chain import verify_chain
from dpone_dagster.cursor.cursor_ledger import RunLedger
from dpone_dagster.cursor.range_checks import (
    OnChanged,
    RangeCheck,
    RangeOutcome,
    ReconciliationReport,
)
from dpone_dagster.lifecycle import token_digest
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile import Digest, Proof
from dpone_dagster.reconcile.digest import digest_query, require_row_hash, row_hash, run_digest
from dpone_dagster.reconcile.row_versions import (
    horizon,
    proven,
    source_proof,
    target_proof,
    usable,
)

from .existing_rows import apply_missing, apply_repair
from .results import after_reconcile
from .shape import TableShape

Query = tuple[sql.Composed, list[object]]


def _range_query(
    shape: TableShape, table: TableName, row: sql.Composed, rng: BatchReceipt
) -> Query:
    """The digest query of one batch range of ``table``."""
    where, params = shape.where(rng.after, rng.observation.upper)
    return digest_query(table, row, where, params)


def _digest_all(conn: Connection, queries: list[Query]) -> list[Digest]:
    return [run_digest(conn, query, params) for query, params in queries]


def _fetch_all(
    conn: Connection, queries: list[tuple[sql.Composed, list[object]]]
) -> list[tuple[object, ...]]:
    found = []
    for query, params in queries:
        row = conn.execute(query, params).fetchone()
        assert row is not None  # an aggregate always answers one row
        found.append(row)
    return found


def _prove(
    pool: ThreadPoolExecutor,
    src: Connection,
    reader: Connection,
    shape: TableShape,
    ranges: list[BatchReceipt],
) -> set[int]:
    """The sequences of the ranges that row versions prove equal on both sides."""
    if shape.versions is None or not any(r.observation.row_versions for r in ranges):
        return set()
    src_horizon = pool.submit(horizon, src, shape.source, shape.columns)
    tgt_horizon = pool.submit(horizon, reader, shape.target, shape.columns)
    s_h, t_h = src_horizon.result(), tgt_horizon.result()
    tried = [
        (r, r.observation.row_versions)
        for r in ranges
        if r.observation.row_versions is not None
        and r.observation.source_count == r.observation.target_count
        and usable(r.observation.row_versions, s_h, t_h)
    ]
    if tried and len(tried) == len(ranges):  # the whole run first: one query per side
        whole = shape.where(ranges[0].after, ranges[-1].observation.upper)
        evidence = [e for _, e in tried]
        s_all = pool.submit(_fetch_all, src, [source_proof(shape.source, whole, evidence)])
        t_all = pool.submit(_fetch_all, reader, [target_proof(shape.target, whole, evidence)])
        if proven(s_all.result()[0], sum(r.observation.source_count for r in ranges)) and proven(
            t_all.result()[0], sum(r.observation.target_count for r in ranges)
        ):
            return {r.sequence for r in ranges}
    wheres = [shape.where(r.after, r.observation.upper) for r, _ in tried]
    s_side = pool.submit(
        _fetch_all,
        src,
        [source_proof(shape.source, w, [e]) for w, (_, e) in zip(wheres, tried, strict=True)],
    )
    t_side = pool.submit(
        _fetch_all,
        reader,
        [target_proof(shape.target, w, [e]) for w, (_, e) in zip(wheres, tried, strict=True)],
    )
    return {
        r.sequence
        for (r, _), s, t in zip(tried, s_side.result(), t_side.result(), strict=True)
        if proven(s, r.observation.source_count) and proven(t, r.observation.target_count)
    }


def _snapshot(conn: Connection) -> tuple[str, datetime]:
    """The digest of the snapshot of ``conn``'s open transaction, and when it was taken (the
    snapshot of a ``REPEATABLE READ`` transaction is taken by its first statement: this one)."""
    row = conn.execute("SELECT pg_current_snapshot()::text, statement_timestamp()").fetchone()
    assert row is not None
    return token_digest(str(row[0])), row[1]


def _check(
    rng: BatchReceipt,
    source: Digest,
    target: Digest,
    *,
    repaired: bool = False,
    proof: Proof = Proof.CONTENT_HASH,
    inserted: int = 0,
    updated: int = 0,
    deleted: int = 0,
    code: str | None = None,
    detail: str = "",
) -> RangeCheck:
    """The check of one range; ``detail`` and ``code`` describe a difference, if any."""
    equal = source == target
    return RangeCheck(
        sequence=rng.sequence,
        after=rng.after,
        upper=rng.observation.upper,
        source_count=source.count,
        target_count=target.count,
        source_hash=source.hash or "",
        target_hash=target.hash or "",
        receipt_hash=rng.observation.content_hash,
        proof=proof,
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        outcome=(
            RangeOutcome.DIFFERS
            if not equal
            else RangeOutcome.REPAIRED
            if repaired
            else RangeOutcome.EQUAL
        ),
        code=None if equal else code or "backfill_record_changed",
        detail="" if equal else detail,
    )


def _repair(
    sessions: Sessions, shape: TableShape, rng: BatchReceipt, target_query: Query,
    source: Digest, before: Digest, on_changed: OnChanged,
) -> RangeCheck:  # fmt: skip
    """Repairs one differing range from the source's open snapshot and digests it again.

    ``on_changed="fail"`` only inserts missing rows (a changed row is reported, never
    overwritten); ``"repair"`` rewrites only the keys that differ (the one drill-down compare:
    changed rows updated, rows gone from the source deleted, missing rows inserted).
    """
    tgt, after, upper = sessions.target, rng.after, rng.observation.upper
    inserted = updated = deleted = 0
    code, detail = None, ""
    try:
        with tgt.transaction(savepoint_name="dpone_repair"):
            rows = max(source.count, before.count)
            if on_changed is OnChanged.REPAIR:
                done = apply_repair(sessions.source, tgt, shape, after, upper, rows=rows)
                inserted, updated, deleted = done.inserted, done.updated, done.deleted
            else:  # only the keys the drill-down names are staged
                inserted = apply_missing(
                    sessions.source, tgt, shape, after, upper, rows=rows
                ).inserted
    except EngineError as exc:  # the range's rows are left as they were
        code, detail = exc.code, exc.message
    target = run_digest(tgt, *target_query)
    if target != source and code is None:
        detail = (
            f"The target holds {target.count} rows of the range, the source {source.count}: rows "
            "were deleted from the source after the batch was copied, or written to the target."
        )
    return _check(
        rng, source, target, repaired=True, code=code, detail=detail,
        inserted=inserted, updated=updated, deleted=deleted,
    )  # fmt: skip


@dataclass(frozen=True)
class _Measured:
    """The read-only pass: ranges proven by row versions, and both digests of every other range
    with the target's digest query (run again after a repair)."""

    proved: set[int]
    digests: dict[int, tuple[Digest, Digest]]
    target_queries: dict[int, Query]


def _measure(
    src: Connection,
    reader: Connection,
    shape: TableShape,
    ranges: list[BatchReceipt],
    row_versions: bool,
) -> _Measured:
    """Proves what row versions can, then digests every other range on both sides at once."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpone-reconcile") as pool:
        proved = _prove(pool, src, reader, shape, ranges) if row_versions else set()
        hashed = [r for r in ranges if r.sequence not in proved]
        queries: dict[int, tuple[Query, Query]] = {}
        if hashed:  # the send functions are looked up only when a range needs its hash
            row = row_hash(src, shape.columns)
            queries = {
                r.sequence: (
                    _range_query(shape, shape.source, row, r),
                    _range_query(shape, shape.target, row, r),
                )
                for r in hashed
            }
        src_side = pool.submit(_digest_all, src, [queries[r.sequence][0] for r in hashed])
        tgt_side = pool.submit(_digest_all, reader, [queries[r.sequence][1] for r in hashed])
        digests = {
            r.sequence: (s, t)
            for r, s, t in zip(hashed, src_side.result(), tgt_side.result(), strict=True)
        }
    return _Measured(proved, digests, {n: q[1] for n, q in queries.items()})


@contextmanager
def _repairs(conn: Connection, run_id: str, needed: bool) -> Iterator[None]:
    """The target transaction repairs are written in, under the run's lock (none if not needed)."""
    if not needed:
        yield
        return
    with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
        LedgerStore.lock(conn, run_id)  # no batch of the run commits while its ranges are repaired
        yield


def _check_ranges(
    sessions: Sessions, shape: TableShape, ranges: list[BatchReceipt], measured: _Measured,
    repair: bool, on_changed: OnChanged,
) -> list[RangeCheck]:  # fmt: skip
    """One check per range: proven, equal, or repaired from the source's open snapshot (in the
    target's open transaction, when one is needed)."""
    digests = measured.digests
    checks: list[RangeCheck] = []
    for rng in ranges:
        if rng.sequence in measured.proved:
            same = Digest(rng.observation.source_count, rng.observation.content_hash)
            checks.append(_check(rng, same, same, proof=Proof.ROW_VERSIONS))
            continue
        s, t = digests[rng.sequence]
        if s == t or not repair:
            checks.append(_check(rng, s, t, detail="Not repaired (repair=False)."))
            continue
        query = measured.target_queries[rng.sequence]
        checks.append(_repair(sessions, shape, rng, query, s, t, on_changed))
    return checks


Settle = Callable[[Connection, ReconciliationReport], None]
"""Records a report in the ledger (the run's range checks and state), in the session's open
transaction."""


def reconcile_ranges(
    sessions: Sessions,
    reader: Connection,
    shape: TableShape,
    run_id: str,
    receipts: list[BatchReceipt],
    *,
    repair: bool = True,
    row_versions: bool = True,
    on_changed: OnChanged = OnChanged.FAIL,
    settle: Settle | None = None,
) -> ReconciliationReport:
    """Compares (and repairs) every batch range; commits the repairs on the target.

    The source is read under one snapshot throughout (repairs copy from it too); the target is
    read under one snapshot by ``reader``, then repaired in one transaction of ``sessions.target``.

    Args:
        sessions: Source and target sessions (autocommit, idle).
        reader: A second target session for the concurrent read-only pass.
        shape: The resolved tables.
        run_id: The run.
        receipts: The run's receipts in sequence order.
        repair: Copy missing rows into differing ranges (else only report).
        row_versions: Prove untouched ranges by row versions (else hash every range).
        on_changed: ``"repair"`` also rewrites changed rows and deletes rows gone from the
            source, so a repaired range equals the source at this snapshot.
        settle: Records the report. When the ledger lives in the target it runs in the
            repairs' own transaction, so the rows repaired and their record commit together;
            otherwise in a ledger transaction once the repairs have committed.

    Returns:
        One check per range with rows or bounds; ``ok`` is False when any range differs.
    """
    src = sessions.source
    require_row_hash(src, reader)
    ranges = [r for r in receipts if r.observation.upper is not None]
    try:
        with transaction(src, IsolationLevel.REPEATABLE_READ, read_only=True):
            source_snapshot, proved_at = _snapshot(src)
            with transaction(reader, IsolationLevel.REPEATABLE_READ, read_only=True):
                target_snapshot, _ = _snapshot(reader)
                measured = _measure(src, reader, shape, ranges, row_versions)
            needed = repair and any(s != t for s, t in measured.digests.values())
            together = settle is not None and needed and sessions.ledger_in_target
            with _repairs(sessions.target, run_id, needed):
                checks = _check_ranges(sessions, shape, ranges, measured, repair, on_changed)
                report = ReconciliationReport(
                    run_id=run_id, source_snapshot=source_snapshot,
                    target_snapshot=target_snapshot, proved_at=proved_at, ranges=tuple(checks),
                )  # fmt: skip
                if together and settle is not None:
                    settle(sessions.target, report)
        if settle is not None and not together:
            with transaction(sessions.ledger, IsolationLevel.READ_COMMITTED, read_only=False):
                settle(sessions.ledger, report)
    except BaseException:
        sessions.abandon()
        raise
    return report


def reconcile_run(
    sessions: Sessions,
    reader: Connection,
    ledger: RunLedger,
    shape: TableShape,
    run_id: str,
    *,
    repair: bool = True,
    row_versions: bool = True,
    on_changed: OnChanged = OnChanged.FAIL,
) -> ReconciliationReport:
    """A run's final reconciliation: its checkpoint chain verified, every range compared
    (:func:`reconcile_ranges`), the checks recorded and the run settled under its lock (in the
    repairs' transaction when the ledger lives in the target).

    A run at its mark becomes ``succeeded`` (label ``several_snapshots_reconciled`` when several
    batch snapshots were used, ``repaired_to_one_snapshot`` when ``on_changed="repair"``
    rewrote rows) or ``blocked``.

    Raises:
        EngineError: ``backfill_run_invalid`` for a missing run or a broken chain.
    """
    lc = sessions.ledger
    run = ledger.fetch(lc, run_id)
    if run is None:
        raise engine_error("backfill_run_invalid", "This scope has no run yet; plan first.")
    receipts = ledger.receipts(lc, run_id)
    verify_chain(run, receipts)

    def settle(conn: Connection, report: ReconciliationReport) -> None:
        ledger.lock(conn, run_id)
        durable = ledger.fetch(conn, run_id)
        assert durable is not None
        ledger.record_checks(conn, report)
        if durable.status in (BackfillStatus.SUCCEEDED, BackfillStatus.BLOCKED):
            ledger.swap(conn, durable, after_reconcile(durable, report))

    return reconcile_ranges(
        sessions, reader, shape, run_id, receipts, repair=repair, row_versions=row_versions,
        on_changed=on_changed, settle=settle,
    )  # fmt: skip
