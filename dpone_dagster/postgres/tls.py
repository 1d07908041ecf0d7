"""What a PostgreSQL server's TLS certificate says: the host names it is issued for, and who
issued it.

When a session cannot set up TLS (``<side>_tls_failed``), libpq says what failed but not what
the server presented. :func:`server_certificate` asks the server itself, the way libpq
starts TLS (PostgreSQL's ``SSLRequest``, then a TLS handshake), reads its certificate without
trusting it (it is only quoted in a message, never used to authenticate anything) and closes
the socket before any PostgreSQL message is sent: nothing logs in.
"""

from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)  # length, then the SSLRequest code (1234.5679)


@dataclass(frozen=True)
class ServerCertificate:
    """A server certificate's names, for messages.

    Attributes:
        host_names: Its subjectAltName DNS names and IP addresses (its subject's common name
            when it has none), which a ``verify-full`` DSN's host must match.
        issuer: Its issuer's distinguished name (the CA that ``sslrootcert`` must hold).
    """

    host_names: tuple[str, ...]
    issuer: str


def server_certificate(host: str, port: int, timeout: float) -> ServerCertificate | None:
    """The certificate the PostgreSQL server at ``host:port`` presents, or None when it has
    none (no TLS, not reachable, not PostgreSQL).

    Args:
        host: A host name or address to connect to (``hostaddr`` when the DSN has one).
        port: The server's port.
        timeout: Seconds for the connection and the handshake.
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # read, never trusted: the names go into a message
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.sendall(_SSL_REQUEST)
            if raw.recv(1) != b"S":
                return None
            with context.wrap_socket(raw, server_hostname=None) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return None
    if not der:
        return None
    return _names(der)


def _names(der: bytes) -> ServerCertificate:
    """The names of the DER certificate ``der``."""
    # Imported here: only a failed TLS setup reads a certificate, and every run worker would
    # otherwise pay the import.
    from cryptography import x509

    certificate: x509.Certificate = x509.load_der_x509_certificate(der)
    try:
        alt = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*alt.get_values_for_type(x509.DNSName)]
        names += [str(ip) for ip in alt.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = [
            str(a.value)
            for a in certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        ]
    return ServerCertificate(host_names=tuple(names), issuer=certificate.issuer.rfc4514_string())
