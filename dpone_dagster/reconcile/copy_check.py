"""Reconciling a snapshot copy: each table's source, inside the copy's snapshot, against its target.

The copy ran under a snapshot the caller exported and still holds (``CopyOptions(snapshot_token=
...)``). The reconciliation imports that same snapshot, so it reads the source exactly as the copy
did, however much the source has changed since; it reads the target under one ``REPEATABLE READ``
snapshot. The two sides run concurrently, in two sessions and two threads.

Each table is established by one of the two provers:

- **row versions** (:mod:`.row_versions`), for a ``replace`` whose load vouched that it wrote every
  target row exactly (binary COPY or ``INSERT ... SELECT``, evidence in the report): the source
  snapshot holds as many rows as the copy read and wrote, and every target row still carries the
  load's transaction id, in the same table. No value is read.
- **content hash** (:mod:`.digest`) for everything else: both sides' count and exact digest.

What the check proves depends on the sink, and every result names its :class:`Guarantee`:

- ``replace`` -> ``equal``: the target holds exactly the snapshot's rows.
- ``merge`` (and ``append`` into a target with a primary key) -> ``contains``: every row of the
  snapshot is in the target with equal values. The source's key values are copied into a
  temporary table of the target session, and the target is digested restricted to those keys:
  an equal digest means each source key has its row, equal in every copied column.
- ``append`` into a target without a primary key -> ``counts``: nothing identifies the appended
  rows among the others, so the sink must have inserted exactly the snapshot's row count and the
  target must hold at least that many.

With a :class:`~dpone_dagster.snapshot_copy.CopyReport`, each table's extraction receipt must also
count the rows the snapshot holds: a copy that read another snapshot fails the check even if the
target happens to match. A copy whose COMMIT acknowledgement was lost can be reconciled too:
``equal`` says the commit happened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import DponeError, redact, token_digest
from dpone_dagster.postgres import ConnectionOptions, Sink, SnapshotSession, TableName, TablePlan
from dpone_dagster.postgres.catalog import column_list, normal_type, table_catalog
from dpone_dagster.postgres.connection import Connection, connect, set_transaction_mode
from dpone_dagster.postgres.copy import copy_in_statement, copy_out_statement, relay, select_columns
from dpone_dagster.postgres.failures import FailureSide, database_error
from dpone_dagster.postgres.snapshot import check_snapshot_token
from dpone_dagster.postgres.target_catalog import target_catalog
from dpone_dagster.snapshot_copy import CopyReport

from .copy_verdict import CopiedTable, Guarantee, TableReconciliation, judge
from .digest import (
    EMPTY,
    Digest,
    digest_query,
    pin_settings,
    require_row_hash,
    row_hash,
    run_digest,
)
from .row_versions import Horizon, horizon, proven, source_proof, target_proof, usable

_T = TypeVar("_T")
_WHOLE: tuple[sql.Composable, list[object]] = (sql.SQL("true"), [])


class ReconcileError(DponeError):
    """A reconciliation could not run (it did not find a difference: that is a result)."""


def reconcile_copy(
    source_dsn: str,
    target_dsn: str,
    copied: CopyReport | Sequence[TablePlan],
    snapshot_token: str,
    *,
    sink: Sink = Sink.REPLACE,
    source_options: ConnectionOptions | None = None,
    target_options: ConnectionOptions | None = None,
    row_versions: bool = True,
    snapshot_taken_at: datetime | None = None,
) -> list[TableReconciliation]:
    """Compares each copied table's source inside ``snapshot_token`` with its target.

    Args:
        source_dsn: The source database.
        target_dsn: The target database.
        copied: The copy's report (its sink, columns, receipts and row-version evidence are
            used) or its plans (``SnapshotCopy.plans``).
        snapshot_token: The exported snapshot the copy read (``CopyOptions.snapshot_token``);
            its exporting transaction must still be open.
        sink: The sink, when ``copied`` is plans (a report names its own).
        source_options: Options of the source sessions.
        target_options: Options of the target session.
        row_versions: Prove tables by row versions where the load vouched for them (else hash
            every table).
        snapshot_taken_at: When the exporting session took the snapshot (its
            :class:`~dpone_dagster.postgres.SnapshotSession` evidence's ``acquired_at``): each
            result's ``proved_at``. Not given: the earliest ``snapshot_acquired_at`` of the
            report's receipts (``None`` for plans).

    Returns:
        One result per table, in the copy's order.

    Raises:
        SnapshotError: ``snapshot_token_invalid``; ``snapshot_import_failed`` when the
            exporting transaction has ended.
        ReconcileError: ``reconcile_snapshot_mismatch`` when the report was read under another
            snapshot; ``reconcile_source_failed`` / ``reconcile_target_failed`` when a server
            failed (a missing table or column, a lost connection).
        SessionError: ``source_unreachable``, ``target_login_failed`` and the like.
    """
    check_snapshot_token(snapshot_token)
    tables, sink = _tables(copied, sink, snapshot_token)

    def open_source() -> SnapshotSession:
        session = SnapshotSession.import_snapshot(source_dsn, snapshot_token, source_options)
        pin_settings(session.conn, local=True)
        return session

    with contextlib.ExitStack() as stack:
        source = _guarded("source", open_source)
        stack.callback(source.close)  # read only: nothing to keep
        target = _guarded("target", lambda: _open_target(target_dsn, target_options, sink))
        stack.callback(target.close)  # ends its transaction; temporary tables go with it
        tables = _guarded("target", lambda: _resolve_all(source.conn, target, tables, sink))
        with ThreadPoolExecutor(2, thread_name_prefix="dpone-reconcile") as pool:
            proved = _prove(pool, source.conn, target, tables) if row_versions else {}
            hashed = [t for i, t in enumerate(tables) if i not in proved]
            digests = iter(_digest(pool, source.conn, target, hashed, open_source))
    at = snapshot_taken_at or _acquired_at(copied)
    return [
        replace(
            judge(t, sink, proved[i]) if i in proved else judge(t, sink, *next(digests)),
            proved_at=at,
        )
        for i, t in enumerate(tables)
    ]


def _acquired_at(copied: CopyReport | Sequence[TablePlan]) -> datetime | None:
    """The earliest snapshot time a copy's receipts record (``None`` for plans)."""
    if not isinstance(copied, CopyReport):
        return None
    times = [
        t.extraction_receipt.snapshot_acquired_at
        for t in copied.tables
        if t.extraction_receipt is not None and t.extraction_receipt.snapshot_acquired_at
    ]
    return min(times, default=None)


def _tables(
    copied: CopyReport | Sequence[TablePlan], sink: Sink, token: str
) -> tuple[list[CopiedTable], Sink]:
    if not isinstance(copied, CopyReport):
        return [CopiedTable(p.source, p.target, p.column_names) for p in copied], sink
    if copied.source_token is not None and copied.source_token != token_digest(token):
        raise ReconcileError(
            "reconcile_snapshot_mismatch",
            "The copy was read under another snapshot than the one given: reconciling would "
            "compare the target with a different state of the source.",
            ["Pass the token the copy ran under (CopyOptions.snapshot_token)."],
        )
    return [
        CopiedTable(
            t.source,
            t.target,
            t.columns,
            rows_extracted=t.rows_extracted,
            rows_inserted=None if t.sink_result is None else t.sink_result.rows_inserted,
            rows_loaded=t.rows_loaded,
            evidence=t.row_versions,
        )
        for t in copied.tables
    ], copied.sink


def _open_target(dsn: str, options: ConnectionOptions | None, sink: Sink) -> Connection:
    conn = connect(dsn, options, side="target")
    # Read write only for the temporary key tables of a "contains" check; nothing else is written.
    isolation = psycopg.IsolationLevel.REPEATABLE_READ
    set_transaction_mode(conn, isolation, read_only=sink == "replace")
    pin_settings(conn, local=True)  # the first statement: the transaction and its snapshot begin
    return conn


def _resolve_all(
    source: Connection, target: Connection, tables: list[CopiedTable], sink: Sink
) -> list[CopiedTable]:
    require_row_hash(source, target)
    return [_resolve(source, target, t, sink) for t in tables]


def _resolve(source: Connection, target: Connection, table: CopiedTable, sink: Sink) -> CopiedTable:
    """Fills in the columns (from the source catalog), the casts, the key and the guarantee."""
    every = [c for c in table_catalog(source, table.source).columns if not c.generated]
    names = table.names or tuple(c.name for c in every)
    by_name = {c.name: c for c in every}
    columns = tuple(by_name[n] for n in names if n in by_name)
    found = target_catalog(target, table.target, swap=False)
    key: tuple[str, ...] = ()
    casts: tuple[tuple[str, str], ...] = ()
    if found is not None:
        key = found.table.key
        # A type spelled differently (a domain over it, ``int8`` for ``bigint``) is no cast.
        theirs = {c.name: normal_type(c) for c in found.table.columns}
        casts = tuple(
            (c.name, c.type_sql)
            for c in columns
            if theirs.get(c.name, normal_type(c)) != normal_type(c)
        )
    guarantee = Guarantee.EQUAL
    if sink != "replace":
        keyed = bool(key) and set(key) <= set(names)
        guarantee = Guarantee.CONTAINS if keyed else Guarantee.COUNTS
    return replace(
        table, names=names, columns=columns, casts=casts, key=key, guarantee=guarantee,
        target_exists=found is not None,
    )  # fmt: skip


def _provable(table: CopiedTable) -> bool:
    return (
        table.guarantee is Guarantee.EQUAL
        and table.target_exists
        and table.evidence is not None
        and table.rows_loaded is not None
        and table.rows_extracted == table.rows_loaded
        and not table.casts
    )


def _prove(
    pool: ThreadPoolExecutor, source: Connection, target: Connection, tables: Sequence[CopiedTable]
) -> dict[int, int]:
    """The tables row versions prove equal (index -> rows), each side read once, concurrently."""
    tried = [(i, t) for i, t in enumerate(tables) if _provable(t)]
    if not tried:
        return {}
    counts = pool.submit(_guarded, "source", lambda: [_count(source, t.source) for _, t in tried])
    checks = pool.submit(
        _guarded, "target", lambda: [_target_versions(target, t) for _, t in tried]
    )
    sessions = (source, target)
    found = zip(tried, _wait(counts, sessions), _wait(checks, sessions), strict=True)
    return {i: rows for (i, t), rows, ok in found if ok and rows == t.rows_loaded}


def _count(conn: Connection, table: TableName) -> int:
    query, params = source_proof(table, _WHOLE, [])
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(str(row[0]))


def _target_versions(conn: Connection, table: CopiedTable) -> bool:
    evidence, expected = table.evidence, table.rows_loaded
    assert evidence is not None
    assert expected is not None
    if not usable(evidence, Horizon(0, None), horizon(conn, table.target, table.columns)):
        return False
    query, params = target_proof(table.target, _WHOLE, [evidence])
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return proven(tuple(row), expected)


def _digest(
    pool: ThreadPoolExecutor,
    source: Connection,
    target: Connection,
    tables: Sequence[CopiedTable],
    open_source: Callable[[], SnapshotSession],
) -> list[tuple[Digest, Digest]]:
    """Both sides' digests of every table, concurrently."""
    if not tables:
        return []
    rows = [
        (row_hash(source, t.columns), row_hash(source, t.columns, casts=dict(t.casts)))
        for t in tables
    ]
    sources = pool.submit(
        _guarded,
        "source",
        lambda: [
            run_digest(source, *digest_query(t.source, r[0]))
            for t, r in zip(tables, rows, strict=True)
        ],
    )
    targets = pool.submit(
        _guarded, "target", lambda: _target_side(target, tables, [r[1] for r in rows], open_source)
    )
    sessions = (source, target)
    return list(zip(_wait(sources, sessions), _wait(targets, sessions), strict=True))


def _target_side(
    conn: Connection,
    tables: Sequence[CopiedTable],
    rows: Sequence[sql.Composed],
    open_source: Callable[[], SnapshotSession],
) -> list[Digest]:
    found: list[Digest] = []
    keys: SnapshotSession | None = None  # a second session in the snapshot, for key relays
    try:
        for index, (table, row) in enumerate(zip(tables, rows, strict=True)):
            where = None
            if not table.target_exists:
                found.append(EMPTY)
                continue
            if table.guarantee is Guarantee.CONTAINS:
                keys = keys or open_source()
                where = _copy_keys(keys.conn, conn, table, index)
            found.append(run_digest(conn, *digest_query(table.target, row, where)))
    finally:
        if keys is not None:
            keys.close()
    return found


def _copy_keys(
    source: Connection, target: Connection, table: CopiedTable, index: int
) -> sql.Composed:
    """Copies the snapshot's key values into a temporary table of the target session and
    returns the filter ``(key) IN (SELECT key FROM that table)``."""
    temp = TableName("pg_temp", f"dpone_reconcile_keys_{index}")
    keys = column_list(table.key)
    target.execute(
        sql.SQL("CREATE TEMPORARY TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            sql.Identifier(temp.name), keys, table.target.ident
        )
    )
    # Text format: exact for every key type, even when the two sides' types differ in OID;
    # both sessions print and parse values under the same pinned settings.
    relay(
        source,
        copy_out_statement(select_columns(table.source, table.key), "text"),
        target,
        copy_in_statement(temp, table.key, "text"),
    )
    target.execute(sql.SQL("ANALYZE {}").format(temp.ident))
    return sql.SQL("({}) IN (SELECT {} FROM {})").format(keys, keys, temp.ident)


def _guarded(side: FailureSide, step: Callable[[], _T]) -> _T:
    """Runs a step of one side; a server error becomes its code of the database-failure catalog
    (``<side>_permission_denied``...), else ``reconcile_<side>_failed``."""
    try:
        return step()
    except psycopg.Error as exc:
        outage = ReconcileError(
            f"reconcile_{side}_failed",
            f"Reconciling failed on the {side}: {redact(str(exc)).strip()}",
            [f"Check the {side} server and the tables named, then reconcile again."],
        )
        raise database_error(exc, side, outage=outage) from None


def _wait(future: Future[list[_T]], sessions: Sequence[Connection]) -> list[_T]:
    """The side's result. A failure or an interruption (Ctrl-C, Dagster) cancels the queries
    still running on either side, so the other thread ends soon too."""
    try:
        return future.result()
    except BaseException:
        for conn in sessions:
            with contextlib.suppress(Exception):
                conn.cancel_safe()
        raise
