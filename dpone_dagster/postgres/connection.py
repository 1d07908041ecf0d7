"""Opening PostgreSQL sessions: DSN checks, connection options, transaction modes.

Every dpone session is opened here, by :func:`connect`, which names the side it serves
(``source``, ``target``, ``ledger``) so that a failure to open it is one stable code whatever
the entry point (:func:`session_error` classifies it, once): ``<side>_tls_failed`` when TLS
could not be set up (a certificate that does not verify against ``sslrootcert``, an absent CA
file, a host name the server's certificate is not issued for, a server that requires TLS the
DSN does not ask for, or the reverse), ``<side>_unreachable`` when no server answered,
``<side>_login_failed`` when the server answered and refused the session (a wrong password, an
unknown user or database, no ``pg_hba.conf`` entry). Every message names the server, never the
password.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

import psycopg
from psycopg import conninfo
from psycopg.rows import TupleRow

from dpone_dagster.lifecycle import DponeError, redact

from .tls import server_certificate

Connection: TypeAlias = psycopg.Connection[TupleRow]
"""A session as every dpone module types it: psycopg's default connection, whose rows are
tuples (:data:`psycopg.rows.TupleRow`)."""

Side = Literal["source", "target", "ledger"]
"""Which database a session serves, for the codes and messages of its failures."""


class ConnectionSettingsError(DponeError):
    """A DSN or connection option that cannot work."""


class SessionError(DponeError):
    """A session could not be opened (``<side>_tls_failed``, ``<side>_unreachable`` or
    ``<side>_login_failed``)."""


def check_dsn(dsn: str) -> dict[str, str]:
    """Parses a DSN (URI or ``key=value`` form) without connecting.

    Args:
        dsn: A libpq connection string.

    Returns:
        The DSN's parameters.

    Raises:
        ConnectionSettingsError: ``dsn_invalid`` when libpq cannot parse it. The message never
            repeats a password.
    """
    if not dsn or not dsn.strip():
        raise ConnectionSettingsError(
            "dsn_invalid",
            "The DSN is empty.",
            ["Set the DSN, e.g. postgresql://user@host:5432/dbname (EnvVar('DPONE_SOURCE_DSN'))."],
        )
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConnectionSettingsError(
            "dsn_invalid",
            f"The DSN {redact(dsn)!r} cannot be parsed: {redact(str(exc))}",
            ["Use a URI such as postgresql://user@host:5432/dbname or key=value pairs."],
        ) from None
    result = {k: str(v) for k, v in params.items() if v is not None}
    # libpq parses "port=" or "port=abc" and only fails when connecting: fail now instead.
    for port in result.get("port", "5432").split(","):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConnectionSettingsError(
                "dsn_invalid",
                f"The DSN {redact(dsn)!r} has port {port!r}; a port is a number from 1 to 65535.",
                ["Fix the port in the DSN, e.g. postgresql://user@host:5432/dbname."],
            )
    return result


def describe_dsn(dsn: str) -> str:
    """Returns ``host:port/dbname`` for messages: never the user's password; a DSN of several
    hosts names each with its port.

    Examples:
        >>> describe_dsn("postgresql://app:secret@db-a:5433,db-b/shop")
        'db-a:5433,db-b:5432/shop'
    """
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    hosts = str(params.get("host") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    where = ",".join(
        f"{h or 'localhost'}:{p or '5432'}" for h, p in zip(hosts, ports, strict=False)
    )
    return f"{where}/{params.get('dbname') or params.get('user') or ''}"


def same_database(dsn_a: str, dsn_b: str) -> bool:
    """True when two DSNs name one database on one server, whoever logs in.

    What libpq connects to is compared: the host (an unset host is the local socket; host
    names compare case-insensitively), ``hostaddr``, the port (5432 when unset), the database
    (the user name when unset) and the connection ``service``. The user, the password and every
    other parameter are ignored. Nothing is resolved: ``localhost`` and ``127.0.0.1``, or an
    unset host and an explicit socket directory, are two servers to this function, so it may
    answer False for one database, never True for two.

    Raises:
        ConnectionSettingsError: ``dsn_invalid`` for a DSN that cannot be parsed.

    Examples:
        >>> same_database("postgresql://app@DB/shop", "host=db port=5432 dbname=shop user=x")
        True
        >>> same_database("postgresql://db/shop", "postgresql://db/shop_ledger")
        False
    """
    return _database_address(dsn_a) == _database_address(dsn_b)


def _database_address(dsn: str) -> tuple[str | None, ...]:
    """The parameters that choose the server and the database, with libpq's defaults."""
    params = check_dsn(dsn)
    hosts = ",".join(
        h if h.startswith(("/", "@")) else h.lower()  # a socket directory's case matters
        for h in params.get("host", "").split(",")
    )
    return (
        hosts,
        params.get("hostaddr") or None,
        params.get("port") or "5432",
        params.get("dbname") or params.get("user") or None,
        params.get("service") or None,
    )


def with_database(dsn: str, dbname: str) -> str:
    """Returns ``dsn`` pointing at another database on the same server."""
    return conninfo.make_conninfo(dsn, dbname=dbname)


@dataclass(frozen=True)
class ConnectionOptions:
    """Options every dpone session is opened with.

    Attributes:
        application_name: Shown in ``pg_stat_activity``; makes dpone sessions easy to find.
        connect_timeout: Seconds to wait for the server to answer.
        statement_timeout_ms: Server-side statement timeout; 0 disables it.
        lock_wait: Seconds a statement that needs a strong lock on a table users read (the
            ``replace`` swap, schema evolution) keeps trying for it, in short attempts, before
            ``target_lock_timeout`` (:mod:`.lock_wait`); the session carries it as the setting
            ``dpone.lock_wait``.
        extra: Further libpq parameters.

    Raises:
        ConnectionSettingsError: ``connection_options_invalid`` for a ``lock_wait`` that is not
            a positive number of seconds.
    """

    application_name: str = "dpone-dagster"
    connect_timeout: int = 10
    statement_timeout_ms: int = 0
    lock_wait: float = 300.0
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wait = self.lock_wait
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 < wait < 1e9:
            raise ConnectionSettingsError(
                "connection_options_invalid",
                f"lock_wait must be a positive number of seconds, not {wait!r}.",
                ["Leave lock_wait unset for its default (300 seconds), or use e.g. 60."],
            )


LOCK_WAIT_SETTING = "dpone.lock_wait"
"""The session setting that carries :attr:`ConnectionOptions.lock_wait` (a custom option: the
server keeps it for the session and ignores it otherwise)."""


def connect(
    dsn: str,
    options: ConnectionOptions | None = None,
    *,
    side: Side,
    autocommit: bool = False,
    settings: Sequence[tuple[str, str]] = (),
) -> Connection:
    """Opens a session with dpone's options.

    Args:
        dsn: The server's DSN.
        options: Application name and timeouts.
        side: The database the session serves (names the failure's code).
        autocommit: Open in autocommit mode (no implicit transaction).
        settings: Settings the session starts with, in its startup packet (no round trip of
            their own): they win over the DSN's ``options``, the role's and the database's
            defaults.

    Raises:
        ConnectionSettingsError: ``dsn_invalid`` for a DSN that cannot be parsed.
        SessionError: ``<side>_tls_failed``, ``<side>_unreachable`` or ``<side>_login_failed``
            (message redacted).
    """
    params = check_dsn(dsn)
    options = options or ConnectionOptions()
    kwargs: dict[str, object] = {
        "application_name": options.application_name,
        "connect_timeout": options.connect_timeout,
        **options.extra,
    }
    # ISO dates on every session: receipts read the server clock as timestamps, and a text-format
    # relay must print dates the way the other side parses them, whatever the server's default.
    startup = ["-c DateStyle=ISO"]
    if params.get("options"):  # the DSN's own options are kept, after ours
        startup.append(params["options"])
    if options.statement_timeout_ms:
        startup.append(f"-c statement_timeout={int(options.statement_timeout_ms)}")
    startup.append(f"-c {LOCK_WAIT_SETTING}={float(options.lock_wait):g}")
    if "options" in options.extra:
        startup.append(options.extra["options"])
    startup += (f"-c {name}={_escaped(value)}" for name, value in settings)
    kwargs["options"] = " ".join(startup)
    try:
        return psycopg.connect(dsn, autocommit=autocommit, **kwargs)  # type: ignore[arg-type]
    except psycopg.OperationalError as exc:
        raise session_error(side, dsn, exc) from None


def _escaped(value: str) -> str:
    """A setting's value as the server splits the ``options`` startup parameter: a space or a
    backslash escaped by a backslash."""
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


# What libpq says when TLS could not be set up: the certificate did not verify (wrong CA), the CA
# file is missing or unreadable, the certificate is not issued for the host name, a client
# certificate or key is unusable, the server has no TLS (sslmode=require or stronger), or the
# server's pg_hba.conf has only hostssl lines and the client did not use TLS ("no encryption").
_TLS_FAILURE = re.compile(
    r"SSL error|root certificate file|server certificate for|certificate revocation list"
    r"|certificate file|private key file|does not support SSL|SSL was required"
    r"|no encryption|SSL connection is required",
    re.IGNORECASE,
)
_CERTIFICATE_NAMES = re.compile(
    r'server certificate for "(?P<names>[^"]*)"(?P<more> \(and \d+ other names?\))?'
    r' does not match host name "(?P<host>[^"]*)"'
)


SESSION_SIDES: Final[tuple[Side, ...]] = ("source", "target", "ledger")
"""Every side a session serves: each has the three session codes of :data:`SESSION_ERRORS`."""


def _session_codes() -> dict[str, tuple[str, tuple[str, ...]]]:
    codes: dict[str, tuple[str, tuple[str, ...]]] = {}
    for side in SESSION_SIDES:
        codes[f"{side}_tls_failed"] = (
            f"No TLS session could be set up with the {side} server.",
            (
                f"Set sslrootcert in the {side} DSN to the certificate file of the CA that "
                "issued the server's certificate.",
                "With sslmode=verify-full the DSN's host must be one of the host names the "
                "server's certificate is issued for.",
                "Then run again: nothing was read or written.",
            ),
        )
        codes[f"{side}_login_failed"] = (
            f"The {side} server refused the session.",
            (
                f"Check the user, password and database name of the {side} DSN "
                "(pass secrets with EnvVar).",
                "Check that the server's pg_hba.conf lets this user in from this host.",
            ),
        )
        codes[f"{side}_unreachable"] = (
            f"The {side} database could not be reached.",
            (
                f"Check that the {side} server is running and that the host and port of the "
                f"{side} DSN reach it.",
                "Then run again: nothing was read or written.",
            ),
        )
    return codes


SESSION_ERRORS: Final[dict[str, tuple[str, tuple[str, ...]]]] = _session_codes()
"""Every code of a session that could not be opened, per side, with its default message and
next actions: ``<side>_tls_failed``, ``<side>_login_failed``, ``<side>_unreachable``."""


def session_error(side: Side, dsn: str, exc: psycopg.Error) -> SessionError:
    """The stable error of a session that could not be opened: the one place that classifies it.

    libpq gives no SQLSTATE for a failed connection. A TLS failure is recognised by libpq's
    own words (see ``_TLS_FAILURE``) and checked first, because a server that refuses a
    session without TLS answers with a ``FATAL`` too; a server that answered and refused the
    session says so with a ``FATAL`` message (or asked for a password that was not given);
    anything else is a server that could not be reached. The message names the server
    (``host:port/dbname``) and quotes libpq, redacted.
    """
    reason = redact(str(exc)).strip()
    detail = f"Server {describe_dsn(dsn)}: {reason}"
    if _TLS_FAILURE.search(reason):
        actions = _tls_next_actions(side, dsn, reason)
        return SessionError.from_catalog(SESSION_ERRORS, f"{side}_tls_failed", detail, actions)
    refused = "FATAL" in reason or "password" in reason
    kind = "login_failed" if refused else "unreachable"
    return SessionError.from_catalog(SESSION_ERRORS, f"{side}_{kind}", detail)


def _tls_next_actions(side: Side, dsn: str, reason: str) -> list[str]:
    """The next actions of ``<side>_tls_failed``: the CA file (``sslrootcert``), the host names
    the server's certificate is issued for (read from the server, :func:`.tls.server_certificate`;
    else as libpq quoted them), and ``sslmode``."""
    params = conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "localhost").split(",")[0]
    port = str(params.get("port") or "5432").split(",")[0]
    address = str(params.get("hostaddr") or host).split(",")[0]
    rootcert = params.get("sslrootcert") or "unset: ~/.postgresql/root.crt"
    timeout = float(str(params.get("connect_timeout") or 5))
    certificate = (
        None if address.startswith("/") else server_certificate(address, int(port), timeout)
    )
    quoted = _CERTIFICATE_NAMES.search(reason)
    if certificate is not None:
        names = ", ".join(certificate.host_names) or "no host name"
        issued = f"{names} (issued by {certificate.issuer})"
    elif quoted:
        issued = f'"{quoted["names"]}"{quoted["more"] or ""}, as libpq read it'
    else:
        issued = "unknown: the server presented none (it has no TLS, or refused this session)"
    actions = [
        f"Set sslrootcert in the {side} DSN to the certificate file of the CA that issued the "
        f"server's certificate (now {rootcert}); the file must exist and be readable, or "
        "sslrootcert=system trusts the system's CAs.",
        f"With sslmode=verify-full the DSN's host ({host!r}) must be one of the host names the "
        f"server's certificate is issued for: {issued}.",
    ]
    sslmode = (
        f"Check sslmode in the {side} DSN: verify-full checks the CA and the host name, require "
        "encrypts without checking them, and both fail on a server without TLS; a server "
        "whose pg_hba.conf has only hostssl lines refuses sslmode=disable."
    )
    # Without a certificate, TLS itself is what the two sides disagree on: sslmode comes first.
    actions.insert(0 if certificate is None and not quoted else len(actions), sslmode)
    return [*actions, "Then run again: nothing was read or written."]


def set_transaction_mode(
    conn: Connection,
    isolation: psycopg.IsolationLevel,
    *,
    read_only: bool,
) -> None:
    """Sets how ``conn``'s next transaction begins: psycopg puts both in its ``BEGIN``.

    The session must be idle (no transaction open); the next statement begins the transaction.
    """
    conn.isolation_level = isolation
    conn.read_only = read_only


def server_encoding(conn: Connection) -> str:
    """The database's encoding, as the server reported it when the session started (no round
    trip; ``SHOW server_encoding`` where a server did not report it)."""
    reported = conn.info.parameter_status("server_encoding")
    if reported is not None:
        return reported
    row = conn.execute("SHOW server_encoding").fetchone()
    assert row is not None
    return str(row[0])
