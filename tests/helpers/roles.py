"""Login roles holding exactly the grants a test names, and nothing more: the databases' default
grants to ``PUBLIC`` (``CONNECT``, ``TEMPORARY``, ``USAGE`` on schema ``public``) are revoked
first, so a feature that needs one of them fails the test that forgot to list it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import conninfo, sql

from tests.helpers import pg


def _strip_public(dsn: str) -> None:
    dbname = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(dbname))
        )
        conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")


@contextmanager
def role_with(grants: dict[str, Sequence[str]]) -> Iterator[str]:
    """A new login role granted exactly ``grants`` (DSN -> statements with ``{role}`` for the
    role and ``{db}`` for that DSN's database); yields the role's name. On leaving, everything
    it owns in those databases is dropped, then the role."""
    role = f"dpone_role_{uuid.uuid4().hex[:10]}"
    admin = pg.server_admin(next(iter(grants)))
    pg.execute(admin, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        for dsn, statements in grants.items():
            _strip_public(dsn)
            dbname = str(conninfo.conninfo_to_dict(dsn)["dbname"])
            for statement in statements:
                pg.execute(
                    dsn,
                    sql.SQL(statement).format(role=sql.Identifier(role), db=sql.Identifier(dbname)),
                )
        yield role
    finally:
        for dsn in grants:
            pg.execute(dsn, sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        pg.execute(admin, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def as_role(dsn: str, role: str) -> str:
    """``dsn`` logging in as ``role`` (the test server trusts local logins)."""
    return conninfo.make_conninfo(dsn, user=role)
