"""A Kafka topic's copy's keys: :class:`KafkaMetadataSet`."""

import dagster as dg

from .base import DponeSet


class KafkaMetadataSet(DponeSet):
    """A Kafka copy's own ``dpone/`` keys: the topic, its run's messages and offsets, its
    dead letters.
    """

    topic: str | None = None
    """The Kafka topic copied (kafka; spec of a Kafka copy)."""
    messages: int | None = None
    """Messages the run read: rows and dead letters (kafka)."""
    kafka_partitions: dg.JsonMetadataValue | None = None
    """Per partition: the offset the run started at, the end the broker reported, the first and
    last offset read, the next offset, the messages, whether it was new (kafka)."""
    dead_letters: int | None = None
    """Messages written to the dead-letter table instead of the target (kafka)."""
    dead_letter_table: str | None = None
    """Where messages that cannot be loaded go (kafka; spec of a Kafka copy, when set)."""
    offsets_lost: dg.JsonMetadataValue | None = None
    """Per partition restarted by ``on_lost_offsets="earliest"``: ``[ledger offset, restart
    offset]``, the broker no longer holding the first (kafka, only then)."""
    group_commit_error: str | None = None
    """Why publishing the offsets to the consumer group failed; monitoring only, the ledger
    holds them (kafka, only then)."""
