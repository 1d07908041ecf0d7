"""Locks as the tests read and use them: who waits for what (``pg_locks``, ``pg_stat_activity``),
and a gate the test holds shut to stop a statement at a moment the server's state shows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import conninfo, sql

from tests.helpers import pg


def lock_waiters(
    dsn: str,
    application_name: str,
    *,
    wait_event: str | None = None,
    query_prefix: str | None = None,
) -> list[int]:
    """Backends of ``dsn``'s database named ``application_name`` that wait for a heavyweight
    lock (``pg_stat_activity.wait_event_type = 'Lock'``), optionally of one kind (``advisory``,
    ``relation``...) and running a statement that starts with ``query_prefix``."""
    dbname = conninfo.conninfo_to_dict(dsn)["dbname"]
    rows = pg.fetch_all(
        pg.server_admin(dsn),
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s"
        " AND wait_event_type = 'Lock' AND (%s::text IS NULL OR wait_event = %s)"
        " AND (%s::text IS NULL OR starts_with(query, %s))",
        (dbname, application_name, wait_event, wait_event, query_prefix, query_prefix),
    )
    return [int(r[0]) for r in rows]  # type: ignore[call-overload]


def awaited_locks(dsn: str, pid: int) -> list[tuple[str, str, str]]:
    """The locks backend ``pid`` waits for (``pg_locks.granted = false``), as (locktype,
    relation name or '', mode). Read in ``dsn``'s database so relation OIDs resolve to names."""
    rows = pg.fetch_all(
        dsn,
        "SELECT locktype, coalesce(relation::regclass::text, ''), mode FROM pg_locks"
        " WHERE pid = %s AND NOT granted",
        (pid,),
    )
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def held_lock_modes(dsn: str, relation: str) -> dict[int, set[str]]:
    """Granted locks on ``relation`` (a regclass text such as ``public.mixed``) by backend pid,
    other than this query's own."""
    rows = pg.fetch_all(
        dsn,
        "SELECT pid, mode FROM pg_locks WHERE locktype = 'relation' AND granted"
        " AND relation = %s::regclass AND pid <> pg_backend_pid()",
        (relation,),
    )
    modes: dict[int, set[str]] = {}
    for pid, mode in rows:
        modes.setdefault(int(pid), set()).add(str(mode))  # type: ignore[call-overload]
    return modes


class AdvisoryGate:
    """A gate the test holds shut: an exclusive session advisory lock on ``key`` in ``dsn``'s
    database. A statement whose rows pass :attr:`condition` (a shared transaction advisory lock
    on the same key, taken for the first row) waits at the gate, visibly in ``pg_locks`` and
    ``pg_stat_activity`` (``wait_event = 'advisory'``), until :meth:`open` is called.

    Args:
        dsn: The database the gated statement runs in (advisory locks are per database).
        key: The advisory lock key.
    """

    def __init__(self, dsn: str, key: int = 4242) -> None:
        self.dsn, self.key = dsn, key
        self._conn = psycopg.connect(dsn, autocommit=True, application_name="dpone-test-gate")
        self._conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        self._lock = threading.Lock()

    @property
    def condition(self) -> sql.Composed:
        """A WHERE condition that waits at the gate, then is true for every row."""
        return sql.SQL("pg_advisory_xact_lock_shared({})::text IS NOT NULL").format(
            sql.Literal(self.key)
        )

    def create_view(self, view: str, over: str) -> None:
        """Creates ``view`` (``schema.name``) with every row of table ``over``, behind the gate."""
        pg.execute(
            self.dsn,
            sql.SQL("CREATE VIEW {} AS SELECT t.* FROM {} t WHERE {}").format(
                sql.Identifier(*view.split(".")), sql.Identifier(*over.split(".")), self.condition
            ),
        )

    def open(self) -> None:
        """Opens the gate (ends the session that holds the lock); idempotent, any thread."""
        with self._lock:
            if not self._conn.closed:
                self._conn.close()

    def __enter__(self) -> AdvisoryGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()


@contextmanager
def terminated_at_gate(
    dsn: str, application_name: str, query_prefix: str, *, timeout: float = 60.0
) -> Iterator[AdvisoryGate]:
    """Holds an :class:`AdvisoryGate` shut while a thread waits (on ``pg_stat_activity``) for
    the backend named ``application_name`` whose statement starts with ``query_prefix`` to wait
    at the gate, then terminates that backend: a fault in the middle of a statement, at a moment
    fixed by the server's state, not by timing.

    Yields the gate (put its :attr:`~AdvisoryGate.condition` in the statement to stop). On
    leaving, the gate opens and the thread is joined; if it failed (its wait timed out), its
    error is raised. It opens the gate itself when it fails, so the gated statement is never
    left hanging.
    """
    gate = AdvisoryGate(dsn)
    errors: list[BaseException] = []
    left = threading.Event()
    what = f"a {query_prefix!r} statement of {application_name} waits at the gate"

    def waiting() -> list[int]:
        if left.is_set():
            raise AssertionError(f"the block ended before {what}")
        return lock_waiters(dsn, application_name, wait_event="advisory", query_prefix=query_prefix)

    def terminate_the_waiter() -> None:
        try:
            pg.terminate(pg.wait_until(waiting, timeout=timeout, what=what)[:1], dsn)
        except BaseException as exc:
            errors.append(exc)
            gate.open()

    thread = threading.Thread(target=terminate_the_waiter, name="dpone-test-terminator")
    thread.start()
    try:
        yield gate
    finally:
        left.set()
        gate.open()
        thread.join(timeout + 10)
    if errors:
        raise errors[0]
