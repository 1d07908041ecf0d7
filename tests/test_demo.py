"""The README's demo runs as written: seed, then the dagster CLI materializes the demo assets."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers import pg
from tests.helpers.dagster_server import DagsterDev, free_port

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_materializes_every_demo_asset_and_prints_how_to_see_its_runs(
    make_database: Any, tmp_path: Path
) -> None:
    source, target = make_database("dpone_demo_src"), make_database("dpone_demo_tgt")
    port = free_port()
    env = {
        **os.environ,
        "DPONE_SOURCE_DSN": source,
        "DPONE_TARGET_DSN": target,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "DPONE_DEMO_PORT": str(port),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "demo" / "run")], env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for schema, table in [("shop", "customers"), ("shop", "orders"), ("shop", "Order Items")]:
        assert pg.table_fingerprint(source, schema, table, None) == pg.table_fingerprint(
            target, schema, table, None
        )
    assert pg.table_fingerprint(source, "events", "page_views") == pg.table_fingerprint(
        target, "events", "page_views"
    )
    assert (
        pg.fetch_one(
            target, "SELECT count(*) FROM dpone_ledger.backfill_runs WHERE status = 'succeeded'"
        )
        == 31
    )
    assert "backfill ledger: 31 runs, 31 succeeded" in done.stdout
    # The evolution between two runs: the target took the new column with its data.
    assert (
        "shop/customers schema change: added 'loyalty_tier' text DEFAULT 'bronze'::text "
        "(NOT NULL, as in the source)" in done.stdout
    ), done.stdout
    assert pg.fetch_all(
        target, "SELECT loyalty_tier, count(*) FROM shop.customers GROUP BY 1 ORDER BY 1"
    ) == [("bronze", 1800), ("gold", 200)]
    # The incremental stream: one change, one delete and one late commit arrived.
    assert pg.table_fingerprint(source, "shop", "stock") == pg.table_fingerprint(
        target, "shop", "stock"
    )
    assert "change: id 7 has qty 999 in the target" in done.stdout
    assert "delete: id 13 is gone from the target" in done.stdout
    assert "late commit: id 21 committed now" in done.stdout and "below the mark" in done.stdout
    assert "late:   id 21 has qty 555 in the target" in done.stdout
    # The Kafka topic: 20 clicks, then 5 more, each message once; the bad one a dead letter.
    assert "events.clicks: 20 rows, 20 distinct messages; dead letters 1" in done.stdout
    assert "events.clicks: 25 rows, 25 distinct messages; dead letters 1" in done.stdout
    assert "ledger offsets: partition 0 -> 13, partition 1 -> 13" in done.stdout
    assert_the_printed_command_shows_the_runs(done.stdout, port, tmp_path)


def assert_the_printed_command_shows_the_runs(stdout: str, port: int, tmp_path: Path) -> None:
    """Starts the webserver with exactly the command the demo printed, from another directory
    and without the demo's environment, and asks its GraphQL API for the demo's runs."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Browse the runs"))
    assert f"http://127.0.0.1:{port}" in lines[header]
    command = lines[header + 1].strip()
    elsewhere = tmp_path / "new_shell"
    elsewhere.mkdir()
    server = DagsterDev.from_command(command, port, elsewhere)
    try:
        server.wait_ready()
        runs = server.runs()
    finally:
        server.stop()
    # The shop copy, the customers' copy after the evolution, the backfill's range in one run,
    # three runs of the incremental stock stream and two of the Kafka topic.
    assert len(runs) == 8, runs
    assert {r["status"] for r in runs} == {"SUCCESS"}
    selected = [{tuple(a["path"]) for a in r["assetSelection"]} for r in reversed(runs)]
    assert ("shop", "orders") in selected[0]
    assert selected[1:3] == [{("shop", "customers")}, {("events", "page_views")}]
    assert selected[3:6] == [{("shop", "stock")}] * 3
    assert selected[6:] == [{("events", "clicks")}] * 2
