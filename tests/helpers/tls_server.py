"""A TLS-only PostgreSQL 15 server that the tests start themselves, with a throwaway CA.

:func:`start_tls_server` makes two certificate authorities with ``openssl`` (the one that signs
the server's certificate, and a wrong one), a server certificate for ``localhost`` and
``127.0.0.1`` (its subjectAltName), runs ``initdb`` into a temporary folder as the ``postgres``
user when the tests run as root (``runuser``: PostgreSQL refuses to run as root; as another user,
as that user), turns ``ssl`` on and writes a
``pg_hba.conf`` of ``hostssl`` lines only, so that no session without TLS gets in, then starts
the server on a free port of 127.0.0.1. The :func:`tls_server` fixture does that once per test
session and stops the server and removes the folder at the end; :func:`plain_server` is the
same server without TLS.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from psycopg import conninfo

PG_BIN = Path(os.environ.get("DPONE_TEST_PG15_BIN", "/usr/lib/postgresql/15/bin"))
"""Where ``initdb``, ``pg_ctl`` and ``postgres`` of PostgreSQL 15 are."""

HOST_NAMES = ("localhost", "127.0.0.1")
"""The names the server's certificate is issued for (its subjectAltName)."""

START_HINT = (
    "The TLS tests (and the replication tests' PostgreSQL 15 source) start their own "
    "PostgreSQL 15 server: they need its binaries in "
    f"{PG_BIN} (apt-get install postgresql-15, or set DPONE_TEST_PG15_BIN), a `postgres` OS "
    "user, `runuser` and `openssl`."
)


@dataclass(frozen=True)
class TlsServer:
    """A running TLS-only server.

    Attributes:
        port: Its port on 127.0.0.1.
        ca_file: The CA certificate that signed the server's certificate.
        wrong_ca_file: Another CA's certificate, which did not.
        folder: The temporary folder of the data directory and the certificates.
    """

    port: int
    ca_file: Path
    wrong_ca_file: Path
    folder: Path

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """A DSN of ``dbname`` on this server as user ``postgres``, with libpq ``params``
        (``sslmode``, ``sslrootcert``, ``host``...); host 127.0.0.1 unless given."""
        base = {"host": "127.0.0.1", "port": str(self.port), "user": "postgres", "dbname": dbname}
        return conninfo.make_conninfo("", **{**base, **params})

    def verified(self, dbname: str = "postgres") -> str:
        """A ``verify-full`` DSN of ``dbname`` trusting the right CA."""
        return self.dsn(dbname, sslmode="verify-full", sslrootcert=str(self.ca_file))


def _run(*args: str | Path, cwd: Path | None = None) -> None:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} failed ({done.returncode}): {done.stderr.strip()}\n"
            f"{START_HINT}"
        )


def _as_postgres(*args: str | Path) -> None:
    """Runs a PostgreSQL program as ``postgres`` when the tests run as root (PostgreSQL refuses
    root), else as the tests' own user."""
    if os.geteuid() == 0:
        _run("runuser", "-u", "postgres", "--", *args)
    else:
        _run(*args)


def _own(*paths: Path) -> None:
    """Gives ``paths`` to the user the server runs as (``postgres`` under root)."""
    if os.geteuid() == 0:
        for path in paths:
            shutil.chown(path, "postgres")


def _make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    _run(
        "openssl", "req", "-x509", "-new", "-nodes", "-newkey", "ec",
        "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", cert,
        "-days", "2", "-subj", f"/CN=dpone test {name}",
    )  # fmt: skip
    return key, cert


def _make_server_certificate(folder: Path, ca_key: Path, ca_cert: Path) -> tuple[Path, Path]:
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.crt"
    _run(
        "openssl", "req", "-new", "-nodes", "-newkey", "ec",
        "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", csr,
        "-subj", f"/CN={HOST_NAMES[0]}",
    )  # fmt: skip
    alt_names = ",".join(
        f"IP:{name}" if name.replace(".", "").isdigit() else f"DNS:{name}" for name in HOST_NAMES
    )
    extensions = folder / "server.ext"
    extensions.write_text(f"subjectAltName={alt_names}\n")
    _run(
        "openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
        "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", extensions,
    )  # fmt: skip
    return key, cert


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_tls_server(*, tls: bool = True, settings: Mapping[str, str] | None = None) -> TlsServer:
    """Makes the certificates and starts a TLS-only server (see the module).

    Args:
        tls: False starts the same server without TLS (``ssl = off``, a ``host`` line), for a
            DSN that requires TLS from a server that has none.
        settings: More ``postgresql.conf`` settings (``wal_level = logical`` for a replication
            source of PostgreSQL 15).

    Raises:
        AssertionError: naming the step that failed and what the tests need.
    """
    if not (PG_BIN / "initdb").exists() or shutil.which("openssl") is None:
        raise AssertionError(START_HINT)
    folder = Path(tempfile.mkdtemp(prefix="dpone_tls_"))
    try:
        return _start(folder, tls=tls, settings=settings or {})
    except BaseException as exc:
        log = folder / "server.log"
        if log.exists():  # why the server did not start, before its folder goes
            exc.add_note(f"server log:\n{log.read_text()[-2000:]}")
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _start(folder: Path, *, tls: bool, settings: Mapping[str, str]) -> TlsServer:
    certs, data = folder / "certs", folder / "data"
    certs.mkdir()
    ca_key, ca_cert = _make_ca(certs, "ca")
    _, wrong_ca = _make_ca(certs, "wrong_ca")
    server_key, server_cert = _make_server_certificate(certs, ca_key, ca_cert)
    _own(folder, server_key, server_cert)
    folder.chmod(0o755)
    server_key.chmod(0o600)  # PostgreSQL refuses a key others can read
    _as_postgres(PG_BIN / "initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync")
    port = _free_port()
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{folder}'\nssl = {'on' if tls else 'off'}\n"
            f"ssl_cert_file = '{server_cert}'\nssl_key_file = '{server_key}'\n"
            "fsync = off\nmax_connections = 40\nshared_buffers = 16MB\n"
            + "".join(f"{name} = '{value}'\n" for name, value in settings.items())
        )
    # hostssl lines only: a session without TLS finds no entry and is refused.
    (data / "pg_hba.conf").write_text(
        f"{'hostssl' if tls else 'host'} all all 127.0.0.1/32 trust\n"
    )
    _as_postgres(PG_BIN / "pg_ctl", "-D", data, "-l", folder / "server.log", "-w", "start")
    return TlsServer(port=port, ca_file=ca_cert, wrong_ca_file=wrong_ca, folder=folder)


def stop_tls_server(server: TlsServer) -> None:
    """Stops the server and removes its folder."""
    try:
        _as_postgres(PG_BIN / "pg_ctl", "-D", server.folder / "data", "-m", "immediate", "stop")
    finally:
        shutil.rmtree(server.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def tls_server() -> Iterator[TlsServer]:
    """The TLS-only server of this test session (started once, stopped at the end)."""
    server = start_tls_server()
    try:
        yield server
    finally:
        stop_tls_server(server)


@pytest.fixture(scope="session")
def plain_server() -> Iterator[TlsServer]:
    """A server of this test session without TLS (started once, stopped at the end)."""
    server = start_tls_server(tls=False)
    try:
        yield server
    finally:
        stop_tls_server(server)
