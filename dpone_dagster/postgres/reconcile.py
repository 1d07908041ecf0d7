"""Reconciling a snapshot copy: each table's source, inside the copy's snapshot, against its target.

The copy ran under a snapshot the caller exported and still holds (``CopyOptions(snapshot_token=
...)``). Reconciliation imports that same snapshot, so it reads the source exactly as the copy
did, however much the source has changed since; it reads the target under one ``REPEATABLE
READ`` snapshot. Both sides are fingerprinted (:func:`.fingerprint.table_fingerprint`: a count
and an order-independent digest over the copied columns, computed by the server) concurrently,
in two threads.

What the check proves depends on the sink, and every result names its :class:`Guarantee`:

- ``replace`` -> ``equal``: the target holds exactly the snapshot's rows (equal count and digest).
- ``merge`` (and ``append`` into a target with a primary key) -> ``contains``: every row of the
  snapshot is in the target with equal values. The target may hold other rows, so the source's
  key values (only the key columns) are copied into a temporary table of the target session, and
  the target is fingerprinted restricted to those keys: equal count and digest mean each source
  key has its row, equal in every copied column.
- ``append`` into a target without a primary key -> ``counts``: nothing identifies the appended
  rows among the others, so the check verifies counts only: the sink inserted exactly the
  snapshot's row count (its command tag, from the report) and the target holds at least that many.

With a :class:`.report.CopyReport`, each table's extraction receipt must also count the rows the
snapshot holds: a copy that read another snapshot fails the check even if the target happens to
match. A copy whose COMMIT acknowledgement was lost (``retain_commit_unknown``) can be reconciled
too: ``equal`` says the commit happened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import DponeError, redact, token_digest

from .catalog import column_list, primary_key, relation_oid, table_columns
from .connection import ConnectionOptions, connect
from .copy import copy_in_statement, copy_out_statement, relay, select_columns
from .fingerprint import Fingerprint, digest_of, fix_settings, table_fingerprint
from .identifiers import TableName
from .plan import Sink, TablePlan
from .report import CopyReport
from .snapshot import SnapshotSession, check_snapshot_token

Conn = psycopg.Connection[tuple[object, ...]]
_T = TypeVar("_T")
_EMPTY = Fingerprint(rows=0, digest=digest_of(0))
_BEGIN_READ_ONLY = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
_BEGIN_READ_WRITE = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE")


class Guarantee(StrEnum):
    """What a table's reconciliation checked (decided by the sink and the target's key)."""

    EQUAL = "equal"
    """The target holds exactly the snapshot's rows (``replace``)."""
    CONTAINS = "contains"
    """Every snapshot row is in the target, equal, by primary key (``merge``, keyed ``append``)."""
    COUNTS = "counts"
    """Row counts only (``append`` into a target without a primary key)."""


class ReconcileError(DponeError):
    """A reconciliation could not run (it did not find a difference: that is a result)."""


@dataclass(frozen=True)
class TableReconciliation:
    """One table's reconciliation.

    Attributes:
        source_table: The source table.
        target_table: The target table.
        sink: The copy's sink.
        guarantee: What was checked (see :class:`Guarantee`).
        source: The source's fingerprint inside the copy's snapshot.
        target: The target's fingerprint: the whole table (``equal``, ``counts``) or its rows
            whose key is among the snapshot's (``contains``).
        passed: The guarantee holds.
        detail: One sentence on what was found.
    """

    source_table: TableName
    target_table: TableName
    sink: Sink
    guarantee: Guarantee
    source: Fingerprint
    target: Fingerprint
    passed: bool
    detail: str


@dataclass(frozen=True)
class _Table:
    """A table to reconcile, with what the report (if any) says about it."""

    source: TableName
    target: TableName
    columns: tuple[str, ...]
    rows_extracted: int | None = None
    rows_inserted: int | None = None
    key: tuple[str, ...] = ()
    guarantee: Guarantee = Guarantee.EQUAL
    target_exists: bool = True


def reconcile_copy(
    source_dsn: str,
    target_dsn: str,
    copied: CopyReport | Sequence[TablePlan],
    snapshot_token: str,
    *,
    sink: Sink = "replace",
    source_options: ConnectionOptions | None = None,
    target_options: ConnectionOptions | None = None,
) -> list[TableReconciliation]:
    """Fingerprints each copied table's source inside ``snapshot_token`` and its target.

    Args:
        source_dsn: The source database.
        target_dsn: The target database.
        copied: The copy's report (its sink, columns and receipts are used) or its plans
            (``SnapshotCopy.plans``).
        snapshot_token: The exported snapshot the copy read (``CopyOptions.snapshot_token``);
            its exporting transaction must still be open.
        sink: The sink, when ``copied`` is plans (a report names its own). ``replace`` is the
            strictest check.
        source_options: Options of the source sessions.
        target_options: Options of the target session.

    Returns:
        One result per table, in the copy's order.

    Raises:
        SnapshotError: ``snapshot_token_invalid``; ``snapshot_import_failed`` when the
            exporting transaction has ended.
        ReconcileError: ``reconcile_snapshot_mismatch`` when the report was read under another
            snapshot; ``reconcile_source_failed`` / ``reconcile_target_failed`` when a server
            failed.
        FingerprintError: ``fingerprint_failed`` (e.g. a copied column is missing).
    """
    check_snapshot_token(snapshot_token)
    tables, sink = _tables(copied, sink, snapshot_token)

    def open_source() -> SnapshotSession:
        return SnapshotSession.import_snapshot(source_dsn, snapshot_token, source_options)

    with contextlib.ExitStack() as stack:
        source = _guarded("source", open_source)
        stack.callback(source.close)  # read only: nothing to keep
        target = _guarded("target", lambda: _begin_target(target_dsn, target_options, sink))
        stack.callback(target.close)  # ends its transaction; temporary tables go with it
        tables = _guarded(
            "target", lambda: [_resolve(source.conn, target, t, sink) for t in tables]
        )
        sessions = (source.conn, target)
        with ThreadPoolExecutor(2, thread_name_prefix="dpone-reconcile") as pool:
            sources = pool.submit(_guarded, "source", lambda: _source_side(source.conn, tables))
            targets = pool.submit(
                _guarded, "target", lambda: _target_side(target, tables, open_source)
            )
            found = _wait(sources, sessions), _wait(targets, sessions)
    return [_judge(t, sink, s, g) for t, s, g in zip(tables, *found, strict=True)]


def _tables(
    copied: CopyReport | Sequence[TablePlan], sink: Sink, token: str
) -> tuple[list[_Table], Sink]:
    if not isinstance(copied, CopyReport):
        return [_Table(p.source, p.target, p.column_names) for p in copied], sink
    if copied.source_token is not None and copied.source_token != token_digest(token):
        raise ReconcileError(
            "reconcile_snapshot_mismatch",
            "The copy was read under another snapshot than the one given: reconciling would "
            "compare the target with a different state of the source.",
            ["Pass the token the copy ran under (CopyOptions.snapshot_token)."],
        )
    return [
        _Table(
            t.source,
            t.target,
            t.columns,
            rows_extracted=t.rows_extracted,
            rows_inserted=None if t.sink_result is None else t.sink_result.rows_inserted,
        )
        for t in copied.tables
    ], copied.sink


def _begin_target(dsn: str, options: ConnectionOptions | None, sink: Sink) -> Conn:
    conn = connect(dsn, options, autocommit=True)
    # Read write only for the temporary key tables of a "contains" check; nothing else is written.
    conn.execute(_BEGIN_READ_ONLY if sink == "replace" else _BEGIN_READ_WRITE)
    return conn


def _resolve(source: Conn, target: Conn, table: _Table, sink: Sink) -> _Table:
    """Fills in the columns (from the source catalog if not given), key and guarantee."""
    columns = table.columns or tuple(
        c.name for c in table_columns(source, table.source) if not c.generated
    )
    exists = relation_oid(target, table.target) is not None
    key = tuple(primary_key(target, table.target)) if exists else ()
    guarantee = Guarantee.EQUAL
    if sink != "replace":
        keyed = bool(key) and set(key) <= set(columns)
        guarantee = Guarantee.CONTAINS if keyed else Guarantee.COUNTS
    return _Table(
        table.source, table.target, columns, table.rows_extracted, table.rows_inserted,
        key, guarantee, exists,
    )  # fmt: skip


def _source_side(conn: Conn, tables: Sequence[_Table]) -> list[Fingerprint]:
    return [table_fingerprint(conn, t.source, t.columns) for t in tables]


def _target_side(
    conn: Conn, tables: Sequence[_Table], open_source: Callable[[], SnapshotSession]
) -> list[Fingerprint]:
    found: list[Fingerprint] = []
    keys: SnapshotSession | None = None  # a second session in the snapshot, for key relays
    try:
        for index, table in enumerate(tables):
            if not table.target_exists:
                found.append(_EMPTY)
            elif table.guarantee is Guarantee.CONTAINS:
                keys = keys or open_source()
                where = _copy_keys(keys.conn, conn, table, index)
                found.append(table_fingerprint(conn, table.target, table.columns, where=where))
            else:
                found.append(table_fingerprint(conn, table.target, table.columns))
    finally:
        if keys is not None:
            keys.close()
    return found


def _copy_keys(source: Conn, target: Conn, table: _Table, index: int) -> sql.Composed:
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
    # both sessions print and parse values (dates, times) under the same settings.
    fix_settings(source)
    fix_settings(target)
    relay(
        source.cursor(),
        copy_out_statement(select_columns(table.source, table.key), "text"),
        target.cursor(),
        copy_in_statement(temp, table.key, "text"),
    )
    target.execute(sql.SQL("ANALYZE {}").format(temp.ident))
    return sql.SQL("({}) IN (SELECT {} FROM {})").format(keys, keys, temp.ident)


def _judge(
    table: _Table, sink: Sink, source: Fingerprint, target: Fingerprint
) -> TableReconciliation:
    n, guarantee = source.rows, table.guarantee
    if not table.target_exists:
        passed, detail = False, f"The target table {table.target} does not exist."
    elif guarantee is Guarantee.EQUAL:
        passed = source == target
        detail = (
            f"The target holds exactly the snapshot's {n} rows (equal count and digest)."
            if passed
            else f"The target differs from the snapshot: {n} source rows, {target.rows} target "
            f"rows, digests {'equal' if source.digest == target.digest else 'differ'}."
        )
    elif guarantee is Guarantee.CONTAINS:
        passed, key, missing = source == target, ", ".join(table.key), n - target.rows
        if passed:
            detail = f"Every one of the snapshot's {n} rows is in the target with equal values"
        elif missing > 0:
            detail = f"{missing} of the snapshot's {n} keys have no row in the target"
        else:
            detail = "Target rows with the snapshot's keys differ in value from the snapshot's"
        detail += f" (by primary key {key})."
    else:
        inserted = table.rows_inserted
        passed = target.rows >= n and inserted in (None, n)
        detail = (
            f"Counts only (the target has no primary key to compare values by): the target "
            f"holds {target.rows} rows, the snapshot {n}"
            + ("" if inserted is None else f", and the sink inserted {inserted}")
            + "."
        )
    if table.rows_extracted not in (None, n):
        passed = False
        detail += (
            f" The copy's extraction receipt counts {table.rows_extracted} rows where the "
            f"snapshot holds {n}: the copy did not read this snapshot."
        )
    return TableReconciliation(
        table.source, table.target, sink, guarantee, source, target, passed, detail
    )


def _guarded(side: str, step: Callable[[], _T]) -> _T:
    """Runs a step of one side; a server error becomes ``reconcile_<side>_failed``."""
    try:
        return step()
    except psycopg.Error as exc:
        raise ReconcileError(
            f"reconcile_{side}_failed",
            f"Reconciling failed on the {side}: {redact(str(exc)).strip()}",
            [f"Check the {side} server and the tables named, then reconcile again."],
        ) from None


def _wait(future: Future[_T], sessions: Sequence[Conn]) -> _T:
    """The side's result. A failure or an interruption (Ctrl-C, Dagster) cancels the queries
    still running on either side, so the other thread ends soon too."""
    try:
        return future.result()
    except BaseException:
        for conn in sessions:
            with contextlib.suppress(Exception):
                conn.cancel_safe()
        raise
