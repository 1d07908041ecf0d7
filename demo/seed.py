"""Creates and fills the demo source database, and makes sure the demo target exists.

Run ``python -m demo.seed`` from the repository root. The data is deterministic, so running it
again recreates the same source. The target database is created when missing and otherwise kept:
its ledger shows that a backfill already done is not done twice.

Environment:
    DPONE_SOURCE_DSN: the demo source (default: database ``dpone_demo_source`` on 127.0.0.1).
    DPONE_TARGET_DSN: the demo target (default: database ``dpone_demo_target`` on 127.0.0.1).
"""

from __future__ import annotations

import os
import sys

import psycopg
from psycopg import conninfo, sql

DEFAULT_SOURCE_DSN = "postgresql://postgres@127.0.0.1:5432/dpone_demo_source"
DEFAULT_TARGET_DSN = "postgresql://postgres@127.0.0.1:5432/dpone_demo_target"
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


def _admin(dsn: str) -> str:
    return conninfo.make_conninfo(dsn, dbname="postgres")


def _dbname(dsn: str) -> str:
    return str(conninfo.conninfo_to_dict(dsn).get("dbname"))


def seed(source_dsn: str, target_dsn: str, *, rows: int = EVENT_ROWS) -> None:
    """Recreates the demo source database and creates the target database if missing."""
    with psycopg.connect(_admin(source_dsn), autocommit=True) as admin:
        name = sql.Identifier(_dbname(source_dsn))
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    with psycopg.connect(_admin(target_dsn), autocommit=True) as admin:
        exists = admin.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (_dbname(target_dsn),)
        ).fetchone()
        if not exists:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_dbname(target_dsn))))
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA.replace("{rows}", str(int(rows))).encode())


def main() -> int:
    """Seeds the databases named by ``DPONE_SOURCE_DSN`` and ``DPONE_TARGET_DSN``."""
    source = os.environ.get("DPONE_SOURCE_DSN", DEFAULT_SOURCE_DSN)
    target = os.environ.get("DPONE_TARGET_DSN", DEFAULT_TARGET_DSN)
    seed(source, target)
    print(f"demo source {_dbname(source)} filled; demo target {_dbname(target)} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
