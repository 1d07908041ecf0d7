"""A real `dagster dev` (webserver and daemon) in a subprocess, driven through its GraphQL API.

This is how the UI launches work: a partition-range backfill goes to the backfill daemon, which
launches runs through the instance's run launcher. Tests use it to prove that path end to end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import pg

ROOT = Path(__file__).resolve().parents[2]

LAUNCH_BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
  }
}
"""

BACKFILL_STATUS = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      status
      runs { runId status tags { key value } }
    }
    ... on PythonError { message }
  }
}
"""

TERMINATE_RUN = """
mutation($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on TerminateRunSuccess { run { runId status } }
    ... on TerminateRunFailure { message }
    ... on PythonError { message }
  }
}
"""

RUN_STATUS = """
query($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { status tags { key value } } }
}
"""

RUNS = """
query {
  runsOrError {
    __typename
    ... on Runs { results { runId status jobName assetSelection { path } tags { key value } } }
    ... on PythonError { message }
  }
}
"""

DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def postgres_instance_yaml(storage_dsn: str, scheme: str | None = "postgresql+psycopg2") -> str:
    """The ``storage: postgres`` section of a ``dagster.yaml`` whose run, event log and schedule
    storage is the database of ``storage_dsn`` (its server and user as the DSN names them).
    ``scheme`` is left out when None (dagster-postgres then picks its default driver)."""
    params = psycopg.conninfo.conninfo_to_dict(storage_dsn)
    lines = [
        "storage:",
        "  postgres:",
        "    postgres_db:",
        f"      hostname: {params.get('host', '127.0.0.1')}",
        f"      port: {params.get('port', 5432)}",
        f"      username: {params.get('user', 'postgres')}",
        f"      password: '{params.get('password', '')}'",
        f"      db_name: {params['dbname']}",
    ]
    if scheme is not None:
        lines.append(f"      scheme: {scheme}")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DagsterDev:
    """`dagster dev -w <workspace>` with its own DAGSTER_HOME, stopped by :meth:`stop`.

    Args:
        dagster_home: An empty directory for the instance (a ``dagster.yaml`` may be in it).
        env: Extra environment (the DSNs the code location reads).
        workspace: The workspace file; the repository's ``workspace.yaml`` by default.
    """

    def __init__(
        self, dagster_home: Path, env: dict[str, str], workspace: Path = ROOT / "workspace.yaml"
    ) -> None:
        self.port = free_port()
        dagster = Path(sys.executable).parent / "dagster"
        self._start(
            [str(dagster), "dev", "-w", str(workspace), "-p", str(self.port), "-h", "127.0.0.1"],
            {**os.environ, **env, "DAGSTER_HOME": str(dagster_home)},
            cwd=ROOT,
            log_path=dagster_home / "dagster-dev.log",
        )

    @classmethod
    def from_command(cls, command: str, port: int, cwd: Path) -> DagsterDev:
        """Runs ``command`` as a user pastes it into a new shell in ``cwd``: with no
        ``DAGSTER_HOME`` and no ``DPONE_*`` variable of this process."""
        server = cls.__new__(cls)
        server.port = port
        env = {
            k: v
            for k, v in os.environ.items()
            if k != "DAGSTER_HOME" and not k.startswith("DPONE_")
        }
        server._start(["bash", "-c", command], env, cwd=cwd, log_path=cwd / "dagster-dev.log")
        return server

    def _start(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        self.log_path = log_path
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}/graphql"

    def wait_ready(self, timeout: float = 120) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"dagster dev exited:\n{self.log()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=2)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
            return True

        pg.wait_until(answers, timeout=timeout, what="dagster dev answers", interval=0.5)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-6000:]

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            response = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as error:
            raise RuntimeError(error.read().decode()[-4000:]) from error
        with response:
            payload: dict[str, Any] = json.load(response)
        if payload.get("errors"):
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        data: dict[str, Any] = payload["data"]
        return data

    def launch_backfill(self, asset_path: list[str], partitions: list[str]) -> str:
        params = {"assetSelection": [{"path": asset_path}], "partitionNames": partitions}
        result = self.graphql(LAUNCH_BACKFILL, params=params)["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"backfill not launched: {result}")
        return str(result["backfillId"])

    def backfill(self, backfill_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.graphql(BACKFILL_STATUS, id=backfill_id)[
            "partitionBackfillOrError"
        ]
        return result

    def wait_backfill(self, backfill_id: str, timeout: float = 240) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            state = self.backfill(backfill_id)
            return state if state.get("status") in DONE else None

        try:
            return pg.wait_until(
                done, timeout=timeout, what=f"backfill {backfill_id} ends", interval=1
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log()}") from None

    def runs(self) -> list[dict[str, Any]]:
        """Every run of the instance, newest first."""
        result: dict[str, Any] = self.graphql(RUNS)["runsOrError"]
        if result["__typename"] != "Runs":
            raise RuntimeError(f"runs not listed: {result}")
        runs: list[dict[str, Any]] = result["results"]
        return runs

    def run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.graphql(RUN_STATUS, runId=run_id)["runOrError"]
        return result

    def terminate(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.graphql(TERMINATE_RUN, runId=run_id)["terminateRun"]
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._log.close()
