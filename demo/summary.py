"""Prints what the demo copied: row counts on both sides and the backfill ledger's runs."""

from __future__ import annotations

import os

import psycopg

from demo.seed import DEFAULT_SOURCE_DSN, DEFAULT_TARGET_DSN

TABLES = [
    "shop.customers",
    "shop.orders",
    'shop."Order Items"',
    "events.page_views",
    "shop.stock",
]


def main() -> None:
    """Prints one line per demo table and one for the ledger."""
    source = os.environ.get("DPONE_SOURCE_DSN", DEFAULT_SOURCE_DSN)
    target = os.environ.get("DPONE_TARGET_DSN", DEFAULT_TARGET_DSN)
    with psycopg.connect(source) as src, psycopg.connect(target) as tgt:
        for table in TABLES:
            query = f"SELECT count(*) FROM {table}"  # noqa: S608 - fixed demo names
            in_source = src.execute(query).fetchone()
            in_target = tgt.execute(query).fetchone()
            print(
                f"{table:24} source {in_source[0] if in_source else 0:>7}"
                f"  target {in_target[0] if in_target else 0:>7}"
            )
        runs = tgt.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded') "
            "FROM dpone_ledger.backfill_runs"
        ).fetchone()
        if runs:
            print(f"backfill ledger: {runs[0]} runs, {runs[1]} succeeded")


if __name__ == "__main__":
    main()
