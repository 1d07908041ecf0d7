"""The Kafka tests' broker and producer: a real Tansu broker (``dpone_dagster.embedded_kafka``).

Tansu 0.6 refuses ``CreatePartitions`` and ``DeleteRecords``: a partition "added" to a topic, or
messages "deleted by retention", are made by deleting the topic and creating it again, which the
broker does support (see the tests that use them for what exactly each shows).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

Message = (
    tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Creates ``topic`` with ``partitions`` partitions."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(20)


def delete_topic(bootstrap: str, topic: str) -> None:
    """Deletes ``topic`` (every message and partition of it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(20)


def produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[Message],
    *,
    partition: int | None = None,
    one_batch: bool = False,
) -> int:
    """Produces ``(key, value[, headers])`` messages with an idempotent producer; the count.

    ``one_batch`` sends them as few large batches (linger) instead of one request each: Tansu
    then reports a high watermark of the last batch's base offset plus one.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 200 if one_batch else 0,
            "batch.num.messages": 100_000 if one_batch else 1,
        }
    )
    count = 0
    for message in messages:
        key, value = message[0], message[1]
        headers = message[2] if len(message) > 2 else None  # type: ignore[misc]
        kwargs = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if not one_batch:
            producer.flush(20)
    assert producer.flush(30) == 0, "the broker did not take every message"
    return count


def json_messages(start: int, stop: int, *, keys: int | None = None) -> list[Message]:
    """JSON messages ``{"id": i, "name": "n<i>"}``, keyed ``k<i>`` (or ``k<i % keys>``)."""
    return [
        (
            f"k{i if keys is None else i % keys}".encode(),
            json.dumps({"id": i, "name": f"n{i}"}).encode(),
        )
        for i in range(start, stop)
    ]


def spread(bootstrap: str, topic: str, messages: Sequence[Message], partitions: int) -> None:
    """Produces ``messages`` round-robin over ``partitions`` partitions, one request each."""
    for p in range(partitions):
        produce(bootstrap, topic, messages[p::partitions], partition=p)
