"""Changes the demo source between two runs: ``shop.customers`` gains a column.

Run ``python -m demo.evolve`` after a first materialization of the ``shop`` assets; the next one
adds the column to the target in the same transaction as the data (``schema_changes="evolve"``,
the default) and lists it under ``dpone/schema_changes``. Running it again changes nothing.
"""

from __future__ import annotations

import sys

import psycopg

from demo.seed import choose

EVOLVE = """
ALTER TABLE shop.customers ADD COLUMN IF NOT EXISTS loyalty_tier text NOT NULL DEFAULT 'bronze';
UPDATE shop.customers SET loyalty_tier = 'gold' WHERE id % 10 = 0 AND loyalty_tier <> 'gold';
"""


def main() -> int:
    """Adds ``loyalty_tier`` to the demo source's ``shop.customers``."""
    source = choose("source").dsn
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute(EVOLVE.encode())
    print("demo source: shop.customers gained the column loyalty_tier")
    return 0


if __name__ == "__main__":
    sys.exit(main())
