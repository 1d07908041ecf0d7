"""The final reconciliation: the target equals the source at the mark, range by range, or says so.

Each batch range ``(after, upper]`` is read from the source under ONE ``REPEATABLE READ READ
ONLY`` snapshot and from the target under one snapshot, both as the same COPY stream the batch
hashed (same columns, same order, same format): equal count and equal sha256 mean equal rows.
The two sides are read concurrently (two sessions, two threads), each block hashed and dropped.

A range that differs is repaired from the same source snapshot through the staged apply (rows
missing from the target are inserted; equal rows are left alone) and hashed again. Whatever
still differs (a row the source changed or deleted after its batch was copied, a row the target
holds that the source does not) is reported with ``backfill_record_changed``, stored in the
ledger's range checks, and the run becomes ``blocked``: never silently accepted.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psycopg

from dpone_dagster.lifecycle import token_digest
from dpone_dagster.postgres.copy import copy_out_statement
from dpone_dagster.postgres.identifiers import TableName

from .copier import Sessions, staged_apply
from .errors import BackfillError
from .protocol import BatchReceipt
from .reconcile_model import RangeCheck, RangeOutcome, ReconciliationReport
from .shape import TableShape

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class _Range:
    sequence: int
    after: str | None
    upper: str
    receipt_hash: str


def _hash_range(conn: Conn, shape: TableShape, table: TableName, rng: _Range) -> tuple[int, str]:
    select, params = shape.select_range(table, rng.after, rng.upper)
    digest = hashlib.sha256()
    with conn.cursor() as cur:
        with cur.copy(copy_out_statement(select, shape.fmt), params) as copy:
            for block in copy:
                digest.update(block)
        return cur.rowcount, "sha256:" + digest.hexdigest()


def _read_side(
    conn: Conn, shape: TableShape, table: TableName, ranges: list[_Range]
) -> list[tuple[int, str]]:
    return [_hash_range(conn, shape, table, r) for r in ranges]


def _snapshot(conn: Conn) -> str:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", prepare=False)
    row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert row is not None
    return token_digest(str(row[0]))


def _compared(rng: _Range, source: tuple[int, str], target: tuple[int, str]) -> RangeCheck:
    """The check of a range read on both sides and not repaired."""
    equal = source == target
    return RangeCheck(
        sequence=rng.sequence,
        after=rng.after,
        upper=rng.upper,
        source_count=source[0],
        target_count=target[0],
        source_hash=source[1],
        target_hash=target[1],
        receipt_hash=rng.receipt_hash,
        outcome=RangeOutcome.EQUAL if equal else RangeOutcome.DIFFERS,
        code=None if equal else "backfill_record_changed",
        detail="" if equal else "Not repaired (repair=False).",
    )


def _repair(
    sessions: Sessions, shape: TableShape, rng: _Range, source: tuple[int, str]
) -> RangeCheck:
    tgt = sessions.target
    select, params = shape.select_range(shape.source, rng.after, rng.upper)
    tgt.execute("SAVEPOINT dpone_repair", prepare=False)
    inserted, code, detail = 0, None, ""
    try:
        _, _, _, inserted, _, _ = staged_apply(
            sessions, shape, copy_out_statement(select, shape.fmt), params
        )
        tgt.execute("RELEASE SAVEPOINT dpone_repair", prepare=False)
    except BackfillError as exc:
        tgt.execute("ROLLBACK TO SAVEPOINT dpone_repair", prepare=False)
        code, detail = exc.code, exc.message
    count, target_hash = _hash_range(tgt, shape, shape.target, rng)
    equal = (count, target_hash) == source
    if not equal and code is None:
        code = "backfill_record_changed"
        detail = (
            f"The target holds {count} rows of the range, the source {source[0]}: rows were "
            "deleted from the source after the batch was copied, or written to the target."
        )
    return RangeCheck(
        sequence=rng.sequence,
        after=rng.after,
        upper=rng.upper,
        source_count=source[0],
        target_count=count,
        source_hash=source[1],
        target_hash=target_hash,
        receipt_hash=rng.receipt_hash,
        inserted=inserted,
        outcome=RangeOutcome.REPAIRED if equal else RangeOutcome.DIFFERS,
        code=None if equal else code,
        detail=detail,
    )


def reconcile_ranges(
    sessions: Sessions,
    reader: Conn,
    shape: TableShape,
    run_id: str,
    receipts: list[BatchReceipt],
    *,
    repair: bool = True,
) -> ReconciliationReport:
    """Compares (and repairs) every batch range; commits the repairs on the target.

    Args:
        sessions: Source and target sessions (autocommit, idle).
        reader: A second target session for the concurrent read-only pass.
        shape: The resolved tables.
        run_id: The run.
        receipts: The run's receipts in sequence order.
        repair: Copy missing rows into differing ranges (else only report).

    Returns:
        One check per range with rows or bounds; ``ok`` is False when any range differs.
    """
    ranges = [
        _Range(r.sequence, r.after, r.observation.upper, r.observation.content_hash)
        for r in receipts
        if r.observation.upper is not None
    ]
    src = sessions.source
    try:
        source_snapshot = _snapshot(src)
        target_snapshot = _snapshot(reader)
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpone-reconcile") as pool:
            src_side = pool.submit(_read_side, src, shape, shape.source, ranges)
            tgt_side = pool.submit(_read_side, reader, shape, shape.target, ranges)
            source_sums, target_sums = src_side.result(), tgt_side.result()
        reader.execute("COMMIT", prepare=False)
        checks: list[RangeCheck] = []
        began = False
        for rng, s, t in zip(ranges, source_sums, target_sums, strict=True):
            if s == t or not repair:
                checks.append(_compared(rng, s, t))
                continue
            if not began:
                sessions.target.execute("BEGIN ISOLATION LEVEL READ COMMITTED", prepare=False)
                sessions.target.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (run_id,)
                )
                began = True
            checks.append(_repair(sessions, shape, rng, s))
        if began:
            sessions.target.execute("COMMIT", prepare=False)
        src.execute("COMMIT", prepare=False)
    except BaseException:
        sessions.abandon()
        if not reader.closed and not reader.broken:
            reader.execute("ROLLBACK", prepare=False)
        raise
    return ReconciliationReport(
        run_id=run_id,
        source_snapshot=source_snapshot,
        target_snapshot=target_snapshot,
        ranges=tuple(checks),
    )
