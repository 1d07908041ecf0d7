"""Moving rows with the COPY protocol: statements, and the one relay between two sessions.

Rows are never parsed on the way: the blocks a source's ``COPY ... TO STDOUT`` sends are written
to the target's ``COPY ... FROM STDIN`` as they are. Binary format is used wherever both ends
agree on every type's OID, which holds for built-in types; a user-defined type (enum, domain,
composite) has a per-database OID, so a relay whose columns include one uses text format instead
(see :func:`copy_format_for`).

The client's cost per row is what limits a relay once both servers are busy (the server sends
one COPY message per row), so the relay keeps it small:

* rows are gathered into writes of :data:`RELAY_WRITE` bytes: one libpq call (and one hash
  update, when hashing) per 64 KiB instead of per row;
* rows already received are taken straight from libpq (:meth:`psycopg.pq.PGconn.get_copy_data`
  in non-blocking mode) and psycopg's :meth:`psycopg.Copy.read` is used only when the relay has
  to wait for the network. The end of the stream is handled as psycopg handles it: the final
  result is read and checked, and its command tag gives the row count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import errors, pq, sql
from psycopg.abc import Buffer

from .catalog import Column, column_list
from .connection import Connection
from .identifiers import TableName

CopyFormat = Literal["binary", "text"]

RELAY_WRITE = 64 << 10
"""Bytes gathered from source blocks before one write to the target."""

EMPTY_HASH = "sha256:" + hashlib.sha256(b"").hexdigest()
"""The content hash of a relay that moved no bytes."""


BINARY_ACROSS_VERSIONS = frozenset(
    {"int2", "int4", "int8", "numeric", "float8", "text", "varchar", "bytea", "bool", "date",
     "timestamp", "timestamptz", "interval", "uuid", "json", "jsonb"}
)  # fmt: skip
"""Built-in types (and arrays of them) whose binary COPY form is certified between major
versions: ``tests/postgres/test_type_round_trip.py`` round-trips each of them exactly from
PostgreSQL 15 to 18 and back (``.ci/run``, ``-m cross_server``). Any other type crosses major
versions as text."""


def copy_format_choice(
    columns: Sequence[Column], versions: tuple[int, int] | None = None
) -> tuple[CopyFormat, str | None]:
    """The COPY format for a relay of ``columns``, and why it is ``text`` when it is.

    Args:
        columns: The relayed columns (source and target columns alike).
        versions: The source's and the target's major versions, when both are PostgreSQL.

    Returns:
        ``("binary", None)`` when both ends agree on every type's binary form; else ``"text"``
        with the reason: a user-defined type (its OID differs between databases), or a type
        whose binary form is not certified between the two major versions.
    """
    users = sorted({f"{c.type_schema}.{c.type_name}" for c in columns if c.user_type})
    if users:
        return "text", f"user-defined type(s) {', '.join(users)} have per-database OIDs"
    if versions is not None and versions[0] != versions[1]:
        uncertified = sorted({c.type_name for c in columns} - BINARY_ACROSS_VERSIONS)
        if uncertified:
            return "text", (
                f"binary COPY of {', '.join(uncertified)} is not certified from PostgreSQL "
                f"{versions[0]} to {versions[1]}"
            )
    return "binary", None


def copy_format_for(
    columns: Sequence[Column], versions: tuple[int, int] | None = None
) -> CopyFormat:
    """``binary`` unless a column's binary form can differ between source and target (see
    :func:`copy_format_choice`)."""
    return copy_format_choice(columns, versions)[0]


def major_versions(source: Connection, target: Connection) -> tuple[int, int]:
    """The major versions of the servers of two sessions (``18`` for 18.1)."""
    return source.info.server_version // 10000, target.info.server_version // 10000


def copy_out_statement(select: sql.Composable, fmt: CopyFormat = "binary") -> sql.Composed:
    """``COPY (<select>) TO STDOUT (FORMAT ...)``."""
    return sql.SQL("COPY ({}) TO STDOUT (FORMAT {})").format(select, sql.SQL(fmt))


def copy_in_statement(
    table: TableName,
    columns: Sequence[Column] | Sequence[str],
    fmt: CopyFormat = "binary",
    *,
    freeze: bool = False,
) -> sql.Composed:
    """``COPY table (cols) FROM STDIN (FORMAT ...[, FREEZE])``.

    ``freeze`` writes the rows already frozen and the pages all-visible, so that nobody's first
    read of them (the load's check, the users' queries) has to set their hint bits and dirty
    every page again. PostgreSQL allows it only into a plain table created (or truncated) in
    the session's current subtransaction, with no cursor open and, as under ``READ COMMITTED``,
    no snapshot held from an earlier statement. Frozen rows keep their writer's ``xmin``, which
    the row-version proof reads (:mod:`.evidence`).
    """
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {}{})").format(
        table.ident,
        column_list(columns),
        sql.SQL(fmt),
        sql.SQL(", FREEZE") if freeze else sql.SQL(""),
    )


def select_columns(
    table: TableName,
    columns: Sequence[Column] | Sequence[str],
    *,
    where: sql.Composable | None = None,
    order_by: sql.Composable | None = None,
    limit: sql.Composable | None = None,
) -> sql.Composed:
    """``SELECT cols FROM table [WHERE ...] [ORDER BY ...] [LIMIT ...]``."""
    parts: list[sql.Composable] = [
        sql.SQL("SELECT {} FROM {}").format(column_list(columns), table.ident)
    ]
    if where is not None:
        parts.append(sql.SQL(" WHERE {}").format(where))
    if order_by is not None:
        parts.append(sql.SQL(" ORDER BY {}").format(order_by))
    if limit is not None:
        parts.append(sql.SQL(" LIMIT {}").format(limit))
    return sql.Composed(parts)


@dataclass(frozen=True)
class RelayResult:
    """What one relay moved, by the servers' own command tags.

    Attributes:
        rows_out: Rows the source's ``COPY ... TO STDOUT`` reported.
        rows_in: Rows the target's ``COPY ... FROM STDIN`` reported.
        bytes: Bytes relayed.
        content_hash: ``sha256:`` of the bytes relayed, when the relay was asked to hash them.
    """

    rows_out: int
    rows_in: int
    bytes: int
    content_hash: str | None = None


class _Pump:
    """Moves the messages of a started ``COPY ... TO STDOUT`` into a ``COPY ... FROM STDIN``.

    One loop iteration per row is the relay's hot path, so it is kept flat: rows already received
    are taken straight from libpq, gathered into one buffer, and written (and hashed) once per
    :data:`RELAY_WRITE` bytes.
    """

    def __init__(
        self,
        out: psycopg.Copy,
        inp: psycopg.Copy,
        digest: Any,
        on_write: Callable[[int], None] | None,
    ) -> None:
        self.out, self.inp, self.digest, self.on_write = out, inp, digest, on_write
        self.moved = 0

    def run(self) -> int:
        """Relays every row; returns the source's row count (its command tag)."""
        pgconn = self.out.connection.pgconn
        get, read, flush = pgconn.get_copy_data, self.out.read, self._write
        pending, gathered = bytearray(), 0
        data: Buffer
        while True:
            size, data = get(1)
            if size == 0:  # nothing complete buffered: let psycopg wait for the network
                data = read()
                size = len(data)
                if not size:  # psycopg read the end itself
                    rows = self.out.cursor.rowcount
                    break
            elif size < 0:
                if size != -1:
                    raise psycopg.OperationalError(
                        f"receiving copy data failed: {pgconn.get_error_message()}"
                    )
                rows = _finish(pgconn, self.out.connection.info.encoding)  # the end
                break
            pending += data
            gathered += size
            if gathered >= RELAY_WRITE:
                flush(pending)
                pending, gathered = bytearray(), 0
        if gathered:
            flush(pending)
        return rows

    def _write(self, pending: bytearray) -> None:
        chunk = bytes(pending)  # the writer may keep a reference: never reuse its buffer
        self.inp.write(chunk)
        self.moved += len(chunk)
        if self.digest is not None:
            self.digest.update(chunk)
        if self.on_write is not None:
            self.on_write(len(chunk))


def _finish(pgconn: pq.abc.PGconn, encoding: str) -> int:
    """Reads the results that end a COPY OUT whose end message was consumed; its row count."""
    results = []
    while (res := pgconn.get_result()) is not None:
        results.append(res)
    if not results:  # the server went away at the end of the stream
        message = pgconn.get_error_message(encoding).strip() or "no result after the COPY"
        raise psycopg.OperationalError(f"receiving copy data failed: {message}")
    failed = [r for r in results if r.status != pq.ExecStatus.COMMAND_OK]
    if failed:  # the server's own error (a terminated backend ends with it and one more result)
        raise errors.error_from_result(failed[0], encoding=encoding)
    if len(results) != 1:
        raise psycopg.ProgrammingError(f"COPY ended with {len(results)} results, not 1")
    result = results[0]
    return result.command_tuples if result.command_tuples is not None else -1


def relay(
    source: Connection,
    copy_out: sql.Composed,
    target: Connection,
    copy_in: sql.Composed,
    *,
    params: Sequence[object] = (),
    hashed: bool = False,
    on_write: Callable[[int], None] | None = None,
) -> RelayResult:
    """Streams COPY blocks from ``source`` into ``target`` without parsing rows.

    Both sessions stay in whatever transactions they are in; the caller decides isolation and
    commit. Memory stays flat: at most about :data:`RELAY_WRITE` bytes are held.

    Args:
        source: The source session.
        copy_out: A ``COPY ... TO STDOUT`` statement.
        target: The target session.
        copy_in: A ``COPY ... FROM STDIN`` statement in the same format.
        params: Parameters of ``copy_out`` (bound by psycopg; ``COPY`` has no server-side
            parameters).
        hashed: Also compute the ``sha256`` of the bytes (a batch's content hash).
        on_write: Called with the size of each write to the target (progress, fault tests).

    Returns:
        The row counts from both command tags, the bytes moved and, if asked, their hash.
    """
    digest = hashlib.sha256() if hashed else None
    with source.cursor() as scur, target.cursor() as tcur:
        with scur.copy(copy_out, params or None) as out, tcur.copy(copy_in) as inp:
            pump = _Pump(out, inp, digest, on_write)
            rows = pump.run()
        content = None if digest is None else "sha256:" + digest.hexdigest()
        return RelayResult(rows, tcur.rowcount, pump.moved, content)
