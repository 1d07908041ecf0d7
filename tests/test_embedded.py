"""Any machine: the embedded PostgreSQL when nothing answers, and no fallback from a set DSN.

A machine without PostgreSQL is simulated by pointing the default address at a port where
nothing listens (``DPONE_DEFAULT_PG_ADDRESS``, which only these tests set).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpone_dagster import embedded
from tests.helpers import pg

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)
# The slice of the suite the fresh clone runs on its embedded server: the type round trip with
# every strategy, the backfill with its reconciliation, a lost COMMIT acknowledgement through a
# proxy, the snapshot copy's check and the digest.
SLICE = [
    "tests/postgres/test_type_round_trip.py",
    "tests/backfill/test_backfill.py",
    "tests/backfill/test_row_versions.py::test_direct_batches_carry_evidence_bound_into_the_checkpoint_chain",
    "tests/backfill/test_row_versions.py::test_source_writes_since_a_batch_fall_back_to_the_hash_and_are_found",
    "tests/postgres/test_commit_unknown.py",
    "tests/postgres/test_held_snapshot.py::test_every_strategy_reads_the_held_snapshot_and_reconciles_while_the_source_changes",
    "tests/reconcile",
]


def unused_port() -> int:
    """A port of 127.0.0.1 where nothing listens (bound, read, and released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> str:
    """The default address moved to a port where nothing answers; returns ``host:port``."""
    address = f"127.0.0.1:{unused_port()}"
    monkeypatch.setenv(embedded.DEFAULT_ADDRESS_ENV, address)
    return address


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A scratch folder outside pytest's ``tmp_path``: every pytest run resets that tree to mode
    0700, which would lock out the embedded server's own system user mid-test."""
    path = Path(tempfile.mkdtemp(prefix="dpone-embedded-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def folder(scratch: Path) -> Iterator[Path]:
    """A folder for an embedded cluster; its server is stopped when the test ends."""
    path = scratch / "pg"
    yield path
    if path.exists():
        embedded.stop(path)


def server_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def test_nothing_at_the_default_address_starts_one_embedded_server_that_later_runs_reuse(
    nowhere: str, folder: Path
) -> None:
    choice = embedded.choose_server(None, "postgres", folder=folder)
    assert choice.embedded is not None and choice.embedded.folder == folder.resolve()
    assert nowhere in choice.note() and str(choice.embedded.port) in choice.note()
    with psycopg.connect(choice.dsn, autocommit=True) as conn:
        assert conn.info.server_version // 10000 == 18
        started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        # A source logical replication can decode (the replication tests' and the demo's).
        settings = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            (list(embedded.LOGICAL_SETTINGS),),
        ).fetchall()
        assert dict(settings) == embedded.LOGICAL_SETTINGS
    # Another process (as `dagster dev` or a later demo run) finds the same running server.
    status = subprocess.run(
        [PYTHON, "-m", "dpone_dagster.embedded", "status", folder], capture_output=True,
        text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert status.stdout.strip() == choice.dsn
    again = embedded.choose_server(None, "dpone_demo_source", folder=folder)
    assert again.embedded == choice.embedded
    with psycopg.connect(again.embedded.dsn(), autocommit=True) as conn:  # type: ignore[union-attr]
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() == started
    pid_line = (folder / embedded.DATA / "postmaster.pid").read_text().splitlines()[0]
    if os.geteuid() == 0:  # PostgreSQL refuses root: the server runs as its own user
        assert server_uid(int(pid_line)) != 0
    assert embedded.stop(folder) and embedded.running(folder) is None
    assert not embedded.answers(choice.dsn)


def test_an_embedded_server_running_without_wal_level_logical_is_restarted_with_it(
    folder: Path,
) -> None:
    server = embedded.start(folder)
    embedded.stop(folder)
    # As a server started by a version before wal_level = logical was the embedded default.
    user = embedded.SYSTEM_USER if os.geteuid() == 0 else None
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={server.port} -c unix_socket_directories='' "
        "-c wal_level=replica"
    )
    log = str(folder / embedded.DATA / "server.log")
    embedded._run(embedded._commands().pg_ctl, folder, ["-w", "-o", options, "-l", log, "start"],
                  user)  # fmt: skip
    assert pg.fetch_one(server.dsn(), "SHOW wal_level") == "replica"
    again = embedded.start(folder)
    assert pg.fetch_one(again.dsn(), "SHOW wal_level") == "logical"


def test_a_server_at_the_default_address_is_used_and_nothing_is_started(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(pg.admin_dsn())
    monkeypatch.setenv(embedded.DEFAULT_ADDRESS_ENV, f"{params['host']}:{params['port']}")
    choice = embedded.choose_server(None, "postgres", folder=folder)
    assert choice.embedded is None and embedded.answers(choice.dsn)
    assert not folder.exists()


def test_a_configured_dsn_that_does_not_answer_is_an_error_naming_it_without_fallback(
    nowhere: str, folder: Path
) -> None:
    dead = f"127.0.0.1:{unused_port()}"
    configured = f"postgresql://postgres@{dead}/dpone_demo_source"
    choice = embedded.choose_server(configured, "dpone_demo_source", folder=folder)
    assert choice == embedded.ServerChoice(configured) and not folder.exists()

    env = {**os.environ, "DPONE_SOURCE_DSN": configured, "DPONE_TARGET_DSN": configured}
    env[embedded.DEFAULT_ADDRESS_ENV] = nowhere
    demo = subprocess.run(
        [PYTHON, "-m", "demo.seed"], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert demo.returncode == 1, demo.stdout + demo.stderr
    assert "[source_unreachable]" in demo.stderr and dead in demo.stderr
    assert "embedded" not in demo.stdout + demo.stderr

    env = {**os.environ, "DPONE_TEST_PG_DSN": f"postgresql://postgres@{dead}/postgres"}
    harness = subprocess.run(
        [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/lifecycle/test_receipt.py"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = harness.stdout + harness.stderr
    assert harness.returncode == 3, output
    assert f"PostgreSQL at {dead} does not answer" in output and "DPONE_TEST_PG_DSN" in output
    assert "embedded PostgreSQL at" not in output and " passed" not in output


def readme_command(marker: str) -> str:
    readme = (ROOT / "README.md").read_text()
    block = readme.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]
    return "\n".join(line for line in block.splitlines() if line and not line.startswith("```"))


def fresh_clone(into: Path) -> Path:
    """The working tree's files (tracked and not ignored) copied into ``into``: a new checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def run_shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=1200, check=False,
    )  # fmt: skip


# A new virtual environment, the demo and a slice of the suite: minutes, not pytest's 300 s.
@pytest.mark.timeout(1500)
def test_the_readmes_two_commands_work_in_a_fresh_clone_with_no_server_anywhere(
    nowhere: str, scratch: Path
) -> None:
    clone = fresh_clone(scratch / "clone")
    unset = {"DPONE_TEST_PG_DSN", "DPONE_TEST_TARGET_DSN", "DPONE_SOURCE_DSN", "DPONE_TARGET_DSN",
             "DAGSTER_HOME", "VIRTUAL_ENV", "PYTHONPATH"}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in unset}
    try:
        demo = run_shell(readme_command("demo-command"), clone, env)
        output = demo.stdout + demo.stderr
        assert demo.returncode == 0, output[-5000:]
        server = embedded.running(clone / ".dpone_pg")
        assert server is not None, "the demo left its embedded server running for dagster dev"
        assert f"no PostgreSQL answers at {nowhere}: using the embedded" in demo.stdout
        assert "backfill ledger: 31 runs, 31 succeeded" in demo.stdout
        # `dagster dev` loads definitions.py: it finds the demo's server, not another one.
        probe = "import definitions; print(definitions.defs.resources['target'].dsn)"
        loaded = run_shell(f'.venv/bin/python -c "{probe}"', clone, env)
        target = embedded.demo_database("target", clone / ".dagster_home")  # the demo's home
        assert loaded.stdout.strip() == server.dsn(target), loaded.stderr[-3000:]

        tests = run_shell(f"{readme_command('test-command')} {' '.join(SLICE)}", clone, env)
        output = tests.stdout + tests.stderr
        log = (clone / ".dpone_pg" / embedded.DATA / "server.log").read_text()[-3000:]
        assert tests.returncode == 0, output[-5000:] + log
        assert f"using the embedded PostgreSQL at 127.0.0.1:{server.port}" in output
        assert " passed" in output.splitlines()[-1] and "failed" not in output.splitlines()[-1]
    finally:
        if (clone / ".dpone_pg").exists():
            embedded.stop(clone / ".dpone_pg")
        shutil.rmtree(clone, ignore_errors=True)
