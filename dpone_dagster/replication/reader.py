"""Reading a logical slot's changes without consuming them.

psycopg 3 has no streaming replication protocol, so a run reads the slot with
``pg_logical_slot_peek_binary_changes`` (``pgoutput``, protocol version 1) from the slot's
confirmed position up to an LSN (the source's ``pg_current_wal_lsn()`` at the run's start), with
an optional budget (``upto_nchanges``: PostgreSQL stops only at a transaction boundary, after the
transaction that reaches it). A peek never moves the slot: only
:func:`~.slot.advance_slot`, after the target committed, does. The rows come through a named
(server-side) cursor in binary format, a chunk at a time, so the client holds a bounded number of
messages however large the backlog or a transaction is.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import closing
from typing import Any, Final

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection

from .changes import Lsn, Message, lsn_text
from .pgoutput import decode
from .slot import slot_status

FETCH_ROWS: Final = 20_000
"""Messages fetched from the server per round trip (the client's bound, with their values)."""

_PEEK: Final = sql.SQL(
    "SELECT {columns}"
    " FROM pg_catalog.pg_logical_slot_peek_binary_changes("
    "{slot}, {upto_lsn}::pg_lsn, {upto_nchanges}::int4,"
    " 'proto_version', '1', 'publication_names', {publications})"
)


def read_changes(
    conn: Connection,
    *,
    slot: str,
    publication: str,
    upto_lsn: Lsn,
    max_changes: int | None,
    fetch_rows: int = FETCH_ROWS,
) -> Iterator[tuple[Lsn, Message]]:
    """The slot's decoded changes after its confirmed position, in commit order.

    The peek runs in a read-only transaction of ``conn`` (opened here, ended when the iterator is
    exhausted or closed), through a named cursor fetching ``fetch_rows`` messages at a time. The
    slot is never moved.

    Args:
        conn: An idle session of the slot's database whose role may read the slot
            (``REPLICATION``); it is the reader's until the iterator ends (its transaction
            holds the cursor), so apply the changes through another session.
        slot: The logical slot (``pgoutput``).
        publication: The publication whose tables are decoded.
        upto_lsn: Stop after the transaction whose commit record reaches this LSN.
        max_changes: Stop after the transaction in which the server has output this many
            messages (begin, commit and relation messages count); None: no budget.
        fetch_rows: Messages per round trip.

    Yields:
        ``(lsn, message)``: the WAL position the server gives the message, and the message
        (type and origin messages are left out).

    Raises:
        EngineError: ``replication_slot_missing`` (no such slot), ``replication_slot_lost``
            (the server removed WAL it needed), ``replication_slot_active`` (another
            session holds it), ``replication_message_invalid`` (a message that is not
            ``pgoutput`` protocol version 1). Other failures propagate as psycopg errors.
    """
    peek = _peek(conn, slot, publication, upto_lsn, max_changes, fetch_rows, with_lsn=True)
    with closing(peek):
        for lsn, data in peek:
            message = decode(data)
            if message is not None:
                yield lsn, message


def read_messages(
    conn: Connection,
    *,
    slot: str,
    publication: str,
    upto_lsn: Lsn,
    max_changes: int | None,
    fetch_rows: int = FETCH_ROWS,
) -> Iterator[bytes]:
    """The slot's messages as :func:`read_changes` reads them, undecoded: every ``pgoutput``
    message's bytes (type and origin messages included, as the server counts them against
    ``max_changes``), for a caller that decodes them itself (:func:`~.pgoutput.decode`,
    :func:`~.pgoutput.row_change`). Same arguments and errors as :func:`read_changes`."""
    peek = _peek(conn, slot, publication, upto_lsn, max_changes, fetch_rows, with_lsn=False)
    with closing(peek):
        for (data,) in peek:
            yield data


def _peek(
    conn: Connection,
    slot: str,
    publication: str,
    upto_lsn: Lsn,
    max_changes: int | None,
    fetch_rows: int,
    *,
    with_lsn: bool,
) -> Generator[tuple[Any, ...], None, None]:
    """The peek's rows: ``(lsn, data)``, or ``(data,)`` without ``with_lsn``."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("read_changes needs an idle session (no transaction open)")
    if max_changes is not None and max_changes < 1:
        raise ValueError(f"max_changes must be at least 1 (or None), not {max_changes}")
    query = _PEEK.format(
        columns=sql.SQL("(lsn - '0/0'::pg_lsn)::int8, data" if with_lsn else "data"),
        slot=sql.Literal(slot),
        upto_lsn=sql.Literal(lsn_text(upto_lsn)),
        upto_nchanges=sql.Literal(max_changes),
        # pgoutput splits the list as identifiers: quoted, a name keeps its case and commas.
        publications=sql.Literal(sql.Identifier(publication).as_string(conn)),
    )
    conn.read_only = True  # BEGIN READ ONLY: the peek writes nothing
    try:
        with conn.transaction(), conn.cursor("dpone_replication_peek", binary=True) as cursor:
            cursor.execute(query)
            while True:
                rows = cursor.fetchmany(fetch_rows)
                yield from rows
                if len(rows) < fetch_rows:  # the last: no empty FETCH to learn it
                    break
    except psycopg.Error as exc:
        raise _slot_failure(conn, slot, exc) from exc
    finally:
        if not conn.closed:  # a session closed under it (a failed run's guard) keeps nothing
            conn.read_only = None


def _slot_failure(conn: Connection, slot: str, exc: psycopg.Error) -> Exception:
    """The coded error of a peek that failed because of the slot itself, else ``exc``."""
    if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return exc
    status = slot_status(conn, slot)
    if status is None:
        return engine_error(
            "replication_slot_missing", f"The source has no replication slot {slot!r}."
        )
    if status.wal_status == "lost":
        return engine_error(
            "replication_slot_lost",
            f"Replication slot {slot!r} is lost: the source removed WAL it still needed "
            f"({exc.diag.message_primary or exc}).",
        )
    if status.active_pid is not None and status.active_pid != conn.info.backend_pid:
        return engine_error(
            "replication_slot_active",
            f"Replication slot {slot!r} is in use by the session of pid {status.active_pid}.",
        )
    return exc
