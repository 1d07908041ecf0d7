"""A real TCP proxy between a client and PostgreSQL, for faults the server cannot produce alone.

The proxy forwards bytes both ways. Tests can cut every live connection (a lost socket), or arm it
to forward a client's COMMIT to the server and then drop the client socket before the server's
reply arrives: the commit happens on the server, but the client never learns it (an ambiguous
commit acknowledgement).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from psycopg import conninfo

from tests.helpers import pg


def is_commit(chunk: bytes) -> bool:
    """True for a simple-protocol ``COMMIT`` query message (what psycopg's commit() sends).

    Only the statement ``COMMIT`` itself: ``BEGIN ISOLATION LEVEL READ COMMITTED`` is not one.
    """
    if not chunk.startswith(b"Q"):
        return False
    query = chunk[5:].split(b"\0", 1)[0].strip().rstrip(b";").strip().upper()
    return query in (b"COMMIT", b"END", b"COMMIT TRANSACTION", b"COMMIT WORK")


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port``.

    Args:
        target_host: The server's host (default: the test server's, ``DPONE_TEST_PG_DSN``).
        target_port: The server's port (default: the test server's).
    """

    def __init__(self, target_host: str | None = None, target_port: int | None = None) -> None:
        if target_host is None or target_port is None:
            params = conninfo.conninfo_to_dict(pg.admin_dsn())
            target_host = str(params.get("host") or "127.0.0.1")
            target_port = int(params.get("port") or 5432)
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut_after: Callable[[bytes], bool] | None = None
        self.cut_events = 0
        self.refuse = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()

    @classmethod
    def to(cls, dsn: str) -> TcpProxy:
        """A proxy to the server ``dsn`` points at."""
        params = conninfo.conninfo_to_dict(dsn)
        return cls(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))

    def dsn(self, dsn: str) -> str:
        """``dsn`` routed through this proxy."""
        return conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def cut_after_client_message(self, predicate: Callable[[bytes], bool] = is_commit) -> None:
        """Arms the proxy: the next client chunk matching ``predicate`` is forwarded, then that
        client's connection is dropped before any reply reaches it."""
        with self._lock:
            self._cut_after = predicate

    def cut_all(self) -> None:
        """Drops every live connection at once (both sides)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server in pairs:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        """Stops accepting and drops every connection."""
        self._closed = True
        try:
            self._listener.close()
        finally:
            self.cut_all()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        close_both = True
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                cut = False
                if from_client:
                    with self._lock:
                        if self._cut_after is not None and self._cut_after(chunk):
                            self._cut_after = None
                            cut = True
                if cut:
                    # Stop relaying replies to this client first, then let the COMMIT reach
                    # the server, then drop the client without an answer.
                    self._detach_client(src)
                    dst.sendall(chunk)
                    self.cut_events += 1
                    # Leave the server side open: the server-to-client pump closes it once the
                    # server has answered (into a dead client), so the COMMIT surely ran.
                    close_both = False
                    return
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst) if close_both else ():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _detach_client(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        client.close()
