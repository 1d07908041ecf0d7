"""The TLS tests' fixtures: the TLS-only server this test session starts, and one without TLS."""

from tests.helpers.tls_server import plain_server, tls_server

__all__ = ["plain_server", "tls_server"]
