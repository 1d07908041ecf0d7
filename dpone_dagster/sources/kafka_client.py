"""How the Kafka source reaches a broker: settings, the consumer, and the broker's failures as
stable codes.

The consumer is confluent-kafka's (librdkafka): partitions are assigned explicitly at the offsets
the ledger holds (no consumer-group rebalance, no automatic commit); the consumer group is used
only to publish the committed offsets for monitoring (``kafka-consumer-groups``, lag exporters)
after the target's COMMIT. librdkafka reports a refused login and an unreachable broker through
its error callback, which :class:`BrokerErrors` collects so that a failed metadata request can
say which it was. No message carries the password: librdkafka's texts do not hold it, and
:meth:`KafkaSettings.scrub` masks it anyway.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dpone_dagster.core.errors import ENGINE_ERRORS
from dpone_dagster.lifecycle import redact

from .protocol import SourceError

_LOG = logging.getLogger("dpone_dagster.kafka")


def kafka_error(code: str, detail: str, next_actions: list[str] | None = None) -> SourceError:
    """The Kafka source's error ``code`` from the one catalog, with ``detail`` appended."""
    return SourceError.from_catalog(ENGINE_ERRORS, code, detail, next_actions)


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach a Kafka cluster.

    Attributes:
        bootstrap_servers: ``host:port[,host:port...]``.
        security_protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
        sasl_mechanism: ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``... (SASL protocols).
        sasl_username: The SASL user.
        sasl_password: The SASL password (never printed).
        ssl_ca_location: A CA bundle to verify the brokers' certificates (TLS protocols).
        timeout: Seconds to wait for the broker's metadata, watermarks and messages.
        client_id: The client id the broker logs.
    """

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    timeout: float = 30.0
    client_id: str = "dpone-dagster"

    @property
    def label(self) -> str:
        """``kafka://servers``, for messages (no credential)."""
        return f"kafka://{self.bootstrap_servers}"

    def scrub(self, text: str) -> str:
        """``text`` without the password."""
        text = redact(text)
        if self.sasl_password:
            text = text.replace(self.sasl_password, "***")
        return text

    def config(self, group_id: str, errors: BrokerErrors) -> dict[str, Any]:
        """The consumer's librdkafka configuration."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": group_id,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # a missing offset is kafka_offsets_lost, never a skip
            "queued.max.messages.kbytes": 16384,  # prefetch bounded: memory flat at any volume
            "socket.timeout.ms": max(1000, int(self.timeout * 1000)),
            "error_cb": errors.add,
            "logger": _LOG,
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
        }
        config.update({k: v for k, v in optional.items() if v is not None})
        return config

    def consumer(self, group_id: str) -> KafkaConsumerSession:
        """A new consumer (no partition assigned yet).

        Raises:
            SourceError: ``kafka_options_invalid`` for a configuration librdkafka refuses.
        """
        errors = BrokerErrors()
        try:
            return KafkaConsumerSession(Consumer(self.config(group_id, errors)), errors, self)
        except KafkaException as exc:
            raise kafka_error("kafka_options_invalid", self.scrub(str(exc.args[0]))) from None


_AUTH = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})


class BrokerErrors:
    """The errors librdkafka reported through its callback, for the failure that follows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors: list[KafkaError] = []

    def add(self, error: KafkaError) -> None:
        """Keeps ``error`` (the last few only)."""
        with self._lock:
            self.errors = [*self.errors[-19:], error]

    def authentication(self) -> KafkaError | None:
        """The last login refusal reported, if any."""
        with self._lock:
            return next((e for e in reversed(self.errors) if e.code() in _AUTH), None)


class KafkaConsumerSession:
    """A live consumer. Implements :class:`~dpone_dagster.lifecycle.LiveSource`.

    ``success`` (the target committed) publishes the run's offsets to the consumer group, for
    monitoring only (a failure there is kept in :attr:`group_commit_error`, never raised: the
    ledger is the authority), then closes; ``abort`` and ``retain_commit_unknown`` close only.
    """

    def __init__(self, consumer: Consumer, errors: BrokerErrors, settings: KafkaSettings) -> None:
        self.consumer = consumer
        self.errors = errors
        self.settings = settings
        self.group_offsets: list[TopicPartition] = []
        self.group_commit_error: str | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once the consumer is closed."""
        return self._closed

    def failure(self, exc: KafkaException | KafkaError, doing: str) -> SourceError:
        """The stable error of a failed request: refused login, unreachable broker, or other."""
        error = exc.args[0] if isinstance(exc, KafkaException) else exc
        self.consumer.poll(0)  # serves the error callback
        refused = self.errors.authentication()
        label = self.settings.label
        if refused is not None:
            return kafka_error(
                "kafka_authentication_failed",
                f"{label} refused the login while {doing}: {self.settings.scrub(refused.str())}",
            )
        code = error.code() if isinstance(error, KafkaError) else None
        text = self.settings.scrub(error.str() if isinstance(error, KafkaError) else str(error))
        if code in _UNREACHABLE:
            return kafka_error("kafka_unreachable", f"{label} while {doing}: {text}")
        if code in _OUT_OF_RANGE:  # retention deleted the offset while the run read toward it
            return kafka_error("kafka_offsets_lost", f"{label} while {doing}: {text}")
        if code == KafkaError.UNKNOWN_TOPIC_OR_PART:  # the topic was deleted mid-run
            return kafka_error("kafka_topic_unknown", f"{label} while {doing}: {text}")
        return kafka_error("kafka_read_failed", f"{label} while {doing}: {text}")

    def commit_and_close(self) -> None:
        """Publishes the run's offsets to the consumer group (monitoring), then closes."""
        if self._closed:
            return
        try:
            if self.group_offsets:
                self.consumer.commit(offsets=self.group_offsets, asynchronous=False)
        except KafkaException as exc:
            self.group_commit_error = self.settings.scrub(str(exc.args[0]))
        finally:
            self.rollback_and_close()

    def rollback_and_close(self) -> None:
        """Closes the consumer (a Kafka read has nothing to roll back)."""
        if self._closed:
            return
        self._closed = True
        self.consumer.close()


_OUT_OF_RANGE = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})

_UNREACHABLE = frozenset(
    {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
     KafkaError._RESOLVE}
)  # fmt: skip
