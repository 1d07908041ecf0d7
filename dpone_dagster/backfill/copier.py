"""One batch: read a keyset slice under its own snapshot, COPY it, commit it with its receipt.

The seed fetched each batch as JSON rows and inserted them one by one (about 0.01 of the raw
COPY pipe). Here a batch is:

1. Under the run's advisory lock (ledger session), the durable run and any receipt already
   stored for this batch id are read: a stored receipt with the same digest is a lost response
   and is answered by replay; anything else that does not build on the durable checkpoint is
   refused (:func:`rules.check_request`).
2. The source opens a ``REPEATABLE READ READ ONLY`` transaction; its snapshot token, clock and
   read window go into a lifecycle receipt. Inside it the batch's upper bound is found (the
   ``batch_size``-th cursor value after the checkpoint, all ties included, at most the mark) and
   the range is counted.
3. The range streams as binary COPY, block by block (memory stays flat), straight into the
   target inside a savepoint, its bytes hashed on the way (the content hash). If a row of the
   batch already exists in the target (a unique violation), the savepoint is rolled back and the
   same snapshot is copied again into a temporary staging table, then applied set-based: new
   rows inserted, equal rows counted as duplicates, a differing row refused with
   ``backfill_record_changed``. (Staging every batch would cost an extra pass of the executor
   per row and take the backfill below 0.70 of the raw pipe; it only pays when rows exist.)
4. The target counts the range, the pure rule checks order and counts, and the receipt and the
   advanced run are written to the ledger: in the target's own transaction when the ledger is
   there (one COMMIT for rows and receipt), else right after the target's commit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import ExtractionLifecycleAuthority, SnapshotEvidence
from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.copy import copy_in_statement, copy_out_statement

from .errors import backfill_error
from .ledger import Ledger
from .protocol import ApplyPath, BackfillRun, BatchObservation, BatchReceipt, BatchRequest
from .rules import apply_batch, check_request, replay
from .shape import TableShape

Conn = psycopg.Connection[tuple[object, ...]]
PhaseHook = Callable[[str], None]

SERVER_CLOCK = "postgresql.clock_timestamp"
SNAPSHOT_AUTHORITY = "postgresql.pg_current_snapshot"
EMPTY_HASH = "sha256:" + hashlib.sha256(b"").hexdigest()
_STAGE = sql.Identifier("_dpone_backfill_stage")
_FLUSH_BYTES = 1 << 20


@dataclass
class Sessions:
    """The autocommit sessions one batch uses; ``ledger`` is ``target`` when the ledger is there."""

    source: Conn
    target: Conn
    ledger: Conn

    @property
    def ledger_in_target(self) -> bool:
        """True when rows and receipt share one transaction."""
        return self.ledger is self.target

    def abandon(self) -> None:
        """Ends any open transaction; a session that cannot answer is closed (server rolls back)."""
        for conn in {id(c): c for c in (self.source, self.target, self.ledger)}.values():
            if conn.closed:
                continue
            status = conn.info.transaction_status
            if status is pq.TransactionStatus.IDLE:
                continue
            try:
                if conn.broken or status is pq.TransactionStatus.ACTIVE:
                    raise psycopg.OperationalError("session busy or broken")
                conn.execute("ROLLBACK", prepare=False)
            except psycopg.Error:
                conn.close()


@dataclass(frozen=True)
class BatchResult:
    """A committed batch: the run after it, its receipt, and whether it was a replay."""

    run: BackfillRun
    receipt: BatchReceipt
    replayed: bool


def _flush(buffer: bytearray, inp: psycopg.Copy, digest: Any) -> int:
    chunk = bytes(buffer)  # the writer may keep a reference; the buffer is reused
    buffer.clear()
    inp.write(chunk)
    digest.update(chunk)
    return len(chunk)


def hashed_relay(
    source: Conn,
    copy_out: sql.Composed,
    params: Sequence[str],
    target: Conn,
    copy_in: sql.Composed,
) -> tuple[int, int, int, str]:
    """Streams COPY blocks source -> target, hashing them. Returns (out, in, bytes, hash).

    Like :func:`dpone_dagster.postgres.copy.relay` (blocks are never parsed), plus bind
    parameters on the source side and a digest of the bytes: the batch's content hash.
    """
    digest = hashlib.sha256()
    moved = 0
    buffer = bytearray()
    with source.cursor() as scur, target.cursor() as tcur:
        with scur.copy(copy_out, params) as out, tcur.copy(copy_in) as inp:
            # The server sends one COPY message per row; coalescing them before writing and
            # hashing saves a Python round trip per row (memory stays bounded by _FLUSH_BYTES).
            for block in out:
                buffer += block
                if len(buffer) >= _FLUSH_BYTES:
                    moved += _flush(buffer, inp, digest)
            moved += _flush(buffer, inp, digest)
        return scur.rowcount, tcur.rowcount, moved, "sha256:" + digest.hexdigest()


def _key_match(shape: TableShape, left: str, right: str) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier(left, k), sql.Identifier(right, k))
        for k in shape.key
    )


def _row_text(shape: TableShape, alias: str) -> sql.Composed:
    # Compared as text: exact spelling (1.50 is not 1.5) and works for types without "=".
    return sql.SQL("ROW({})::text").format(
        sql.SQL(", ").join(sql.Identifier(alias, c.name) for c in shape.columns)
    )


def staged_apply(
    sessions: Sessions, shape: TableShape, copy_out: sql.Composed, params: Sequence[str]
) -> tuple[int, int, int, int, int, str]:
    """COPY into a temporary staging table, then insert new rows and count equal ones."""
    tgt = sessions.target
    cols = column_list(shape.columns)
    tgt.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            _STAGE, cols, shape.target.ident
        )
    )
    out_n, in_n, moved, content = hashed_relay(
        sessions.source,
        copy_out,
        params,
        tgt,
        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(_STAGE, cols, sql.SQL(shape.fmt)),
    )
    match = _key_match(shape, "s", "t")
    first_key = sql.Identifier("t", shape.key[0])
    row = tgt.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE {k} IS NOT NULL AND {a} = {b}),"
            " count(*) FILTER (WHERE {k} IS NOT NULL AND {a} <> {b}),"
            " min(CASE WHEN {k} IS NOT NULL AND {a} <> {b} THEN {keytext} END)"
            " FROM {stage} AS s LEFT JOIN {target} AS t ON {match}"
        ).format(
            k=first_key,
            a=_row_text(shape, "s"),
            b=_row_text(shape, "t"),
            keytext=sql.SQL("ROW({})::text").format(
                sql.SQL(", ").join(sql.Identifier("s", k) for k in shape.key)
            ),
            stage=_STAGE,
            target=shape.target.ident,
            match=match,
        )
    ).fetchone()
    assert row is not None
    equal, changed = int(row[0]), int(row[1])  # type: ignore[call-overload]
    if changed:
        raise backfill_error(
            "backfill_record_changed",
            f"{changed} row(s) of {shape.target} differ from the source (first key {row[2]}).",
        )
    inserted = tgt.execute(
        sql.SQL(
            "INSERT INTO {target} ({cols}) SELECT {cols} FROM {stage} AS s"
            " WHERE NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {match})"
        ).format(target=shape.target.ident, cols=cols, stage=_STAGE, match=match)
    ).rowcount
    tgt.execute(sql.SQL("DROP TABLE {}").format(_STAGE))
    return out_n, in_n, moved, inserted, equal, content


def _move(
    sessions: Sessions, shape: TableShape, request: BatchRequest, on_phase: PhaseHook
) -> BatchObservation:
    """Reads the batch under its own snapshot and writes it into the open target transaction."""
    src, tgt = sessions.source, sessions.target
    authority = ExtractionLifecycleAuthority()
    src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", prepare=False)
    snap = src.execute(
        "SELECT clock_timestamp(), pg_current_snapshot()::text, clock_timestamp()"
    ).fetchone()
    assert snap is not None
    authority.acquire(started_at=snap[0], clock_authority=SERVER_CLOCK)  # type: ignore[arg-type]
    authority.acquire_snapshot(
        SnapshotEvidence(
            authority=SNAPSHOT_AUTHORITY,
            token=str(snap[1]),
            acquired_at=snap[2],
            clock_authority=SERVER_CLOCK,
        )
    )
    hwm, after = request.source_high_water_mark, request.after
    upper: str | None = None
    final, count = True, 0
    first: str | None = None
    last: str | None = None
    out_n = in_n = moved = copied = equal = target_count = 0
    content, path = EMPTY_HASH, ApplyPath.NONE
    if hwm is not None:
        where, params = shape.where(after, hwm)
        row = src.execute(
            # Qualified: a bare name in ORDER BY would sort by the ::text output column.
            sql.SQL(
                "SELECT src.{c}::text FROM {t} AS src WHERE {w} ORDER BY src.{c} OFFSET %s LIMIT 1"
            ).format(c=shape.cursor.ident, t=shape.source.ident, w=where),
            [*params, request.batch_size - 1],
        ).fetchone()
        upper = hwm if row is None else str(row[0])
        final = upper == hwm
        where, params = shape.where(after, upper)
        stats = src.execute(
            sql.SQL("SELECT count(*), min({c})::text, max({c})::text FROM {t} WHERE {w}").format(
                c=shape.cursor.ident, t=shape.source.ident, w=where
            ),
            params,
        ).fetchone()
        assert stats is not None
        count = int(stats[0])  # type: ignore[call-overload]
        first = None if stats[1] is None else str(stats[1])
        last = None if stats[2] is None else str(stats[2])
        on_phase("copy")
        select, params = shape.select_range(shape.source, after, upper)
        copy_out = copy_out_statement(select, shape.fmt)
        tgt.execute("SAVEPOINT dpone_batch", prepare=False)
        try:
            out_n, in_n, moved, content = hashed_relay(
                src,
                copy_out,
                params,
                tgt,
                copy_in_statement(shape.target, shape.columns, shape.fmt),
            )
            copied, path = in_n, ApplyPath.DIRECT
        except psycopg.errors.UniqueViolation:
            tgt.execute("ROLLBACK TO SAVEPOINT dpone_batch", prepare=False)
            out_n, in_n, moved, copied, equal, content = staged_apply(
                sessions, shape, copy_out, params
            )
            path = ApplyPath.STAGED
        tgt.execute("RELEASE SAVEPOINT dpone_batch", prepare=False)
        counted = tgt.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(shape.target.ident, where), params
        ).fetchone()
        assert counted is not None
        target_count = int(counted[0])  # type: ignore[call-overload]
    done = src.execute("SELECT clock_timestamp()").fetchone()
    assert done is not None
    receipt = authority.complete(row_count=out_n, byte_count=moved, completed_at=done[0])  # type: ignore[arg-type]
    src.execute("COMMIT", prepare=False)
    return BatchObservation(
        upper=upper,
        first_cursor=first,
        last_cursor=last,
        source_count=count,
        copy_out_count=out_n,
        copy_in_count=in_n,
        target_count=target_count,
        copied_count=copied,
        duplicate_count=equal,
        content_hash=content,
        byte_count=moved,
        final=final,
        apply_path=path,
        extraction=receipt,
    )


def copy_batch(
    sessions: Sessions,
    ledger: Ledger,
    shape: TableShape,
    request: BatchRequest,
    *,
    on_phase: PhaseHook = lambda _: None,
) -> BatchResult:
    """Copies and commits one batch, or answers it by replay.

    Any failure (including a ``BaseException`` such as an interrupt) rolls back every open
    transaction before it propagates: the durable checkpoint stays where it was.

    Raises:
        BackfillError: from the rules (stale, unordered, changed...) and the staged apply.
        psycopg.Error: a session failed; nothing of the batch was committed unless the failure
            hit the COMMIT itself (the caller resolves that by replay).
    """
    lc, tgt = sessions.ledger, sessions.target
    try:
        lc.execute("BEGIN ISOLATION LEVEL READ COMMITTED", prepare=False)
        ledger.lock_run(lc, request.run_id)
        durable = ledger.fetch_run(lc, request.run_id)
        if durable is None:
            raise backfill_error("backfill_run_invalid", f"The ledger has no run {request.run_id}.")
        stored = replay(request, ledger.fetch_receipt(lc, request.run_id, request.batch_id))
        if stored is not None:
            lc.execute("COMMIT", prepare=False)
            return BatchResult(durable, stored, replayed=True)
        check_request(durable, request)
        if not sessions.ledger_in_target:
            tgt.execute("BEGIN ISOLATION LEVEL READ COMMITTED", prepare=False)
        seen = _move(sessions, shape, request, on_phase)
        run, receipt = apply_batch(durable, request, seen)
        on_phase("commit")
        if not sessions.ledger_in_target:
            tgt.execute(
                "COMMIT", prepare=False
            )  # rows first: a crash before the receipt is repaired by replay
        ledger.record_batch(lc, durable, run, receipt)
        lc.execute("COMMIT", prepare=False)
    except BaseException:
        sessions.abandon()
        raise
    on_phase("committed")
    return BatchResult(run, receipt, replayed=False)
