"""The TLS tests' fixtures: the TLS-only server this test session starts."""

from tests.helpers.tls_server import tls_server

__all__ = ["tls_server"]
