"""An instance whose PostgreSQL storage would hit the dagster-postgres ``NOTIFY`` failure under
psycopg 3 is refused when dpone's definitions load, with a stable code and the line to add; the
line it names makes the same instance work, against the real server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.lifecycle import DponeError
from tests.helpers import pg
from tests.helpers.dagster_server import postgres_instance_yaml as instance_yaml

DPONE_DEFINITIONS = """
import dagster as dg

from dpone_dagster import PostgresSourceResource, PostgresTargetResource, snapshot_copy_assets

shop = snapshot_copy_assets(["shop.orders"])
defs = dg.Definitions(
    assets=[shop],
    resources={
        "source": PostgresSourceResource(dsn=dg.EnvVar("DPONE_SOURCE_DSN")),
        "target": PostgresTargetResource(dsn=dg.EnvVar("DPONE_TARGET_DSN")),
    },
)
"""

PLAIN_DEFINITIONS = """
import dagster as dg


@dg.asset
def plain() -> None:
    pass


defs = dg.Definitions(assets=[plain])
"""


def materialize(home: Path, definitions: Path, select: str, env: dict[str, str]) -> str:
    """Runs ``dagster asset materialize``; returns its output, raising on success=False."""
    dagster = Path(sys.executable).parent / "dagster"
    done = subprocess.run(
        [str(dagster), "asset", "materialize", "-f", str(definitions), "--select", select],
        env={**os.environ, **env, "DAGSTER_HOME": str(home)},
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(output)
    return output


def test_a_psycopg3_instance_storage_is_refused_at_load_and_the_named_fix_works(
    make_database: Callable[[str], str], source_dsn: str, target_dsn: str, tmp_path: Path
) -> None:
    storage = make_database("dpone_instance")
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=200)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_yaml(storage, scheme=None))
    (tmp_path / "dpone_defs.py").write_text(DPONE_DEFINITIONS)
    (tmp_path / "plain_defs.py").write_text(PLAIN_DEFINITIONS)
    env = {"DPONE_SOURCE_DSN": source_dsn, "DPONE_TARGET_DSN": target_dsn}

    # The failure is real: without dpone, the first event write fails on NOTIFY.
    with pytest.raises(AssertionError) as plain:
        materialize(home, tmp_path / "plain_defs.py", "plain", env)
    assert "NOTIFY run_events" in str(plain.value)

    # With dpone, the definitions refuse to load, saying why and what to change.
    with pytest.raises(AssertionError) as refused:
        materialize(home, tmp_path / "dpone_defs.py", "shop/orders", env)
    assert "instance_storage_psycopg3" in str(refused.value)
    assert "scheme: postgresql+psycopg2" in str(refused.value)
    assert not pg.table_exists(target_dsn, "shop", "orders")
    runs = "SELECT count(*) FROM runs"
    assert pg.fetch_one(storage, runs) == 1, "only the plain asset's run was launched"

    # The line the error names makes the same instance work.
    (home / "dagster.yaml").write_text(instance_yaml(storage, scheme="postgresql+psycopg2"))
    materialize(home, tmp_path / "dpone_defs.py", "shop/orders", env)
    assert pg.table_fingerprint(source_dsn, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders"
    )
    assert pg.fetch_one(storage, "SELECT count(*) FROM runs WHERE status = 'SUCCESS'") == 1


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ("storage:\n  postgres:\n    postgres_url: postgresql://u@h/db\n", True),
        ("storage:\n  postgres:\n    postgres_url: postgresql+psycopg2://u@h/db\n", False),
        ("storage:\n  postgres:\n    postgres_url: {env: DPONE_T_URL}\n", True),
        # With a password: dagster-postgres before 0.29.N requires one, and refuses the rest.
        ("storage:\n  postgres:\n    postgres_db: {username: u, password: p, hostname: h,"
         " db_name: d, scheme: {env: DPONE_T_SCHEME}}\n", False),
        ("storage:\n  postgres:\n    postgres_db: {username: u, password: p, hostname: h,"
         " db_name: d, scheme: {env: DPONE_T_PLAIN}}\n", True),
        # A configuration Dagster itself refuses (no hostname) is left for Dagster to report.
        ("storage:\n  postgres:\n    postgres_db: {username: u, db_name: d}\n", False),
        ("event_log_storage:\n  module: dagster_postgres.event_log\n"
         "  class: PostgresEventLogStorage\n  config:\n    postgres_url: postgresql://u@h/d\n",
         True),
        ("storage:\n  sqlite:\n    base_dir: /tmp/x\n", False),
        ("", False),
    ],
)  # fmt: skip
def test_every_way_of_naming_the_storage_is_read(
    config: str, refused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_T_URL", "postgresql://u@h/db")
    monkeypatch.setenv("DPONE_T_SCHEME", "postgresql+psycopg2")
    monkeypatch.setenv("DPONE_T_PLAIN", "postgresql")
    (tmp_path / "dagster.yaml").write_text(config)
    if not refused:
        check_instance_storage(str(tmp_path))
        return
    with pytest.raises(DponeError) as raised:
        check_instance_storage(str(tmp_path))
    assert raised.value.code == "instance_storage_psycopg3"
    assert str(tmp_path / "dagster.yaml") in str(raised.value)
