"""The MySQL/MariaDB source: a table or a query streamed with a server-side cursor.

Rows are read with PyMySQL's ``SSCursor`` (an unbuffered result: the server streams rows as the
client reads them, so memory stays flat) inside an explicit ``REPEATABLE READ`` read-only
transaction. The session reads ``TIMESTAMP`` columns in UTC (``time_zone = '+00:00'``).

The receipt makes no snapshot claim: InnoDB's consistent read has no server-issued token that
could be proved afterwards, so ``snapshot_authority`` and ``source_token`` stay empty and the
window is dated by the orchestrator's clock. Its row count is the rows streamed; its byte count
stays empty (PyMySQL does not expose the bytes it read, and an estimate is not evidence).

``success`` commits the read-only transaction and closes the session; ``abort`` and
``retain_commit_unknown`` roll it back and close it (mid-stream, by closing the session, which the
server answers with a rollback: a ROLLBACK cannot be sent while a result set is still streaming).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
import pymysql.cursors

from dpone_dagster.lifecycle import ExtractResult, redact
from dpone_dagster.lifecycle.options import build_options

from .mysql_catalog import query_columns, quote_mysql_identifier, table_columns
from .mysql_read import MySQLRead
from .mysql_types import MySQLColumnType, row_converter, source_column
from .protocol import ByteMeter, Row, RowStreamArtifact, SourceColumn, SourceError, extract_stream


@dataclass(frozen=True)
class MySQLSettings:
    """How to reach a MySQL or MariaDB server.

    Attributes:
        host: Server host.
        port: Server port.
        user: User name.
        password: Password (never printed).
        database: The default database (and the database of a table source).
        connect_timeout: Seconds to wait for the server to answer.
        read_timeout: Seconds to wait for each read from the socket; None waits forever.
        fetch_size: Rows read from the cursor per call.
    """

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = field(default="", repr=False)
    database: str = ""
    connect_timeout: float = 10.0
    read_timeout: float | None = 300.0
    fetch_size: int = 5000

    @property
    def label(self) -> str:
        """``mysql://user@host:port/database``, without the password."""
        return f"mysql://{self.user}@{self.host}:{self.port}/{self.database}"

    def connect(self) -> pymysql.Connection[pymysql.cursors.Cursor]:
        """Opens a session: utf8mb4, UTC time zone, no autocommit.

        Raises:
            SourceError: ``source_login_failed`` when the server refuses the user, its password
                or the database; ``source_unreachable`` when no server answers.
        """
        try:
            return pymysql.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                database=self.database or None,
                charset="utf8mb4",
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
                autocommit=False,
                init_command="SET time_zone = '+00:00'",
                program_name="dpone-dagster",
            )
        except pymysql.MySQLError as exc:
            if exc.args and exc.args[0] in _LOGIN_REFUSED:
                raise SourceError(
                    "source_login_failed",
                    f"{self.label} refused the session: {redact(str(exc))}",
                    ["Check the user, password and database (pass secrets with EnvVar)."],
                ) from None
            raise SourceError(
                "source_unreachable",
                f"Could not connect to {self.label}: {redact(str(exc))}",
                ["Check that the server is running and that host and port reach it."],
            ) from None


_LOGIN_REFUSED = frozenset({1044, 1045, 1049, 1698})
"""Server errors that refuse a session: access denied (to a database, for a user, for a socket
user) and an unknown database."""


class MySQLStream:
    """The live read: a session, its read-only transaction and its streaming cursor.

    Implements :class:`dpone_dagster.lifecycle.LiveSource`. Both endings are idempotent and
    always close the session.
    """

    def __init__(self, conn: pymysql.Connection[Any]) -> None:
        self.conn = conn
        self.cursor = conn.cursor(pymysql.cursors.SSCursor)
        self.exhausted = False
        self._lock = threading.Lock()
        self.ended_with: str | None = None

    @property
    def closed(self) -> bool:
        """True once the session is closed."""
        return not self.conn.open

    def _end(self, action: str) -> None:
        with self._lock:
            if self.ended_with is not None:
                return
            self.ended_with = action
            try:
                if self.conn.open and self.exhausted:
                    self.cursor.close()
                    if action == "commit":
                        self.conn.commit()
                    else:
                        self.conn.rollback()
            finally:
                self._drop()

    def _drop(self) -> None:
        """Closes the session, under a streaming result too, without reading the rest of it.

        The server rolls an open transaction back when the session ends. PyMySQL would drain
        the unread rows on close (and again when the cursor and result are garbage-collected,
        then on a dead socket), so an unfinished result is marked finished first.
        """
        result = getattr(self.conn, "_result", None)
        if result is not None:
            result.unbuffered_active = False
        self.cursor.connection = None  # type: ignore[assignment]
        if self.conn.open:
            self.conn.close()

    def commit_and_close(self) -> None:
        """Commits the read-only transaction and closes the session."""
        self._end("commit")

    def rollback_and_close(self) -> None:
        """Rolls the read-only transaction back and closes the session."""
        self._end("rollback")


def _check_unchanged(label: str, columns: Sequence[SourceColumn], description: Any) -> None:
    """Refuses a read whose columns are no longer those that were described and mapped."""
    names = [str(d[0]) for d in description or ()]
    if names != [c.name for c in columns]:
        raise SourceError(
            "mysql_schema_changed",
            f"{label} changed between description and read: columns {names} were read, "
            f"{[c.name for c in columns]} were mapped.",
            ["Run the load again."],
        )


class MySQLSource:
    """A MySQL/MariaDB table or query as a generic source.

    Args:
        settings: How to reach the server.
        read: What is read (:class:`~.mysql_read.MySQLRead`: a table, its database and
            columns, or a query).
        **legacy: ``table``, ``query``, ``database`` and ``columns`` as keywords: deprecated
            (``read=MySQLRead(...)``), for one release.

    Raises:
        SourceError: ``mysql_source_invalid`` for a bad read given as keywords,
            ``identifier_invalid`` for an empty database name.

    Examples:
        >>> source = MySQLSource(MySQLSettings(database="shop"), MySQLRead(table="orders"))
        >>> source.label
        'mysql://root@127.0.0.1:3306/shop.orders'
    """

    def __init__(
        self, settings: MySQLSettings, read: MySQLRead | None = None, **legacy: Any
    ) -> None:
        read = build_options(MySQLRead, read, caller="MySQLSource", legacy=legacy, argument="read")
        self.settings = settings
        self.read = read
        self.table = read.table
        self.query = read.query
        self.database = read.database or settings.database
        self.columns = None if read.columns is None else list(read.columns)
        if read.table is not None:
            quote_mysql_identifier(self.database)

    @property
    def label(self) -> str:
        """What is read, for messages and metadata."""
        if self.table is not None:
            base = self.settings.label.rsplit("/", 1)[0]
            return f"{base}/{self.database}.{self.table}"
        return f"{self.settings.label} (query)"

    def _described(self, conn: pymysql.Connection[Any]) -> list[tuple[str, MySQLColumnType, bool]]:
        if self.query is not None:
            return [(name, mysql, True) for name, mysql in query_columns(conn, self.query)]
        assert self.table is not None
        described = table_columns(conn, self.database, self.table)
        if self.columns is None:
            return described
        by_name = {name: (name, mysql, nullable) for name, mysql, nullable in described}
        missing = [c for c in self.columns if c not in by_name]
        if missing:
            raise SourceError(
                "column_not_found",
                f"{self.label} has no column(s) {missing}.",
                [f"Choose among {list(by_name)}."],
            )
        return [by_name[c] for c in self.columns]

    def _select(self, described: Sequence[tuple[str, MySQLColumnType, bool]]) -> str:
        if self.query is not None:
            return self.query
        assert self.table is not None
        names = ", ".join(quote_mysql_identifier(name) for name, _, _ in described)
        qualified = f"{quote_mysql_identifier(self.database)}.{quote_mysql_identifier(self.table)}"
        return f"SELECT {names} FROM {qualified}"  # noqa: S608 - every name is backtick-quoted

    def describe(self) -> list[SourceColumn]:
        """The columns with their PostgreSQL types, reading no row.

        Raises:
            SourceError: ``mysql_type_unmappable`` (before any row moves), ``table_not_found``,
                ``column_not_found``, ``mysql_query_invalid``, ``source_unreachable``,
                ``source_login_failed``.
        """
        conn = self.settings.connect()
        try:
            return [
                source_column(name, mysql, nullable=nullable)
                for name, mysql, nullable in self._described(conn)
            ]
        finally:
            conn.close()

    def extract(self) -> ExtractResult[RowStreamArtifact]:
        """Describes the source now and returns a pending stream of its rows.

        The types are mapped here, so an unmappable type fails before any row moves. The read
        itself starts when the artifact's rows are first consumed.
        """
        conn = self.settings.connect()
        try:
            described = self._described(conn)
            columns = [source_column(n, m, nullable=nl) for n, m, nl in described]
        finally:
            conn.close()
        convert = row_converter([(name, mysql) for name, mysql, _ in described])
        select = self._select(described)
        settings = self.settings

        def opener(artifact: RowStreamArtifact, meter: ByteMeter) -> Iterator[Row]:
            stream = MySQLStream(settings.connect())
            artifact.attach_source(stream)
            cursor = stream.cursor
            try:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("START TRANSACTION READ ONLY")
                cursor.execute(select)
                _check_unchanged(self.label, columns, cursor.description)
                while batch := cursor.fetchmany(settings.fetch_size):
                    for row in batch:
                        yield convert(row)
            except pymysql.MySQLError as exc:
                raise SourceError(
                    "mysql_read_failed",
                    f"Reading {self.label} failed mid-stream: {redact(str(exc))}",
                    ["Check the server and the network, then run the load again."],
                ) from exc
            stream.exhausted = True

        return extract_stream(columns, opener, source_label=self.label)
