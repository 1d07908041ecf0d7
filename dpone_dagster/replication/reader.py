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

import contextlib
from collections.abc import Generator, Iterator
from contextlib import closing
from typing import Any, Final

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.prefetch import prefetched
from dpone_dagster.postgres.connection import Connection

from .changes import Lsn, Message, lsn_text
from .pgoutput import decode
from .slot import slot_status

FETCH_ROWS: Final = 20_000
"""Messages fetched from the server per round trip (the client's bound, with their values)."""
ROUND_CHANGES: Final = 100_000
"""Messages the first round of :func:`read_ahead` decodes: a run's first row waits for one
round's decode, not the whole backlog's. Each round after decodes twice the one before, up to
:data:`MAX_ROUND_CHANGES` (a round starts from its slot's restart point, which may lie inside
the round before: fewer, larger rounds decode less twice)."""
MAX_ROUND_CHANGES: Final = 1_600_000
READ_AHEAD_BYTES: Final = 16 << 20
"""WAL to read under which a run peeks its slot whole (a copy costs a few milliseconds)."""
READ_AHEAD: Final = 5
"""Round trips of messages :func:`read_ahead` holds ahead of the caller (its memory bound)."""

_PEEK: Final = sql.SQL(
    "SELECT {columns}"
    " FROM pg_catalog.{function}("
    "{slot}, {upto_lsn}::pg_lsn, {upto_nchanges}::int4,"
    " 'proto_version', '1', 'publication_names', {publications})"
)
_DROP_COPY: Final = (
    "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots"
    " WHERE slot_name = %s AND temporary"
)
_PEEK_FUNCTION: Final = sql.Identifier("pg_logical_slot_peek_binary_changes")
_GET_FUNCTION: Final = sql.Identifier("pg_logical_slot_get_binary_changes")


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


def read_ahead(
    conn: Connection,
    *,
    slot: str,
    publication: str,
    upto_lsn: Lsn,
    max_changes: int | None,
    round_changes: int = ROUND_CHANGES,
    ahead: bool = True,
) -> Iterator[list[bytes]]:
    """The slot's messages as :func:`read_changes` reads them, undecoded (every ``pgoutput``
    message's bytes, type and origin messages included, as the server counts them against
    ``max_changes``), a round trip's list at a time,
    decoded a round at a time on a background thread while the caller stages the ones before.

    A peek decodes everything up to its LSN before its first row: a backlog's whole decode
    would come before any apply. So the slot is copied into a ``TEMPORARY`` slot of ``conn``'s
    session (at the same position; the server drops it with the session), whose changes are
    read and consumed a round at a time (``pg_logical_slot_get_binary_changes``), the first of
    ``round_changes`` messages, each next one twice as many: the group's own slot is never
    moved here. Without a free slot for the copy, or with ``ahead`` false (little WAL to read:
    the copy would cost more than it saves), the slot is peeked whole, as :func:`read_changes`
    does.

    Args:
        conn: An idle source session; the background thread's until the iterator ends.
        slot: The group's slot.
        publication: Its publication.
        upto_lsn: Stop after the transaction whose commit record reaches this LSN.
        max_changes: Stop after the transaction in which the server has output this many
            messages, over every round; None: no budget.
        round_changes: Messages the first round decodes before its rows are read.
        ahead: Read through a copy, round by round (else one peek of the slot).

    Yields:
        Every message's bytes, in commit order, a list of them at a time.

    Raises:
        EngineError: the codes of :func:`read_changes`.
    """
    copy = _copy_slot(conn, slot) if ahead else None
    if copy is None:
        whole = _peek(conn, slot, publication, upto_lsn, max_changes, FETCH_ROWS, with_lsn=False,
                      chunks=True)  # fmt: skip
        with closing(whole):
            for chunk in whole:
                yield [data for (data,) in chunk]
        return

    def rounds() -> Iterator[list[bytes]]:
        left, size = max_changes, round_changes
        while left is None or left > 0:
            asked = size if left is None else min(size, left)
            size = min(2 * size, MAX_ROUND_CHANGES)
            read = 0
            taken = _peek(conn, copy, publication, upto_lsn, asked, FETCH_ROWS, with_lsn=False,
                          consume=True, chunks=True, failure_of=slot)  # fmt: skip
            with closing(taken):
                for chunk in taken:
                    read += len(chunk)
                    yield [data for (data,) in chunk]
            if read < asked:  # the server reached upto_lsn
                return
            left = None if left is None else left - read

    try:
        yield from prefetched(rounds, ahead=READ_AHEAD)
    finally:  # a failed statement drops the session's temporary slots itself
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):  # never replaces the read's own failure
                conn.execute(_DROP_COPY, (copy,))


def _copy_slot(conn: Connection, slot: str) -> str | None:
    """A ``TEMPORARY`` copy of ``slot`` for ``conn``'s session to consume; None when every
    replication slot is in use."""
    copy = f"dpone_read_{conn.info.backend_pid}"
    status = slot_status(conn, slot, holders=False)
    if status is not None and status.active_pid is not None:  # as a peek of it would fail
        raise engine_error(
            "replication_slot_active",
            f"Replication slot {slot!r} is in use by the session of pid {status.active_pid}.",
        )
    try:
        conn.execute(
            "SELECT pg_catalog.pg_copy_logical_replication_slot(%s, %s, true)", (slot, copy)
        )
    except psycopg.errors.ConfigurationLimitExceeded:
        return None
    except psycopg.Error as exc:
        raise _slot_failure(conn, slot, exc) from exc
    return copy


def _peek(
    conn: Connection,
    slot: str,
    publication: str,
    upto_lsn: Lsn,
    max_changes: int | None,
    fetch_rows: int,
    *,
    with_lsn: bool,
    consume: bool = False,
    chunks: bool = False,
    failure_of: str | None = None,
) -> Generator[Any, None, None]:
    """The peek's rows: ``(lsn, data)``, or ``(data,)`` without ``with_lsn``; ``consume``:
    the slot's changes are read and consumed (``pg_logical_slot_get_binary_changes``);
    ``chunks``: a list of rows per round trip instead of each row; ``failure_of``: the slot a
    failure is told of (the group's, when ``slot`` is its copy)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("read_changes needs an idle session (no transaction open)")
    if max_changes is not None and max_changes < 1:
        raise ValueError(f"max_changes must be at least 1 (or None), not {max_changes}")
    query = _PEEK.format(
        columns=sql.SQL("(lsn - '0/0'::pg_lsn)::int8, data" if with_lsn else "data"),
        function=_GET_FUNCTION if consume else _PEEK_FUNCTION,
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
                if chunks:
                    yield rows
                else:
                    yield from rows
                if len(rows) < fetch_rows:  # the last: no empty FETCH to learn it
                    break
    except psycopg.Error as exc:
        raise _slot_failure(conn, failure_of or slot, exc) from exc
    finally:
        if not conn.closed:  # a session closed under it (a failed run's guard) keeps nothing
            conn.read_only = None


def _slot_failure(conn: Connection, slot: str, exc: psycopg.Error) -> Exception:
    """The coded error of a peek that failed because of the slot itself, else ``exc``."""
    if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return exc
    status = slot_status(conn, slot, holders=False)
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
