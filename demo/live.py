"""The replication demo's source: three ``live`` tables on a server with ``wal_level = logical``.

A replication group reads the source's WAL through a logical slot, so its source must run with
``wal_level = logical``; the demo's own source may not (a local PostgreSQL defaults to
``replica``). :func:`logical_source` picks, in order: ``DPONE_DEMO_LOGICAL_DSN`` (used as it
is), else the demo source when its server is logical, else the database
``dpone_demo_source_<digest>`` of the embedded PostgreSQL of ``.dpone_pg/`` (always started with
``wal_level = logical``; created if missing). In that database the demo owns only the schema
``live`` (marked by its comment) and the slot ``dpone_demo_<digest>``: :func:`reset` drops and
makes them anew, and refuses a ``live`` schema the demo did not make.
"""

from __future__ import annotations

import os

import psycopg
from psycopg import conninfo, sql

from demo.seed import EMBEDDED_FOLDER, ROOT, choose
from dpone_dagster import embedded
from dpone_dagster.lifecycle import DponeError

LOGICAL_ENV = "DPONE_DEMO_LOGICAL_DSN"
"""The DSN of a database on a server with ``wal_level = logical``, for the replication step."""

MARK = "dpone demo: dropped and made anew by every run of demo/run"
"""The comment of the demo's ``live`` schema: a schema without it is not the demo's."""

TABLES = ["live.orders", "live.order_lines", "live.products"]
"""The replication group's tables (the same names in the target)."""

SCHEMA = """
CREATE SCHEMA live;
COMMENT ON SCHEMA live IS 'dpone demo: dropped and made anew by every run of demo/run';
CREATE TABLE live.products (
    id bigint PRIMARY KEY,
    sku varchar(32) NOT NULL,
    price numeric(10, 2) NOT NULL,
    description text NOT NULL
);
ALTER TABLE live.products ALTER COLUMN description SET STORAGE EXTERNAL;
CREATE TABLE live.orders (
    id bigint PRIMARY KEY,
    customer text NOT NULL,
    total numeric(12, 2) NOT NULL
);
CREATE TABLE live.order_lines (
    order_id bigint NOT NULL REFERENCES live.orders (id),
    line_no integer NOT NULL,
    product_id bigint NOT NULL REFERENCES live.products (id),
    qty integer NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
INSERT INTO live.products
SELECT g, 'SKU-' || g, 10 + g,
       (SELECT string_agg(md5(g || '-' || n), '') FROM generate_series(1, 400) AS n)
FROM generate_series(1, 10) AS g;
INSERT INTO live.orders SELECT g, 'customer ' || g, g * 3 FROM generate_series(1, 20) AS g;
INSERT INTO live.order_lines
SELECT o, l, 1 + (o + l) % 10, l FROM generate_series(1, 20) AS o, generate_series(1, 2) AS l;
"""
"""The group's tables (the schema's comment is :data:`MARK`): ``products.description`` is a
12,800-character value stored out of line (``STORAGE EXTERNAL``: TOASTed, uncompressed)."""

CHANGES = [
    # One transaction over two tables: an order and its two lines.
    "INSERT INTO live.orders VALUES (21, 'customer 21', 63);"
    "INSERT INTO live.order_lines VALUES (21, 1, 3, 1), (21, 2, 4, 2);",
    # An update that leaves the TOASTed description unchanged (pgoutput sends it as unchanged).
    "UPDATE live.products SET price = 99.50 WHERE id = 3;",
    "DELETE FROM live.order_lines WHERE order_id = 5 AND line_no = 2;",
]
"""The source transactions that arrive between the group's two runs, each committed alone."""


def _digest() -> str:
    home = os.environ.get("DAGSTER_HOME") or ROOT / ".dagster_home"
    return embedded.demo_database("source", home).rsplit("_", 1)[1]


def slot_name() -> str:
    """The demo's slot (and publication): ``dpone_demo_<digest of DAGSTER_HOME>``, so two
    demos on one server never share one."""
    return f"dpone_demo_{_digest()}"


def _wal_level(dsn: str) -> str:
    """The server's ``wal_level``, read in ``dsn``'s database or, when it is not made yet (the
    demo's, before its first run), in ``postgres``; ``""`` when neither answers."""
    for where in (dsn, conninfo.make_conninfo(dsn, dbname="postgres")):
        try:
            with psycopg.connect(where, connect_timeout=5) as conn:
                found = conn.execute("SHOW wal_level").fetchone()
            return str(found[0]) if found else ""
        except psycopg.OperationalError:
            continue
    return ""


def logical_source() -> embedded.ServerChoice:
    """The replication demo's source (see the module's order); the embedded server is started
    when it is the one, its database is not created here (:func:`reset` does)."""
    configured = os.environ.get(LOGICAL_ENV)
    if configured:
        return embedded.ServerChoice(configured)
    source = choose("source")
    if _wal_level(source.dsn) == "logical":
        return source
    server = embedded.start(EMBEDDED_FOLDER)
    home = os.environ.get("DAGSTER_HOME") or ROOT / ".dagster_home"
    return embedded.ServerChoice(server.dsn(embedded.demo_database("source", home)), server)


def ensure_database(choice: embedded.ServerChoice) -> None:
    """Creates the embedded server's demo database if missing (a configured one is the user's:
    never created nor dropped)."""
    if choice.embedded is None:
        return
    dsn = choice.dsn
    name = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    admin = conninfo.make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def reset(choice: embedded.ServerChoice) -> None:
    """Makes the demo's ``live`` schema anew on the logical source, filled (after the caller
    made the database, :func:`ensure_database`, and dropped the slot, whose publication names
    its tables).

    Raises:
        DponeError: ``plan_invalid`` when the server is not logical, or a ``live`` schema is
            there that the demo did not make (nothing dropped).
    """
    level = _wal_level(choice.dsn)
    if level != "logical":
        raise DponeError(
            "plan_invalid",
            f"{LOGICAL_ENV} names a server with wal_level = {level}.",
            [f"Point {LOGICAL_ENV} at a server with wal_level = logical, or unset it."],
        )
    with psycopg.connect(choice.dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT coalesce(obj_description(oid, 'pg_namespace'), '') FROM pg_namespace "
            "WHERE nspname = 'live'"
        ).fetchone()
        if found is not None and found[0] != MARK:
            raise DponeError(
                "plan_invalid",
                "The logical source holds a schema live that the demo did not make.",
                [f"Point {LOGICAL_ENV} at another database; the demo drops nothing of yours."],
            )
        conn.execute("DROP SCHEMA IF EXISTS live CASCADE")
        conn.execute(SCHEMA.encode())


def change(dsn: str) -> None:
    """Commits :data:`CHANGES` on the source, one transaction each."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in CHANGES:
            with conn.transaction():
                for part in filter(None, (s.strip() for s in statement.split(";"))):
                    conn.execute(part.encode())
