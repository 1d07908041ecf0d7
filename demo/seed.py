"""Creates and fills the demo source database, and creates the demo target empty.

Run ``python -m demo.seed`` from the repository root. The data is deterministic and both
databases are made anew, so every run of the demo tells the same story (the schema change
included). The demo assets' materializations are wiped from the Dagster instance of
``DAGSTER_HOME`` (its runs stay), as the target they describe is gone. It prints the two
databases' names, for a user to look at them.

Environment:
    DPONE_SOURCE_DSN: the demo source (default: database ``dpone_demo_source_<digest>``, the
        digest of the Dagster home's path, see :func:`dpone_dagster.embedded.demo_database`:
        two demos with two homes never share a database).
    DPONE_TARGET_DSN: the demo target (default: ``dpone_demo_target_<digest>``).
    DAGSTER_HOME: the demo's Dagster instance (default: ``.dagster_home/``).

The default databases live on the PostgreSQL at 127.0.0.1:5432 if one answers there, else on the
embedded PostgreSQL of ``.dpone_pg/`` (started here, and reused by ``dagster dev`` while it runs;
see ``dpone_dagster/embedded.py``). A DSN that is set and does not answer is an error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psycopg
from psycopg import conninfo, sql

from dpone_dagster import embedded
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import Side, connect

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_FOLDER = ROOT / ".dpone_pg"
EVENT_ROWS = 200_000

SCHEMA = """
CREATE SCHEMA shop;
CREATE SCHEMA events;
CREATE TABLE shop.customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    email text,
    country char(2) NOT NULL DEFAULT 'FR',
    created_at timestamptz NOT NULL
);
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES shop.customers (id),
    total numeric(12, 2) NOT NULL,
    placed_at timestamptz NOT NULL,
    note text
);
CREATE TABLE shop."Order Items" (
    order_id bigint NOT NULL REFERENCES shop.orders (id),
    line_no integer NOT NULL,
    sku varchar(32) NOT NULL,
    qty integer NOT NULL,
    price numeric(10, 2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE events.page_views (
    id bigint PRIMARY KEY,
    happened_at timestamptz NOT NULL,
    customer_id bigint,
    path text NOT NULL,
    payload jsonb
);
INSERT INTO shop.customers
SELECT g, 'Customer ' || g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'c' || g || '@example.com' END,
       (ARRAY['FR', 'DE', 'ES', 'IT'])[1 + g % 4],
       timestamptz '2025-01-01 00:00+00' + g * interval '37 minutes'
FROM generate_series(1, 2000) AS g;
INSERT INTO shop.orders
SELECT g, 1 + g % 2000, round((g * 7.31) % 900 + 10, 2),
       timestamptz '2025-02-01 00:00+00' + g * interval '11 minutes',
       CASE WHEN g % 5 = 0 THEN 'gift' END
FROM generate_series(1, 10000) AS g;
INSERT INTO shop."Order Items"
SELECT o, l, 'SKU-' || ((o * 31 + l) % 500), 1 + (o + l) % 4, round(((o * 13 + l) % 200) + 0.99, 2)
FROM generate_series(1, 10000) AS o, generate_series(1, 3) AS l;
INSERT INTO events.page_views
SELECT g, timestamptz '2026-01-01 00:00+00' + g * interval '13 seconds', 1 + g % 2000,
       '/products/' || (g % 500),
       jsonb_build_object('ref', CASE WHEN g % 3 = 0 THEN 'ads' ELSE 'direct' END, 'n', g)
FROM generate_series(1, {rows}) AS g;
CREATE INDEX ON events.page_views (happened_at);
COMMENT ON TABLE shop.customers IS 'One row per customer of the shop.';
COMMENT ON COLUMN shop.customers.email IS 'Contact address; NULL when the customer gave none.';
COMMENT ON TABLE events.page_views IS 'Every page a visitor opened, as the web server logged it.';
CREATE TABLE shop.stock (
    id bigint PRIMARY KEY,
    sku varchar(32) NOT NULL,
    qty integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO shop.stock (id, sku, qty)
SELECT g, 'SKU-' || g, (g * 17) % 90 FROM generate_series(1, 500) AS g;
CREATE INDEX ON shop.stock (updated_at);
ANALYZE;
"""


def choose(side: Side) -> embedded.ServerChoice:
    """The demo's ``side`` database: ``DPONE_<SIDE>_DSN``, else on the default or embedded one."""
    return embedded.choose_server(
        os.environ.get(f"DPONE_{side.upper()}_DSN"),
        embedded.demo_database(side, os.environ.get("DAGSTER_HOME") or ROOT / ".dagster_home"),
        folder=EMBEDDED_FOLDER,
        side=side,
    )


def _admin(dsn: str) -> str:
    return conninfo.make_conninfo(dsn, dbname="postgres")


def _dbname(dsn: str) -> str:
    return str(conninfo.conninfo_to_dict(dsn).get("dbname"))


def _recreate(dsn: str) -> None:
    with psycopg.connect(_admin(dsn), autocommit=True) as admin:
        name = sql.Identifier(_dbname(dsn))
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))


def seed(source_dsn: str, target_dsn: str, *, rows: int = EVENT_ROWS) -> None:
    """Recreates the demo source database, filled, and the target database, empty.

    Raises:
        SessionError: ``source_unreachable`` / ``target_unreachable`` (or ``..._login_failed``)
            naming the server that did not answer.
    """
    connect(_admin(source_dsn), side="source").close()  # a clear error, naming the server
    connect(_admin(target_dsn), side="target").close()
    _recreate(source_dsn)
    _recreate(target_dsn)
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA.replace("{rows}", str(int(rows))).encode())


def forget_materializations() -> None:
    """Wipes the demo assets' materializations from the Dagster instance of ``DAGSTER_HOME``
    (its runs stay): the target is made anew, and a backfill refuses to run over a ledger that
    no longer holds the checkpoints Dagster recorded (``backfill_ledger_mismatch``)."""
    import dagster as dg

    from definitions import defs

    with dg.DagsterInstance.get() as instance:
        instance.wipe_assets(list(defs.resolve_all_asset_keys()))


def main() -> int:
    """Seeds the databases named by ``DPONE_SOURCE_DSN`` and ``DPONE_TARGET_DSN`` and forgets the
    demo assets' materializations (:func:`forget_materializations`)."""
    try:
        source, target = choose("source"), choose("target")
        for note in {c.note() for c in (source, target) if c.embedded is not None}:
            print(note)
        seed(source.dsn, target.dsn)
        forget_materializations()
    except DponeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    where = conninfo.conninfo_to_dict(source.dsn)
    server = f"{where.get('host') or 'localhost'}:{where.get('port') or 5432}"
    print(
        f"{'seed':<15} source {_dbname(source.dsn)} filled, target {_dbname(target.dsn)} made "
        f"empty on {server} -- the same story on every run; psql -d <name> to look"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
