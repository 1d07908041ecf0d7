"""The cross-server set runs where it says: with ``DPONE_TEST_TARGET_DSN`` set, every target
database lives on that other server (another cluster, and in CI another major version)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import pg

pytestmark = pytest.mark.cross_server


def _cluster(dsn: str) -> tuple[int, int]:
    """(system identifier, major version): which cluster answered."""
    row = pg.fetch_all(dsn, "SELECT system_identifier FROM pg_control_system()")[0]
    return int(row[0]), pg.server_version(dsn)  # type: ignore[call-overload]


def test_the_target_databases_live_on_the_server_the_run_names(
    source_dsn: str, target_dsn: str
) -> None:
    source, target = _cluster(source_dsn), _cluster(target_dsn)
    named = os.environ.get(pg.TARGET_ENV)
    if named is None:
        assert source == target, "without DPONE_TEST_TARGET_DSN both sides share one server"
    else:
        assert target == _cluster(named) and target[0] != source[0], "another cluster"
        print(f"source PostgreSQL {source[1]}, target PostgreSQL {target[1]}")
