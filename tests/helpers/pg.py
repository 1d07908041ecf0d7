"""Real-PostgreSQL helpers for the tests: databases, mixed-type tables, concurrent writers,
and waits on the server's own state (never a fixed sleep)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg import conninfo, sql

_T = TypeVar("_T")

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
START_HINT = (
    "Start PostgreSQL 15 locally with `pg_ctlcluster --skip-systemctl-redirect 15 main start` "
    "(or point DPONE_TEST_PG_DSN at a server where this user may CREATE DATABASE, or unset it "
    "and let the harness start the embedded PostgreSQL of .dpone_pg/)."
)
TARGET_ENV = "DPONE_TEST_TARGET_DSN"
"""Puts the target databases on another server (the cross-server set: ``-m cross_server``)."""


def admin_dsn() -> str:
    """The server the tests use, from ``DPONE_TEST_PG_DSN``."""
    return os.environ.get("DPONE_TEST_PG_DSN", DEFAULT_DSN)


def target_admin_dsn() -> str:
    """The server of the target databases: ``DPONE_TEST_TARGET_DSN``, else :func:`admin_dsn`."""
    return os.environ.get(TARGET_ENV) or admin_dsn()


def _address(dsn: str) -> tuple[str, str]:
    params = conninfo.conninfo_to_dict(dsn)
    return str(params.get("host") or "localhost"), str(params.get("port") or "5432")


def server_admin(dsn: str) -> str:
    """The admin DSN of the server ``dsn`` points at (the target server's, the main one, or
    another the test chose: its ``postgres`` database)."""
    for server in (target_admin_dsn(), admin_dsn()):
        if _address(dsn) == _address(server):
            return server
    return with_db(dsn, "postgres")


def embedded_admin() -> str:
    """The admin DSN of the embedded PostgreSQL 18 of ``.dpone_pg/`` (started, or reused while
    it runs), for a test that needs a server of that version whatever the run's servers are."""
    from dpone_dagster import embedded

    root = Path(__file__).resolve().parents[2]
    return embedded.start(root / ".dpone_pg").dsn()


def server_where(predicate: Callable[[str], bool], what: str, *, avoid: str | None = None) -> str:
    """The admin DSN of the first server where ``predicate`` holds, among the run's main server,
    its target server and the embedded PostgreSQL 18 (started if needed), other than the server
    of ``avoid``.

    Raises:
        AssertionError: naming ``what`` when none qualifies (and how to get such a server).
    """
    candidates = [admin_dsn(), target_admin_dsn()]
    for server in [*candidates, None]:
        server = server or embedded_admin()
        if avoid is not None and _address(server) == _address(avoid):
            continue
        if predicate(server):
            return server
    raise AssertionError(
        f"No server of this run is {what}. {START_HINT} The embedded server is PostgreSQL 18; "
        "the machine's PostgreSQL 15 (127.0.0.1:5432) is the other."
    )


def with_db(dsn: str, dbname: str) -> str:
    """``dsn`` pointing at another database."""
    return conninfo.make_conninfo(dsn, dbname=dbname)


def server_problem(dsn: str) -> str | None:
    """None when the server answers, else a message that names it and says how to start one."""
    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        host, port = _address(dsn)
        return f"PostgreSQL at {host}:{port} does not answer: {exc}\n{START_HINT}"
    return None


def server_version(dsn: str) -> int:
    """The server's major version (``server_version_num // 10000``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.info.server_version // 10000


def create_database(prefix: str = "dpone_t", server: str | None = None) -> str:
    """Creates a fresh, uniquely named database on ``server`` (an admin DSN, default
    :func:`admin_dsn`) and returns its DSN."""
    server = server or admin_dsn()
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_db(server, name)


def drop_database(dsn: str) -> None:
    """Drops a database made by :func:`create_database`, disconnecting its sessions."""
    name = conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_admin(dsn), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


class _Dropper:
    """Drops the tests' databases on a thread of their own, off the tests' path.

    ``DROP DATABASE`` makes the server take an immediate checkpoint and waits for it (every dirty
    buffer of the server written and synced): a test that waited for its own databases' drops
    paid that on each teardown. The drops still happen, in order, while the next test runs;
    :meth:`wait` (called when the test session ends) returns once every queued one is done and
    raises the first failure, so a database that could not be dropped still fails the run.
    """

    def __init__(self) -> None:
        self._queue: list[str] = []
        self._ready = threading.Condition()
        self._busy = False
        self._errors: list[BaseException] = []
        self._thread: threading.Thread | None = None

    def later(self, dsn: str) -> None:
        """Queues ``dsn``'s database for dropping."""
        with self._ready:
            self._queue.append(dsn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="drops", daemon=True)
                self._thread.start()
            self._ready.notify_all()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._busy = False
                    self._ready.notify_all()
                    self._ready.wait()
                dsn, self._busy = self._queue.pop(0), True
            try:
                drop_database(dsn)
            except Exception as exc:  # kept: wait() raises it
                self._errors.append(exc)

    def wait(self) -> None:
        """Returns once every queued drop is done; raises the first drop that failed."""
        with self._ready:
            while self._queue or self._busy:
                self._ready.wait()
        if self._errors:
            raise self._errors[0]


_DROPPER = _Dropper()


def drop_database_later(dsn: str) -> None:
    """Drops a database made by :func:`create_database` on a background thread (see
    :class:`_Dropper`); :func:`wait_for_drops` waits for every one."""
    _DROPPER.later(dsn)


def wait_for_drops() -> None:
    """Waits until every database given to :func:`drop_database_later` is dropped."""
    _DROPPER.wait()


def execute(dsn: str, statement: str | sql.Composable, params: tuple[object, ...] = ()) -> None:
    """Runs one statement in autocommit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, params)  # type: ignore[arg-type]


def fetch_all(
    dsn: str, query: str | sql.Composable, params: tuple[object, ...] = ()
) -> list[tuple[object, ...]]:
    """Runs one query in autocommit and returns all rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def fetch_one(dsn: str, query: str | sql.Composable, params: tuple[object, ...] = ()) -> object:
    """Runs one query in autocommit and returns the first column of the first row."""
    rows = fetch_all(dsn, query, params)
    return rows[0][0] if rows else None


def table_exists(dsn: str, schema: str, name: str) -> bool:
    """True when ``schema.name`` exists (exact names, no quoting rules involved)."""
    return bool(
        fetch_one(
            dsn,
            "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s)",
            (schema, name),
        )
    )


def staging_tables(dsn: str) -> list[str]:
    """Names of dpone staging tables (``_dpone_stg_*``) that exist in ``dsn``'s database."""
    rows = fetch_all(dsn, "SELECT relname FROM pg_class WHERE relname LIKE '\\_dpone\\_stg\\_%%'")
    return [str(r[0]) for r in rows]


MIXED_COLUMNS = """
    id bigint PRIMARY KEY,
    small smallint,
    qty integer NOT NULL DEFAULT 0,
    amount numeric(14,2),
    ratio double precision,
    label text,
    code varchar(40),
    active boolean,
    born date,
    seen_at timestamp,
    happened_at timestamptz,
    span interval,
    ref uuid,
    doc jsonb,
    tags integer[],
    blob bytea
"""


_MIXED_VALUES = (
    "g",
    "(g % 30000)::smallint",
    "g % 1000",
    "round((g * 1.37)::numeric, 2)",
    "g / 7.0",
    "'label ' || md5(g::text) || md5((g + 1)::text)",
    "'code-' || (g % 977)",
    "g % 2 = 0",
    "date '2020-01-01' + (g % 2000)::int",
    "timestamp '2020-01-01' + g * interval '1 second'",
    "timestamptz '2020-01-01 00:00+00' + g * interval '1 minute'",
    "(g % 100) * interval '1 hour'",
    "md5(g::text)::uuid",
    "jsonb_build_object('g', g, 'k', md5(g::text))",
    "ARRAY[g % 7, g % 11, g % 13]::integer[]",
    "decode(md5(g::text), 'hex')",
)


def create_mixed_table(
    dsn: str, schema: str = "public", name: str = "mixed", rows: int = 1000, *, start: int = 1
) -> None:
    """Creates ``schema.name`` with mixed column types (if missing) and appends ``rows`` rows.

    Row ids run from ``start``. About 270 bytes per row, generated server-side. Every tenth row
    has NULLs in the nullable columns.
    """
    table = sql.Identifier(schema, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + MIXED_COLUMNS + ")").format(table))
        # Every tenth row has NULLs in the nullable columns.
        values = ", ".join(
            expr if i < 3 else f"CASE WHEN g % 10 = 0 THEN NULL ELSE {expr} END"
            for i, expr in enumerate(_MIXED_VALUES)
        ).replace("%", "%%")
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT "
                + values
                + " FROM generate_series(%s::bigint, %s::bigint) g"
            ).format(table),
            (start, start + rows - 1),
        )


def table_fingerprint(
    dsn: str, schema: str, name: str, order_by: str | None = "id"
) -> tuple[int, str]:
    """Returns (row count, md5 of the md5s of every row's text in ``order_by`` order).

    ``order_by=None`` orders by the row text itself (for tables without an ``id`` column). Each
    row is hashed first, so the aggregate stays far below PostgreSQL's 1 GB string limit at the
    benchmarks' 10M rows (32 bytes a row instead of the row's text).
    """
    order = sql.SQL("t.{}").format(sql.Identifier(order_by)) if order_by else sql.SQL("t::text")
    query = sql.SQL(
        "SELECT count(*), coalesce(md5(string_agg(md5(t::text), '' ORDER BY {})), '') FROM {} AS t"
    ).format(order, sql.Identifier(schema, name))
    row = fetch_all(dsn, query)[0]
    return int(row[0]), str(row[1])  # type: ignore[call-overload]


def open_transactions(dsn: str, application_name: str | None = None) -> list[tuple[object, ...]]:
    """Sessions of ``dsn``'s database that sit inside a transaction (other than this query's)."""
    dbname = conninfo.conninfo_to_dict(dsn)["dbname"]
    query = (
        "SELECT pid, application_name, state, query FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        # Sessions only: an autovacuum worker (the embedded server runs autovacuum) is none.
        " AND backend_type = 'client backend'"
    )
    params: tuple[object, ...] = (dbname,)
    if application_name is not None:
        query += " AND application_name = %s"
        params += (application_name,)
    return fetch_all(server_admin(dsn), query, params)


def wait_for_no_open_transaction(
    *dsns: str, application_name: str | None = None, timeout: float = 30.0
) -> None:
    """Waits (on ``pg_stat_activity``) until no session of the databases of ``dsns`` (named
    ``application_name``, if given) sits inside a transaction, ``active`` or ``idle in
    transaction``: a session whose client died is ended by the server a moment later.

    Raises:
        TimeoutError: naming the sessions still open after ``timeout`` seconds.
    """
    still_open: list[tuple[object, ...]] = []

    def settled() -> bool:
        still_open[:] = [row for dsn in dsns for row in open_transactions(dsn, application_name)]
        return not still_open

    try:
        wait_until(settled, timeout=timeout, what="no session is inside a transaction")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; still open (pid, app, state, query): {still_open}") from None


def backends(dsn: str, application_name: str) -> list[int]:
    """Backend pids of ``dsn``'s database whose application_name matches."""
    dbname = conninfo.conninfo_to_dict(dsn)["dbname"]
    rows = fetch_all(
        server_admin(dsn),
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        (dbname, application_name),
    )
    return [int(r[0]) for r in rows]  # type: ignore[call-overload]


def terminate(pids: list[int], dsn: str | None = None) -> None:
    """``pg_terminate_backend`` each pid, on the server of ``dsn`` (default: the main one)."""
    for pid in pids:
        execute(
            server_admin(dsn) if dsn else admin_dsn(), "SELECT pg_terminate_backend(%s)", (pid,)
        )


def wait_until(
    predicate: Callable[[], _T], *, timeout: float, what: str, interval: float = 0.02
) -> _T:
    """Polls ``predicate`` until it returns a truthy value, and returns that value.

    The predicate reads state (the server's catalogs, a thread's result): the poll interval only
    paces the reads, no outcome depends on it.

    Raises:
        TimeoutError: naming ``what`` (and the predicate's last answer) when ``timeout``
            seconds pass first. A wait never gives up silently.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"waited {timeout:g}s until {what}, in vain (last answer: {value!r})"
            )
        time.sleep(interval)


@dataclass
class ConcurrentWriter:
    """A thread that inserts, updates and deletes rows of a mixed table until stopped.

    Each statement commits on its own (autocommit), so a snapshot taken at any moment sees a
    state that differs from the table's later states.
    """

    dsn: str
    schema: str = "public"
    name: str = "mixed"
    first_new_id: int = 10_000_000
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        table = sql.Identifier(self.schema, self.name)
        next_id = self.first_new_id
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, application_name="dpone-test-writer"
            ) as conn:
                self._started.set()
                while not self._stop.is_set():
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (id, qty, label) VALUES (%s, 1, 'written later')"
                        ).format(table),
                        (next_id,),
                    )
                    next_id += 1
                    self.inserted += 1
                    cur = conn.execute(
                        sql.SQL(
                            "UPDATE {} SET label = 'updated later', qty = qty + 1 WHERE id = "
                            "(SELECT id FROM {} WHERE id < %s ORDER BY random() LIMIT 1)"
                        ).format(table, table),
                        (self.first_new_id,),
                    )
                    self.updated += cur.rowcount
                    cur = conn.execute(
                        sql.SQL(
                            "DELETE FROM {} WHERE id = (SELECT id FROM {} WHERE id < %s "
                            "ORDER BY random() LIMIT 1)"
                        ).format(table, table),
                        (self.first_new_id,),
                    )
                    self.deleted += cur.rowcount
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)
            self._started.set()

    def start(self) -> ConcurrentWriter:
        """Starts writing; returns once the writer's session is connected."""
        self._thread = threading.Thread(target=self._run, name="dpone-test-writer", daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise TimeoutError("the concurrent writer did not connect in 30s")
        return self

    @property
    def writes(self) -> int:
        """Statements committed so far (inserts, updates and deletes)."""
        return self.inserted + self.updated + self.deleted

    def wait_for_writes(self, count: int, timeout: float = 30.0) -> None:
        """Waits until ``count`` writes have committed in all (or the writer failed).

        Raises:
            TimeoutError: the writer committed fewer in ``timeout`` seconds.
        """
        wait_until(
            lambda: self.errors or self.writes >= count,
            timeout=timeout,
            what=f"the writer has committed {count} writes",
        )
        if self.errors:
            raise self.errors[0]

    def stop(self) -> None:
        """Stops writing and re-raises any error the writer met."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            if self._thread.is_alive():
                raise TimeoutError("the concurrent writer did not stop in 30s")
        if self.errors:
            raise self.errors[0]


@contextmanager
def concurrent_writer(
    dsn: str, schema: str = "public", name: str = "mixed"
) -> Iterator[ConcurrentWriter]:
    """Runs a :class:`ConcurrentWriter` for the duration of the block."""
    writer = ConcurrentWriter(dsn, schema, name).start()
    try:
        yield writer
    finally:
        writer.stop()
