"""Changes the demo source between two copies: ``shop.customers`` gains a column.

Run ``python -m demo.evolve`` after a first materialization of the ``shop`` assets: it adds the
column to the source, materializes ``shop/customers`` again (which adds the column to the target
in the same transaction as the data: ``schema_changes="evolve"``, the default) and prints the
change that materialization lists under ``dpone/schema_changes``, from the Dagster instance of
``DAGSTER_HOME``.
"""

from __future__ import annotations

import sys
from typing import cast

import dagster as dg
import psycopg

from demo.seed import choose
from demo.story import materialize, say

EVOLVE = """
ALTER TABLE shop.customers ADD COLUMN IF NOT EXISTS loyalty_tier text NOT NULL DEFAULT 'bronze';
UPDATE shop.customers SET loyalty_tier = 'gold' WHERE id % 10 = 0 AND loyalty_tier <> 'gold';
"""
CUSTOMERS = dg.AssetKey(["shop", "customers"])


def schema_changes(key: dg.AssetKey) -> str:
    """The ``dpone/schema_changes`` of ``key``'s latest materialization, on one line."""
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(key)
    materialization = event.asset_materialization if event else None
    changes = materialization.metadata.get("dpone/schema_changes") if materialization else None
    if changes is None:
        return "no schema change"
    return "; ".join(
        f"{c['kind']} {c['column']!r} {c['after']} ({c['detail']})"
        for c in cast("list[dict[str, str]]", changes.value)
    )


def main() -> int:
    """Adds ``loyalty_tier`` to the source's ``shop.customers`` and copies the table again."""
    with psycopg.connect(choose("source").dsn, autocommit=True) as conn:
        conn.execute(EVOLVE.encode())
    materialize("shop/customers")
    say(
        "schema change",
        f"source shop.customers gained loyalty_tier; the next copy: {schema_changes(CUSTOMERS)}",
        "the target follows the source, with the data, in one transaction",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
