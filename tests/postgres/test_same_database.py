"""``same_database``: two DSNs name one database when libpq would reach the same one.

The plain cases read the DSNs only (libpq's defaults: no host is the local socket, no port is
5432, no database is the user's name); the real-server cases check each verdict against where
the sessions actually land.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from psycopg import conninfo

from dpone_dagster.postgres.connection import ConnectionSettingsError, connect, same_database
from tests.helpers import pg

SAME = [
    ("postgresql://app@db/shop", "host=db dbname=shop"),
    ("postgresql://app:secret@db:5432/shop", "postgresql://admin:other@db/shop"),
    ("postgresql://db/shop?application_name=a&sslmode=require", "host=db dbname=shop"),
    ("postgresql://DB.example/shop", "host=db.example port=5432 dbname=shop"),
    ("host=db user=shop", "host=db dbname=shop user=other"),  # no dbname: the user's name
    ("user=app dbname=shop", "dbname=shop"),  # both on the local socket
    ("host=a,b port=5433,5434 dbname=shop", "postgresql://x@a:5433,b:5434/shop"),
    ("service=warehouse dbname=shop", "service=warehouse dbname=shop user=other"),
]
DIFFERENT = [
    ("postgresql://db/shop", "postgresql://db/shop_ledger"),
    ("postgresql://db/shop", "postgresql://db:5433/shop"),
    ("postgresql://db/shop", "postgresql://other/shop"),
    ("postgresql://db/Shop", "postgresql://db/shop"),  # database names are case-sensitive
    ("dbname=shop", "host=localhost dbname=shop"),  # the local socket is not localhost
    ("dbname=shop", "host=/var/run/postgresql dbname=shop"),  # nor a named socket directory
    ("host=/tmp/A dbname=shop", "host=/tmp/a dbname=shop"),  # a directory's case matters
    ("host=db user=shop", "host=db user=other"),  # no dbname: two users, two databases
    ("host=db hostaddr=10.0.0.1 dbname=shop", "host=db hostaddr=10.0.0.2 dbname=shop"),
    ("service=warehouse", "service=ledger"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_dsns_naming_one_database_are_the_same_whatever_else_they_say(a: str, b: str) -> None:
    assert same_database(a, b) and same_database(b, a)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_dsns_that_may_name_two_databases_are_not_the_same(a: str, b: str) -> None:
    assert not same_database(a, b) and not same_database(b, a)


def test_an_unparseable_dsn_is_refused_without_its_password() -> None:
    with pytest.raises(ConnectionSettingsError, match="dsn_invalid") as err:
        same_database("postgresql://u:hunter2@db:notaport/shop", "postgresql://db/shop")
    assert "hunter2" not in str(err.value)


def _lands_on(dsn: str) -> tuple[object, ...]:
    """The cluster and database a session opened with ``dsn`` is in."""
    with connect(dsn, side="ledger", autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT system_identifier FROM pg_control_system()), current_database()"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_each_verdict_matches_where_the_sessions_land(
    target_dsn: str, make_database: Callable[..., str]
) -> None:
    # key=value instead of a URI, with parameters that do not choose the database
    variants = [
        conninfo.make_conninfo(
            target_dsn,
            application_name="dpone-ledger",
            password="unused",
            connect_timeout=5,
            options="-c statement_timeout=0",
        )
    ]
    params = conninfo.conninfo_to_dict(target_dsn)
    if str(params.pop("port", None) or "5432") == "5432":
        variants.append(conninfo.make_conninfo("", **params))  # libpq's default port
    here = _lands_on(target_dsn)
    for variant in variants:
        assert same_database(variant, target_dsn), variant
        assert _lands_on(variant) == here, variant
    elsewhere = make_database("dpone_ledger", pg.server_admin(target_dsn))
    assert not same_database(elsewhere, target_dsn)
    cluster, database = _lands_on(elsewhere)
    assert cluster == here[0] and database != here[1]
