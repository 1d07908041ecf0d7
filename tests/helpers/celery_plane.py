"""Dagster's distributed run plane in real processes: a daemon, a webserver and Celery workers.

Each process gets its own working directory and its own ``DAGSTER_HOME`` holding a copy of
``deploy/celery/dagster.yaml``: they share nothing but PostgreSQL (the instance storage) and
Redis (the Celery broker and result backend) over TCP, as on separate machines. The commands
are the ones ``deploy/celery/README.md`` documents. Redis is shared with other test runs on the
machine, so each plane claims a Redis database number of its own (:class:`RedisSpace`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from psycopg import conninfo

from tests.helpers import pg
from tests.helpers.dagster_server import LAUNCH_BACKFILL, ROOT, DagsterDev, free_port

DEPLOY = ROOT / "deploy" / "celery"
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("DPONE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
REDIS_HINT = (
    "Start Redis with `redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' "
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log` (or point "
    "DPONE_TEST_REDIS_URL at a server whose databases 1-15 the tests may use)."
)
CODE_LOCATION = ROOT / "tests" / "celery" / "defs.py"
_CLAIM = "dpone-test:redis-db:{}"
REEXECUTE = """
mutation($parentRunId: String!) {
  launchRunReexecution(reexecutionParams: {parentRunId: $parentRunId, strategy: FROM_FAILURE}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""


def instance_env(instance_dsn: str) -> dict[str, str]:
    """The ``DAGSTER_PG_*`` variables that point ``deploy/celery/dagster.yaml`` at a database."""
    params = conninfo.conninfo_to_dict(instance_dsn)
    return {
        "DAGSTER_PG_HOST": str(params.get("host") or "127.0.0.1"),
        "DAGSTER_PG_PORT": str(params.get("port") or "5432"),
        "DAGSTER_PG_USER": str(params.get("user") or "postgres"),
        "DAGSTER_PG_PASSWORD": str(params.get("password") or ""),
        "DAGSTER_PG_DB": str(params["dbname"]),
    }


def write_workspace(path: Path) -> Path:
    """A workspace serving ``tests/celery/defs.py`` by its absolute path (workers load it)."""
    path.write_text(
        "load_from:\n  - python_file:\n"
        f"      relative_path: {CODE_LOCATION}\n"
        f"      working_directory: {ROOT}\n      location_name: dpone_celery\n"
    )
    return path


def redis_problem(url: str = REDIS_URL) -> str | None:
    """None when Redis answers, else a message that says how to start it."""
    try:
        redis.Redis.from_url(url, socket_connect_timeout=5).ping()
    except redis.RedisError as exc:
        return f"Redis at {url} does not answer: {exc}\n{REDIS_HINT}"
    return None


class RedisSpace:
    """A Redis database number (1-15) claimed for one test, flushed before and after.

    Redis keys, queues and Celery's pub/sub channels (kombu names them ``/{db}.…``) are all
    scoped by the database number, so two planes on one server never see each other's tasks.
    The claim is a key in database 0 that expires on its own if a test dies without releasing.
    """

    def __init__(self, url: str = REDIS_URL, ttl: int = 1800) -> None:
        problem = redis_problem(url)
        if problem is not None:
            raise RuntimeError(problem)
        self._admin = redis.Redis.from_url(f"{url}/0")
        self._token = uuid.uuid4().hex
        for db in range(15, 0, -1):
            if self._admin.set(_CLAIM.format(db), self._token, nx=True, ex=ttl):
                self.db = db
                break
        else:
            raise RuntimeError("Redis databases 1-15 are all claimed by other test runs")
        self.url = f"{url}/{self.db}"
        self.client = redis.Redis.from_url(self.url, decode_responses=True)
        self.client.flushdb()

    def task_meta(self, task_id: str) -> dict[str, Any] | None:
        """Celery's result-backend record of a task (``status``; ``result`` holds its pid)."""
        raw = self.client.get(f"celery-task-meta-{task_id}")
        return None if raw is None else dict(json.loads(raw))

    def release(self) -> None:
        self.client.flushdb()
        if self._admin.get(_CLAIM.format(self.db)) == self._token.encode():
            self._admin.delete(_CLAIM.format(self.db))


class Webserver(DagsterDev):
    """``dagster-webserver`` on its own working directory and ``DAGSTER_HOME``.

    It inherits :class:`DagsterDev`'s GraphQL client (launch a partition backfill, read runs).
    """

    def __init__(self, home: Path, env: dict[str, str], workspace: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/graphql"
        self.process, self._log, self.log_path = start(
            home,
            env,
            [BIN / "dagster-webserver", "-w", workspace, "-h", "127.0.0.1", "-p", self.port],
        )

    def launch_backfill(
        self, asset_path: list[str], partitions: list[str], tags: dict[str, str] | None = None
    ) -> str:
        """Launches a partition backfill as the UI does, with run tags (``dagster/priority``)."""
        params = {
            "assetSelection": [{"path": asset_path}],
            "partitionNames": partitions,
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
        }
        result = self.graphql(LAUNCH_BACKFILL, params=params)["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"backfill not launched: {result}")
        return str(result["backfillId"])

    def reexecute_from_failure(self, run_id: str) -> str:
        """What a person does from the UI: re-execute a failed run from its failure."""
        result = self.graphql(REEXECUTE, parentRunId=run_id)["launchRunReexecution"]
        if result["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"re-execution not launched: {result}")
        return str(result["run"]["runId"])


def start(
    home: Path, env: dict[str, str], command: list[Any]
) -> tuple[subprocess.Popen[bytes], Any, Path]:
    """Starts ``command`` in ``home`` (its working directory and ``DAGSTER_HOME``) in a session
    of its own, logging to ``home/process.log``."""
    log_path = home / "process.log"
    log = log_path.open("w")
    full_env = {
        **os.environ,
        **env,
        "DAGSTER_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    process = subprocess.Popen(
        [str(c) for c in command],
        cwd=home,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return process, log, log_path


def stop_group(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM to the process's session, SIGKILL if it is still there after ``timeout``."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    except ProcessLookupError:
        pass


@dataclass
class Worker:
    """One ``dagster-celery worker start`` (a Celery main process and its pool process)."""

    name: str
    home: Path
    process: subprocess.Popen[bytes]
    log: Any

    @property
    def hostname(self) -> str:
        return f"{self.name}@{socket.gethostname()}"

    def log_text(self) -> str:
        self.log.flush()
        return (self.home / "process.log").read_text()[-4000:]


@dataclass
class CeleryPlane:
    """A daemon, a webserver and workers on ``deploy/celery``'s configuration.

    Args:
        root: An empty directory; each process gets a subdirectory as its home.
        env: What every process gets (instance storage, DSNs, the code location's settings).
        workspace: The workspace file the daemon and the webserver serve.
        redis_space: The Redis database the broker and the result backend use.
    """

    root: Path
    env: dict[str, str]
    workspace: Path
    redis_space: RedisSpace
    workers: list[Worker] = field(default_factory=list)
    daemon: subprocess.Popen[bytes] | None = None
    webserver: Webserver | None = None
    _logs: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.env = {
            **self.env,
            "DAGSTER_CELERY_BROKER_URL": self.redis_space.url,
            "DAGSTER_CELERY_BACKEND_URL": self.redis_space.url,
        }

    def home(self, name: str) -> Path:
        """A fresh home with its own copy of the instance configuration."""
        home = self.root / name
        home.mkdir(parents=True)
        shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
        return home

    def migrate(self) -> None:
        """Creates the instance's tables once, before the processes that would race to do it."""
        home = self.home("migrate")
        process, log, path = start(home, self.env, [BIN / "dagster", "instance", "migrate"])
        try:
            code = process.wait(300)
        finally:
            log.close()
        if code != 0:
            raise RuntimeError(f"dagster instance migrate failed:\n{path.read_text()[-4000:]}")

    def size_pool(self, pool: str, limit: int) -> None:
        """``dagster instance concurrency set``: the pool size, explicitly (docs/deployment.md)."""
        subprocess.run(
            [BIN / "dagster", "instance", "concurrency", "set", pool, str(limit)],
            env={**os.environ, **self.env, "DAGSTER_HOME": str(self.root / "migrate")},
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def start_daemon(self) -> None:
        process, log, _ = start(
            self.home("daemon"), self.env, [BIN / "dagster-daemon", "run", "-w", self.workspace]
        )
        self.daemon = process
        self._logs.append(log)

    def start_webserver(self, timeout: float = 180) -> Webserver:
        self.webserver = Webserver(self.home("webserver"), self.env, self.workspace)
        self.webserver.wait_ready(timeout)
        return self.webserver

    def start_worker(self, name: str, env: dict[str, str] | None = None) -> Worker:
        """``dagster-celery worker start`` with one pool process (one run at a time) that takes a
        run from Redis only when that process is free (``--disable-prefetch``)."""
        home = self.home(name)
        shutil.copy(DEPLOY / "celery.yaml", home / "celery.yaml")
        command = [
            BIN / "dagster-celery", "worker", "start", "-n", name, "-y", home / "celery.yaml",
            "-q", "dagster", "-A", "dagster_celery.app",
            "--", "--concurrency=1", "--disable-prefetch",
        ]  # fmt: skip
        process, log, _ = start(home, {**self.env, **(env or {})}, command)
        worker = Worker(name, home, process, log)
        self.workers.append(worker)
        return worker

    def wait_workers_ready(self, timeout: float = 180) -> None:
        """Waits until every worker answers a Celery ping through the broker."""
        from celery import Celery

        app = Celery(broker=self.redis_space.url, backend=self.redis_space.url)
        wanted = {w.hostname for w in self.workers}

        def answered() -> bool:
            for worker in self.workers:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"worker {worker.name} exited:\n{worker.log_text()}")
            replies = app.control.ping(timeout=1.0) or []
            return wanted <= {name for reply in replies for name in reply}

        try:
            pg.wait_until(answered, timeout=timeout, what="every Celery worker answers a ping",
                          interval=1.0)  # fmt: skip
        finally:
            app.close()

    def logs(self) -> str:
        """The tail of every process's log, for a failure message."""
        parts = []
        for home in sorted(self.root.iterdir()):
            path = home / "process.log"
            if path.exists():
                parts.append(f"--- {home.name}\n{path.read_text()[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for worker in self.workers:
            stop_group(worker.process)
            worker.log.close()
        if self.daemon is not None:
            stop_group(self.daemon)
        if self.webserver is not None:
            self.webserver.stop()
        for log in self._logs:
            log.close()
