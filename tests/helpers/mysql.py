"""Real MariaDB/MySQL helpers for the tests: fresh databases, statements, live sessions."""

from __future__ import annotations

import dataclasses
import os
import uuid
from urllib.parse import unquote, urlsplit

from dpone_dagster.sources import MySQLSettings, quote_mysql_identifier

DEFAULT_DSN = "mysql://root@127.0.0.1:3306"
START_HINT = (
    "Start MariaDB locally with "
    "`start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` "
    "(or point DPONE_TEST_MYSQL_DSN at a server where this user may CREATE DATABASE, "
    "e.g. mysql://me:secret@db.example:3306)."
)


def admin_settings() -> MySQLSettings:
    """The server the tests use, from ``DPONE_TEST_MYSQL_DSN``."""
    url = urlsplit(os.environ.get("DPONE_TEST_MYSQL_DSN", DEFAULT_DSN))
    return MySQLSettings(
        host=url.hostname or "127.0.0.1",
        port=url.port or 3306,
        user=unquote(url.username or "root"),
        password=unquote(url.password or ""),
        connect_timeout=5,
        read_timeout=60,
    )


def server_problem() -> str | None:
    """None when the server answers, else a message that says how to start one."""
    settings = admin_settings()
    try:
        execute(settings, "SELECT 1")
    except Exception as exc:
        return f"MariaDB at {settings.host}:{settings.port} does not answer: {exc}\n{START_HINT}"
    return None


def execute(settings: MySQLSettings, *statements: str, args: tuple[object, ...] = ()) -> None:
    """Runs statements in one autocommit session (``args`` go to the last one)."""
    conn = settings.connect()
    try:
        conn.autocommit(True)
        with conn.cursor() as cursor:
            for i, statement in enumerate(statements):
                cursor.execute(statement, args if i == len(statements) - 1 and args else None)
    finally:
        conn.close()


def fetch_all(settings: MySQLSettings, query: str, args: tuple[object, ...] = ()) -> list[tuple]:
    """Runs one query and returns its rows."""
    conn = settings.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(query, args or None)
            return list(cursor.fetchall())
    finally:
        conn.close()


def create_database(prefix: str = "dpone_my") -> MySQLSettings:
    """Creates a fresh database and returns settings pointing at it."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    admin = admin_settings()
    execute(admin, f"CREATE DATABASE {quote_mysql_identifier(name)} CHARACTER SET utf8mb4")
    return dataclasses.replace(admin, database=name)


def drop_database(settings: MySQLSettings) -> None:
    """Drops a database made by :func:`create_database`."""
    execute(
        admin_settings(), f"DROP DATABASE IF EXISTS {quote_mysql_identifier(settings.database)}"
    )


def sessions(settings: MySQLSettings) -> list[tuple]:
    """Live sessions using ``settings.database`` (other than the one asking)."""
    return fetch_all(
        admin_settings(),
        "SELECT ID, DB, COMMAND FROM information_schema.PROCESSLIST"
        " WHERE DB = %s AND ID <> CONNECTION_ID()",
        (settings.database,),
    )
