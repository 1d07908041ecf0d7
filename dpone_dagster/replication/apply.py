"""The apply path: a table's changes streamed into staging, then their net effect applied by key.

Inside one target transaction (a group of whole source transactions), each table's changes are
written, in commit order, into a ``TEMPORARY`` staging table through ``COPY`` (text format: the
values exactly as the source's server sent them, escaped for ``COPY`` and nothing else), a
buffer of a few megabytes at a time, so a transaction of any size passes in bounded memory.
Each staged row carries its order (``_dpone_seq``), its kind (``_dpone_op``: ``I``, ``U``,
``D``), which columns were unchanged TOASTed values (``_dpone_u``, one ``0``/``1`` per column,
NULL when none), the commit time of a delete (``_dpone_at``, for ``soft``), and for an update that
changed the key and left a TOASTed value unchanged, the old key (``_dpone_ok<i>``).

The net effect of the staged rows, applied before the commit (:meth:`TableApply.apply`):

1. an unchanged TOASTed value takes the newest value of its column before it in the batch, along
   the row's history (through a key change to the old key), else the target's row's value
   (never NULL, never a placeholder);
2. the last change of each key decides: a delete deletes (``soft``: sets the soft-delete column
   to the deleting transaction's commit time), an insert or update is upserted; all of it in
   one ``MERGE`` (:func:`~.net.merge_net`), or, where ``MERGE`` cannot run, a netting table, the
   deletes by key and the ``merge`` sink (:func:`~dpone_dagster.postgres.sinks.apply_sink`); a
   key change is the delete of the old key (staged at the update's place) and the upsert of the
   new one.

A batch of deletes alone, of at most :data:`~.held.HELD_DELETES` keys (a run that applies a
few deletes), is not staged: its keys are held as the server sent them and applied in one
statement by key (:mod:`.held`). The first insert or update stages the held keys in their
order, and the batch goes the staged way.

A ``TRUNCATE`` splits a table's batch: under ``hard`` the rows staged before it are dropped (the
truncate wipes them) and the target is truncated; under ``soft`` they are applied, then every
live row is marked. A Relation message whose columns differ splits it too: the rows staged under
the old columns are applied, then the target evolves (:mod:`.group_plan`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from psycopg import sql
from psycopg._encodings import pg2pyenc  # psycopg's PostgreSQL-to-Python codec names

from dpone_dagster.lifecycle import owned_staging_handle
from dpone_dagster.postgres.catalog import column_type
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.load import evolve_target
from dpone_dagster.postgres.lock_wait import under_lock_wait
from dpone_dagster.postgres.soft_deletes import ensure_soft_column
from dpone_dagster.postgres.staging import PostgresStagingTable
from dpone_dagster.postgres.target_plan import TablePlan

from .changes import UNCHANGED, Value
from .held import HELD_DELETES, Held, delete_held
from .net import NetHook, apply_deletes, apply_upserts, merge_net, net_table, temporary_name
from .pgoutput import COPY_SPECIAL, copy_ready
from .staging_copy import StagingCopy
from .toast import index_history, resolve_unchanged

FLUSH_BYTES: Final = 1 << 20
"""Staged text a table buffers before it is written into its staging table's open ``COPY``."""

_SPECIAL: Final = re.compile(b"[" + re.escape(COPY_SPECIAL) + b"]")
"""A byte ``COPY`` text escapes (:data:`~.pgoutput.COPY_SPECIAL`), to find in one value."""
_NULL: Final = b"\\N"


def _text(value: bytes) -> bytes:
    """``value`` escaped for ``COPY ... (FORMAT text)``."""
    if _SPECIAL.search(value) is None:
        return value
    return (
        value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n")
        .replace(b"\r", b"\\r")
    )  # fmt: skip


@dataclass
class Counts:
    """Changes of one table, by kind, as the source made them."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    truncated: int = 0


@dataclass
class TableApply:
    """One table's changes in the target transaction in progress.

    Args:
        conn: The target session, in the transaction.
        plan: The table's merge plan (its columns in the Relation's order).
        soft_column: The soft-delete column under ``soft`` deletes, else None.
        dsn: The target's DSN (a broken session's staging table is dropped from a new one).
        encoding: The source database's encoding: the staged text is in it.
        copy: The session's staging ``COPY``, shared by the tables of the target transaction
            (one of its own when omitted).
        on_net: Called with the session, the plan and the keys of each net effect (a ``FROM``
            item and its parameters), before that net effect is applied (the check's record
            of the keys a run applied, :class:`~.recorder.KeyRecorder`); ``None``: nothing is
            recorded.
    """

    conn: Connection
    plan: TablePlan
    soft_column: str | None
    dsn: str
    encoding: str
    copy: StagingCopy | None = None
    on_net: NetHook | None = None
    counts: Counts = field(default_factory=Counts)
    staged: int = 0
    _buffer: list[bytes] = field(default_factory=list)
    _size: int = 0
    _seq: int = 0
    _unchanged: set[int] = field(default_factory=set)
    _old_keys: bool = False
    _indexed: bool = False
    _held: Held | None = field(default_factory=list)
    """A deletes-only batch's keys and commit times, not staged (``None``: the batch stages)."""
    _stack: ExitStack = field(default_factory=ExitStack)
    _staging: PostgresStagingTable | None = None
    _guard: owned_staging_handle | None = None

    def __post_init__(self) -> None:
        names = self.plan.column_names
        self.key = tuple(names.index(k) for k in self.plan.target_key)
        self.width = len(names)
        self._empty_key = (_NULL,) * len(self.key)
        self._no_old_key = b"\t\\N" * len(self.key)
        self._at_time: datetime | None = None
        self._at_text = _NULL
        self._copying = self.copy or StagingCopy(self.conn)
        self._statement: sql.Composed | None = None
        self._codec = pg2pyenc(self.encoding.encode())  # the held keys' text

    # -- staging -----------------------------------------------------------------------------

    @property
    def staging(self) -> TableName:
        """The staging table (created on first use, in the transaction)."""
        if self._staging is None:
            self._staging = self._create()
        return self._staging.name

    def _create(self) -> PostgresStagingTable:
        plan = self.plan
        keys = [plan.written[i] for i in self.key]
        definition = sql.SQL(", ").join(
            [
                sql.SQL('"_dpone_seq" bigint, "_dpone_op" "char", "_dpone_u" text, '
                        '"_dpone_at" timestamptz'),
                *(sql.SQL("{} {}").format(c.ident, column_type(c)) for c in plan.written),
                *(sql.SQL("{} {}").format(sql.Identifier(f"_dpone_ok{i}"), column_type(c))
                  for i, c in enumerate(keys)),
            ]
        )  # fmt: skip
        table = PostgresStagingTable(self.conn, temporary_name(plan.target), columns=definition,
                                     dsn=self.dsn, temporary=True)  # fmt: skip
        self._guard = self._stack.enter_context(owned_staging_handle(table))
        return table

    def _row(
        self,
        op: bytes,
        values: Sequence[Value],
        at: bytes = _NULL,
        old: Sequence[Value] | None = None,
    ) -> None:
        self._seq += 1
        try:  # the hot path: every value present (a NULL or an unchanged value is no bytes)
            body = b"\t".join(values)  # type: ignore[arg-type]
        except TypeError:
            line = self._line(op, values, at, old)
        else:
            if not copy_ready(body, self.width):
                body = b"\t".join([_text(v) for v in values])  # type: ignore[arg-type]
            line = b"%d\t%b\t\\N\t%b\t%b%b\n" % (self._seq, op, at, body, self._no_old_key)
        self._append(line)

    def _append(self, line: bytes) -> None:
        """Buffers one staged row's line (written once the buffer fills)."""
        self._buffer.append(line)
        self._size += len(line)
        self.staged += 1
        if self._size >= FLUSH_BYTES:
            self._write()

    def _line(
        self, op: bytes, values: Sequence[Value], at: bytes, old: Sequence[Value] | None
    ) -> bytes:
        """A staged row's line when a value is NULL or an unchanged TOASTed value."""
        flags = _NULL
        if any(v is UNCHANGED for v in values):
            flags = b"".join(b"1" if v is UNCHANGED else b"0" for v in values)
            self._unchanged.update(i for i, v in enumerate(values) if v is UNCHANGED)
            values = [None if v is UNCHANGED else v for v in values]
        parts: list[bytes] = [_NULL if v is None else v for v in values]  # type: ignore[misc]
        if _SPECIAL.search(b"".join([v for v in values if v is not None])) is not None:  # type: ignore[misc]
            parts = [_NULL if v is None else _text(v) for v in values]  # type: ignore[arg-type]
        olds = self._empty_key
        if old is not None and flags is not _NULL:
            olds = tuple(_text(old[i]) for i in self.key)  # type: ignore[arg-type]
            self._old_keys = True
        return b"\t".join([b"%d" % self._seq, op, flags, at, *parts, *olds]) + b"\n"

    def stage_new(self, kind: int, body: bytes) -> None:
        """Stages an insert (``kind`` ``ord("I")``) or an update (``ord("U")``) that sent no
        old key, its new row already ``COPY`` text (:func:`~.pgoutput.new_tuple_text`): the
        hot path, where no value is built on its own."""
        if self._held is not None:
            self._stage_held()
        if kind == 73:
            self.counts.inserted += 1
            op = b"I"
        else:
            self.counts.updated += 1
            op = b"U"
        self._seq += 1
        self._append(b"%d\t%b\t\\N\t\\N\t%b%b\n" % (self._seq, op, body, self._no_old_key))

    def insert(self, new: Sequence[Value]) -> None:
        """Stages an inserted row."""
        self.counts.inserted += 1
        self._stage_held()
        self._row(b"I", new)

    def update(self, new: Sequence[Value], old: Sequence[Value] | None, at: datetime) -> None:
        """Stages an updated row; a changed key is staged as the delete of the old key first
        (at the commit time ``at``, for ``soft``)."""
        self.counts.updated += 1
        self._stage_held()
        if old is not None and any(old[i] != new[i] for i in self.key):
            self._row(b"D", self._key_only(old), self._at(at))
            self._row(b"U", new, old=old)
        else:
            self._row(b"U", new)

    def delete(self, old: Sequence[Value], at: datetime) -> None:
        """Stages a deleted row (its key; the commit time for ``soft``)."""
        self.counts.deleted += 1
        held = self._held
        if held is not None and len(held) < HELD_DELETES:
            held.append((old, self._at(at)))
            return
        self._stage_held()
        self._row(b"D", self._key_only(old), self._at(at))

    def _stage_held(self) -> None:
        """Stages the held deletes, in their order: the batch goes the staged way."""
        held, self._held = self._held, None
        for old, at in held or ():
            self._row(b"D", self._key_only(old), at)

    def _at(self, at: datetime) -> bytes:
        """``at`` as staged text (kept for the transaction's next changes)."""
        if at is not self._at_time:
            self._at_time, self._at_text = at, at.isoformat().encode()
        return self._at_text

    def _key_only(self, old: Sequence[Value]) -> list[Value]:
        values: list[Value] = [None] * self.width
        for i in self.key:
            values[i] = old[i]
        return values

    def flush(self) -> None:
        """Writes the buffered rows into the staging table and ends its ``COPY``: the staging
        table holds every row staged so far."""
        self._write()
        self._copying.end()

    def _write(self) -> None:
        """Writes the buffered rows into the staging table's ``COPY``, left open for the next
        rows (the hot path)."""
        if not self._buffer:
            return
        if self._statement is None:
            self._copying.end()  # the staging table is created on the session
            names = [
                sql.Identifier(n) for n in ("_dpone_seq", "_dpone_op", "_dpone_u", "_dpone_at")
            ] + [sql.Identifier(n) for n in self.plan.column_names]
            names += [sql.Identifier(f"_dpone_ok{i}") for i in range(len(self.key))]
            self._statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT text, ENCODING {})").format(
                self.staging.ident, sql.SQL(", ").join(names), sql.Literal(self.encoding)
            )
        self._copying.write(self.staging, self._statement, b"".join(self._buffer))
        self._buffer.clear()
        self._size = 0

    # -- the net effect ----------------------------------------------------------------------

    def apply(self) -> None:
        """Applies the net effect of the staged rows (or of the held deletes); the staging
        table is emptied."""
        held, self._held = self._held, []
        if held:
            delete_held(self.conn, self.plan, self.key, held, codec=self._codec,
                        soft_column=self.soft_column, on_net=self.on_net)  # fmt: skip
            return
        if self._staging is None and not self._buffer:
            return
        self.flush()
        if self.soft_column is not None:
            ensure_soft_column(self.conn, self.plan.target, self.soft_column)
        if self._unchanged:
            if not self._indexed:  # one index per staging table (its later rows are indexed too)
                index_history(self.conn, self.staging, self.plan.target_key)
                self._indexed = True
            resolve_unchanged(self.conn, self.plan, self.staging, sorted(self._unchanged),
                              old_keys=self._old_keys)  # fmt: skip
        if self.on_net is not None:  # the check's hook: every key the staged rows name
            self.on_net(self.conn, self.plan, self.staging.ident, ())
        if not merge_net(self.conn, self.plan, self.staging, self.soft_column):
            net, rows = net_table(self.conn, self.plan, self.staging)
            rows -= apply_deletes(self.conn, self.plan, net, self.soft_column)
            apply_upserts(self.conn, self.plan, net, rows, self.soft_column)
        self.conn.execute(sql.SQL("TRUNCATE {}").format(self.staging.ident))
        self._unchanged.clear()
        self._old_keys = False

    def truncate(self, at: datetime) -> None:
        """A ``TRUNCATE`` of the table at this point of the batch."""
        self.counts.truncated += 1
        target = self.plan.target
        if self.soft_column is None:
            self._held = []
            self._buffer.clear()
            self._size = 0
            self._unchanged.clear()
            self._copying.end()
            if self._staging is not None:
                self.conn.execute(sql.SQL("TRUNCATE {}").format(self.staging.ident))
            statement = sql.SQL("TRUNCATE {}").format(target.ident)
            under_lock_wait(self.conn, [target], lambda: self.conn.execute(statement),
                            doing="truncate it as the source did")  # fmt: skip
            return
        self.apply()
        soft = sql.Identifier(self.soft_column)
        self.conn.execute(
            sql.SQL("UPDATE {} SET {} = %s WHERE {} IS NULL").format(target.ident, soft, soft),
            (at,),
        )

    def close(self) -> None:
        """Drops the staging table (the transaction's end; on a failure, the guard's drop)."""
        if self._staging is not None and not self.conn.closed and not self.conn.broken:
            self._copying.end()
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.staging.ident))
            if self._guard is not None:
                self._guard.transfer(None)  # dropped in the transaction, with its rows
        self._stack.close()
        self._staging = None
        self._statement = None

    def abandon(self) -> None:
        """On a failure: the staging guard drops the staging table (from a new session if
        this one broke)."""
        self._copying.abandon()
        self._stack.__exit__(RuntimeError, RuntimeError("abandoned"), None)
        self._staging = None
        self._statement = None


def evolve(conn: Connection, plan: TablePlan) -> None:
    """Applies the plan's schema changes to the existing target, in the data's transaction."""
    evolve_target(conn, plan.target, plan.schema_changes)
