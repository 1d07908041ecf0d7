"""The batch's data path: COPY blocks from the source session into the target session, hashed.

Like :func:`dpone_dagster.postgres.copy.relay` (blocks are never parsed), plus bind parameters
on the source side and a ``sha256`` of the bytes on the way: the batch's content hash. The
client's cost per row is what limits the relay once both servers are busy (the server sends one
COPY message per row), so two things are kept cheap:

* Rows are gathered into writes of ``RELAY_WRITE`` bytes (one libpq call and one hash update per
  64 KiB instead of per row; larger buffers cost more than they save in copying).
* Rows already received are taken straight from libpq (:meth:`psycopg.pq.PGconn.get_copy_data`
  in non-blocking mode, a C call) and psycopg's :meth:`psycopg.Copy.read` is used only when it
  has to wait for the network; this halves the client's CPU time per row. The end of the stream
  is handled like psycopg does it: the final result is read and checked and its command tag
  gives the row count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import errors, pq, sql
from psycopg.abc import Buffer

from dpone_dagster.postgres.copy import RELAY_WRITE

Conn = psycopg.Connection[tuple[object, ...]]

EMPTY_HASH = "sha256:" + hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Relayed:
    """What one relay moved: both command-tag counts, the bytes and their ``sha256``."""

    rows_out: int
    rows_in: int
    bytes: int
    content_hash: str


class _Drain:
    """Iterates the COPY messages of a started ``COPY ... TO STDOUT``; then ``rows`` is set."""

    def __init__(self, copy: psycopg.Copy) -> None:
        self.copy = copy
        self.rows = -1

    def __iter__(self) -> Iterator[Buffer]:
        pgconn = self.copy.connection.pgconn
        while True:
            size, data = pgconn.get_copy_data(1)
            if size > 0:
                yield data
                continue
            if size == 0:  # nothing complete buffered: let psycopg wait for the network
                block = self.copy.read()
                if not block:  # psycopg read the end itself
                    self.rows = self.copy.cursor.rowcount
                    return
                yield block
                continue
            if size == -1:  # the end: read the final result, as psycopg would
                self.rows = _finish(pgconn, self.copy.connection.info.encoding)
                return
            raise psycopg.OperationalError(
                f"receiving copy data failed: {pgconn.get_error_message()}"
            )


def _finish(pgconn: pq.abc.PGconn, encoding: str) -> int:
    """Reads the results that end a COPY OUT whose end message was consumed; its row count."""
    results = []
    while (res := pgconn.get_result()) is not None:
        results.append(res)
    if len(results) != 1:
        raise psycopg.ProgrammingError(f"COPY ended with {len(results)} results, not 1")
    result = results[0]
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise errors.error_from_result(result, encoding=encoding)
    return result.command_tuples if result.command_tuples is not None else -1


def hashed_relay(
    source: Conn,
    copy_out: sql.Composed,
    params: Sequence[str],
    target: Conn,
    copy_in: sql.Composed,
) -> Relayed:
    """Streams COPY blocks ``source`` -> ``target`` in their open transactions, hashing them.

    Memory stays flat: at most about ``RELAY_WRITE`` bytes are held.
    """
    digest = hashlib.sha256()
    moved = 0
    pending = bytearray()
    with source.cursor() as scur, target.cursor() as tcur:
        with scur.copy(copy_out, params) as out, tcur.copy(copy_in) as inp:
            drain = _Drain(out)
            for block in drain:
                pending += block
                if len(pending) >= RELAY_WRITE:
                    chunk = bytes(pending)  # the writer may keep a reference; reuse the buffer
                    pending.clear()
                    inp.write(chunk)
                    digest.update(chunk)
                    moved += len(chunk)
            if pending:
                inp.write(bytes(pending))
                digest.update(pending)
                moved += len(pending)
        return Relayed(drain.rows, tcur.rowcount, moved, "sha256:" + digest.hexdigest())
