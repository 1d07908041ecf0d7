"""A real HTTP JSON server on 127.0.0.1, run in a thread by the test that needs it.

The test gives a ``respond`` function that sees each request (path, query, attempt number) and
returns a :class:`Reply`, :data:`DROP` to close the socket without answering (a server that
dies mid-conversation), or :data:`HANG` to keep it open without answering until the server is
closed (a server that never answers: the client's timeout must fire).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float


@dataclass(frozen=True)
class Reply:
    """What to answer: a status, a JSON body (or raw bytes) and headers."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


DROP = object()
"""Answer nothing: close the connection."""

HANG = object()
"""Answer nothing and keep the connection open until the server is closed."""

Respond = Callable[[Request], "Reply | object"]


class ApiServer:
    """Serves ``respond``'s replies until closed; records every request.

    Args:
        respond: Builds the reply for a request.
    """

    def __init__(self, respond: Respond) -> None:
        self.requests: list[Request] = []
        self.bodies: list[tuple[int, bytes]] = []
        self._closed = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                split = urlsplit(self.path)
                request = Request(
                    split.path, dict(parse_qsl(split.query)), dict(self.headers), time.monotonic()
                )
                server.requests.append(request)
                reply = respond(request)
                if reply is HANG:
                    server._closed.wait()
                    self.close_connection = True
                    return
                if reply is DROP or not isinstance(reply, Reply):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                raw = (
                    reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                )
                server.bodies.append((reply.status, raw))
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), daemon=True, name="api"
        ).start()

    def close(self) -> None:
        """Stops serving (and ends the requests left hanging)."""
        self._closed.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
