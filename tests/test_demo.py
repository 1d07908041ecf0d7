"""The README's demo runs as written and tells its story: one line per step, under 60 lines,
the same story on a second run (it resets what it changes), and database names per Dagster
home; the command it prints shows its runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from psycopg import conninfo

from dpone_dagster.embedded import demo_database
from tests.helpers import pg
from tests.helpers.dagster_server import DagsterDev, free_port
from tests.helpers.logical import drop_logical_database

ROOT = Path(__file__).resolve().parent.parent


STORY_LINES = 60
"""The demo tells its story in fewer lines than this, on any run."""


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", str(ROOT / "demo" / "run")], env=env, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def assert_a_story(done: subprocess.CompletedProcess[str]) -> None:
    """Under 60 lines, one per step; none of Dagster's debug lines or superseded-command
    warnings, on stdout or stderr."""
    lines = done.stdout.splitlines()
    assert len(lines) < STORY_LINES, done.stdout
    for noise in ("DEBUG", "SupersessionWarning", "BetaWarning", "Traceback"):
        assert noise not in done.stdout + done.stderr, (noise, done.stdout, done.stderr)
    steps = [line.split()[0] for line in lines if " -- " in line]
    assert steps == [
        "seed", "snapshot", "schema", "backfill", "stream", "stream", "open", "stream",
        "replication", "kafka", "kafka", "summary",
    ], lines  # fmt: skip


@pytest.mark.timeout(1200)  # two demos (with their replication step) and the webserver
def test_the_demo_materializes_every_demo_asset_and_prints_how_to_see_its_runs(
    make_database: Any, tmp_path: Path
) -> None:
    """Twice, each time the same story in under 60 lines (the README's guarantee rows name this
    test), then the printed command shows the runs."""
    source, target = make_database("dpone_demo_src"), make_database("dpone_demo_tgt")
    port = free_port()
    env = {
        **os.environ,
        "DPONE_SOURCE_DSN": source,
        "DPONE_TARGET_DSN": target,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "DPONE_DEMO_PORT": str(port),
    }
    logical = subprocess.run(
        [sys.executable, "-c", "from demo.live import logical_source as s; print(s().dsn)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        done = run_demo(env)
        assert_a_story(done)
        assert_the_story_happened(done.stdout, source, target)
        assert_the_group_replicated(done.stdout, logical, target, env)
        again = run_demo(env)  # the second run resets what the first changed: the same story
        assert_a_story(again)
        assert again.stdout == done.stdout
        assert_the_story_happened(again.stdout, source, target)
        assert_the_group_replicated(again.stdout, logical, target, env)
        assert_the_printed_command_shows_the_runs(again.stdout, port, tmp_path)
    finally:
        drop_logical_database(logical)  # the embedded server's demo database of this home


def test_two_demo_homes_name_two_pairs_of_databases(tmp_path: Path) -> None:
    """The default databases carry the Dagster home's digest: two demos never collide."""
    code = "from demo.seed import choose; print(choose('source').dsn); print(choose('target').dsn)"
    names = []
    for home in ("a", "b"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        env["DAGSTER_HOME"] = str(tmp_path / home)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        names.append([conninfo.conninfo_to_dict(dsn)["dbname"] for dsn in done.stdout.splitlines()])
    assert names[0] != names[1] and set(names[0]).isdisjoint(names[1]), names
    for pair in names:
        assert [n.rsplit("_", 1)[0] for n in pair] == ["dpone_demo_source", "dpone_demo_target"]


def assert_the_story_happened(stdout: str, source: str, target: str) -> None:
    """What the story says is what the databases hold."""
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
    assert "backfill ledger: 31 runs, 31 succeeded" in stdout
    # The evolution between two copies: the target took the new column with its data.
    assert (
        "the next copy: added 'loyalty_tier' text DEFAULT 'bronze'::text "
        "(NOT NULL, as in the source)" in stdout
    ), stdout
    assert pg.fetch_all(
        target, "SELECT loyalty_tier, count(*) FROM shop.customers GROUP BY 1 ORDER BY 1"
    ) == [("bronze", 1800), ("gold", 200)]
    # The incremental stream: one change, one delete and one late commit arrived.
    assert pg.table_fingerprint(source, "shop", "stock") == pg.table_fingerprint(
        target, "shop", "stock"
    )
    assert "change: id 7 has qty 999 in the target" in stdout
    assert "delete: id 13 is gone from the target" in stdout
    assert "late commit: id 21 committed below the mark" in stdout
    assert "late: id 21 has qty 555 in the target" in stdout
    # The Kafka topic: 20 clicks, then 5 more, each message once; the bad one a dead letter.
    assert "events.clicks: 20 rows, 20 distinct messages; dead letters 1" in stdout
    assert "events.clicks: 25 rows, 25 distinct messages; dead letters 1" in stdout
    assert "ledger offsets: partition 0 -> 13, partition 1 -> 13" in stdout
    assert "summary         every count is equal" in stdout


def assert_the_group_replicated(
    stdout: str, logical: str, target: str, env: dict[str, str]
) -> None:
    """The replication group equals its logical source, the story names what arrived, and the
    demo's slot is gone: no slot left retaining the source's WAL."""
    for table in ("orders", "order_lines", "products"):
        assert pg.table_fingerprint(logical, "live", table, None) == pg.table_fingerprint(
            target, "live", table, None
        )
    assert pg.fetch_one(logical, "SHOW wal_level") == "logical"
    assert (
        "then 3 source transactions applied (one over two tables): 3 inserted, 1 updated, "
        "1 deleted; TOASTed description of product 3 equals the source's; slot lag under 1 MiB"
        in stdout
    ), stdout
    home = env["DAGSTER_HOME"]
    slot = "dpone_demo_" + demo_database("source", home).rsplit("_", 1)[1]
    left = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s"
    assert pg.fetch_one(logical, left, (slot,)) == 0


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
    # Each demo: the shop copy, the customers' copy after the evolution, the backfill's range in
    # one run, three runs of the incremental stock stream, two of the replication group (its own
    # code location) and two of the Kafka topic.
    assert len(runs) == 20, runs
    runs = runs[:10]  # the second demo's
    assert {r["status"] for r in runs} == {"SUCCESS"}
    selected = [{tuple(a["path"]) for a in r["assetSelection"]} for r in reversed(runs)]
    assert ("shop", "orders") in selected[0]
    assert selected[1:3] == [{("shop", "customers")}, {("events", "page_views")}]
    assert selected[3:6] == [{("shop", "stock")}] * 3
    group = {("live", "orders"), ("live", "order_lines"), ("live", "products")}
    assert selected[6:8] == [group] * 2
    assert selected[8:] == [{("events", "clicks")}] * 2
