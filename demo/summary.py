"""Prints what the demo copied: row counts on both sides, the schema change of the evolved
table (from the Dagster instance of ``DAGSTER_HOME``), and the backfill ledger's runs."""

from __future__ import annotations

from typing import cast

import dagster as dg
import psycopg

from demo.seed import choose

TABLES = [
    "shop.customers",
    "shop.orders",
    'shop."Order Items"',
    "events.page_views",
    "shop.stock",
]


def schema_changes(key: dg.AssetKey) -> str:
    """The ``dpone/schema_changes`` of ``key``'s latest materialization, one per line."""
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(key)
    materialization = event.asset_materialization if event else None
    changes = materialization.metadata.get("dpone/schema_changes") if materialization else None
    if changes is None:
        return f"{key.to_user_string()}: no schema change"
    return "\n".join(
        f"{key.to_user_string()} schema change: {c['kind']} {c['column']!r} {c['after']} "
        f"({c['detail']})"
        for c in cast("list[dict[str, str]]", changes.value)
    )


def main() -> None:
    """Prints one line per demo table and one for the ledger."""
    source, target = choose("source").dsn, choose("target").dsn
    with psycopg.connect(source) as src, psycopg.connect(target) as tgt:
        for table in TABLES:
            query = f"SELECT count(*) FROM {table}"  # noqa: S608 - fixed demo names
            in_source = src.execute(query).fetchone()
            in_target = tgt.execute(query).fetchone()
            print(
                f"{table:24} source {in_source[0] if in_source else 0:>7}"
                f"  target {in_target[0] if in_target else 0:>7}"
            )
        print(schema_changes(dg.AssetKey(["shop", "customers"])))
        runs = tgt.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded') "
            "FROM dpone_ledger.backfill_runs"
        ).fetchone()
        if runs:
            print(f"backfill ledger: {runs[0]} runs, {runs[1]} succeeded")


if __name__ == "__main__":
    main()
