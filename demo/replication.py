"""The replication demo: a group of three tables kept current from the source's WAL.

Run ``python -m demo.replication`` from the repository root after ``python -m demo.seed``. On
the logical source of ``demo/live.py`` it drops the demo's slot if a run left it, makes the
``live`` tables anew, and materializes the group of ``replication_definitions.py`` (the initial
copy under the slot's snapshot); then commits one transaction over two tables, one update that
leaves a TOASTed value unchanged and one delete, and materializes again. It prints what the
second run applied (from its materializations' metadata), the slot's lag, and whether the
TOASTed value equals the source's; then drops the slot and its publication
(:meth:`~dpone_dagster.PostgresSourceResource.drop_replication`): the demo never leaves a slot
retaining the source's WAL.
"""

from __future__ import annotations

import sys
from typing import Any

import dagster as dg
import psycopg

from demo import live
from demo.seed import choose
from demo.story import materialize, say
from dpone_dagster import PostgresSourceResource
from dpone_dagster.lifecycle import DponeError

WHERE = "replication_definitions.py"


def metadata(table: str) -> dict[str, Any]:
    """The values of the latest materialization of ``table``'s asset."""
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(table.split(".")))
    found = event.asset_materialization if event else None
    return {k: v.value for k, v in found.metadata.items()} if found else {}


def description(dsn: str) -> str:
    """Product 3's TOASTed description."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT description FROM live.products WHERE id = 3").fetchone()
    return str(found[0]) if found else ""


def main() -> int:
    """Runs the story and drops the slot at the end (also when a step fails)."""
    choice = live.logical_source()
    group = PostgresSourceResource(dsn=choice.dsn)
    live.ensure_database(choice)
    try:
        group.drop_replication(live.slot_name())  # a slot an interrupted run left
        with dg.DagsterInstance.get() as instance:  # the target they describe is made anew
            instance.wipe_assets([dg.AssetKey(t.split(".")) for t in live.TABLES])
        live.reset(choice)
        materialize("group:live", where=WHERE)
        live.change(choice.dsn)
        materialize("group:live", where=WHERE)
    except DponeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        group.drop_replication(live.slot_name())
    runs = {t: metadata(t) for t in live.TABLES}
    kinds = {k: sum(int(m.get(f"dpone/rows_{k}", 0)) for m in runs.values())
             for k in ("inserted", "updated", "deleted")}  # fmt: skip
    first = runs[live.TABLES[0]]
    lag_bytes = int(first.get("dpone/lag_bytes", -1))  # WAL written since: not the same each run
    lag = "under 1 MiB" if 0 <= lag_bytes < 2**20 else f"{lag_bytes:,} bytes"
    same = description(choice.dsn) == description(choose("target").dsn)
    where = "the embedded PostgreSQL" if choice.embedded else "the logical source"
    say(
        "replication",
        f"live.orders, order_lines, products from {where} (wal_level=logical): initial copy, "
        f"then {first.get('dpone/transactions')} source transactions applied (one over two "
        f"tables): {kinds['inserted']} inserted, {kinds['updated']} updated, {kinds['deleted']} "
        f"deleted; TOASTed description of product 3 {'equals' if same else 'DIFFERS FROM'} the "
        f"source's; slot lag {lag}; slot dropped",
        "whole transactions, exactly once; the lag is plotted in the UI",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
