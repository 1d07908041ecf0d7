"""A Kafka topic as a generic source (:class:`KafkaSource`): what one run of a stream reads.

The partitions come from the broker's metadata; once the load's transaction has read the
ledger's offsets, each partition's start is checked against the broker's watermarks (a lost
offset is ``kafka_offsets_lost``, or with ``on_lost_offsets="earliest"`` a restart the report
names) and its end is the high watermark at the run's start; the messages up to it become rows
(:mod:`.kafka_messages`) or dead letters. :func:`~dpone_dagster.sources.kafka.copy_topic` runs
it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from dpone_dagster.lifecycle import ExtractResult
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.connection import Connection

from .kafka_client import KafkaConsumerSession, KafkaSettings, kafka_error
from .kafka_messages import (
    ENVELOPE,
    Envelope,
    MessageRefused,
    headers_json,
    message_rows,
    message_timestamp,
    value_columns,
)
from .kafka_offsets import DeadLetter, settle_keys
from .kafka_options import KafkaCopyOptions, LostOffsets
from .protocol import ByteMeter, Row, RowStreamArtifact, SourceColumn


@dataclass
class PartitionRead:
    """What a run read of one partition (its receipt line).

    Attributes:
        partition: The partition.
        start_offset: The offset the run started at (the ledger's, or the earliest).
        end_offset: The high watermark the broker reported when the run began (exclusive).
        first_offset: The first offset read (None: nothing read).
        last_offset: The last offset read.
        messages: Messages read (rows and dead letters).
        lost: ``(ledger offset, restart offset)`` when the broker no longer held the ledger's
            offset and ``on_lost_offsets="earliest"`` restarted the partition at its earliest:
            below the restart, messages from the ledger offset on were lost (retention); a
            restart below the ledger offset means the topic was recreated. Else None.
        new: The ledger did not know the partition (a new stream, or a partition added).
    """

    partition: int
    start_offset: int
    end_offset: int
    first_offset: int | None = None
    last_offset: int | None = None
    messages: int = 0
    lost: tuple[int, int] | None = None
    new: bool = False

    @property
    def next_offset(self) -> int:
        """The offset the next run starts at."""
        return self.start_offset if self.last_offset is None else self.last_offset + 1

    def as_json(self) -> dict[str, Any]:
        """The line as JSON (for metadata)."""
        return {
            "partition": self.partition, "start_offset": self.start_offset,
            "end_offset": self.end_offset, "first_offset": self.first_offset,
            "last_offset": self.last_offset, "next_offset": self.next_offset,
            "messages": self.messages, "lost": None if self.lost is None else list(self.lost),
            "new": self.new,
        }  # fmt: skip


@dataclass
class KafkaRun:
    """One run's state, shared by the read (the artifact) and the load's transaction."""

    stream_id: str
    topic: str
    partitions: list[int]
    on_lost: LostOffsets
    ledger: dict[int, int] = field(default_factory=dict)
    number: int = 1
    reads: dict[int, PartitionRead] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    tombstones: list[tuple[str, int, int]] = field(default_factory=list)
    tombstoned: int = 0
    session: KafkaConsumerSession | None = None


class KafkaArtifact(RowStreamArtifact):
    """The run's messages as a row stream; for ``merge``, keys are settled once staged."""

    merge_target: TableName | None = None
    run: KafkaRun | None = None

    def load_into(self, conn: Connection, staging: TableName) -> int:
        """Stages the rows; for ``merge``, keeps the latest per key and applies tombstones."""
        copied = super().load_into(conn, staging)
        if self.merge_target is not None and self.run is not None:
            self.run.tombstoned = settle_keys(conn, staging, self.merge_target, self.run.tombstones)
        return copied


class KafkaSource:
    """A Kafka topic as a generic source: one row per message (see :mod:`.kafka_messages`).

    Args:
        settings: How to reach the cluster.
        topic: The topic.
        options: The copy's options (value format and model, sink, consumer group, budget,
            dead-letter table, what to do with lost offsets).
        target: The target table, which names the default consumer group
            (``dpone-<schema.table>``).

    Raises:
        SourceError: ``kafka_options_invalid`` for an empty topic.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        options: KafkaCopyOptions | None = None,
        *,
        target: TableName | None = None,
    ) -> None:
        if not topic:
            raise kafka_error("kafka_options_invalid", "The topic is empty.")
        self.settings = settings
        self.topic = topic
        self.options = options or KafkaCopyOptions()
        self.consumer_group = self.options.consumer_group or (
            f"dpone-{target.schema}.{target.name}" if target else "dpone-dagster"
        )
        self.columns: list[SourceColumn] = [
            *ENVELOPE,
            *value_columns(self.options.value_format, self.options.model),
        ]
        self.run: KafkaRun | None = None

    @property
    def label(self) -> str:
        """``kafka://servers/topic``."""
        return f"{self.settings.label}/{self.topic}"

    def describe(self) -> list[SourceColumn]:
        """The envelope's and the value's columns (known without the broker)."""
        return list(self.columns)

    def partitions(self) -> list[int]:
        """The topic's partitions, from the broker's metadata.

        Raises:
            SourceError: ``kafka_topic_unknown``, ``kafka_unreachable``,
                ``kafka_authentication_failed``.
        """
        session = self.settings.consumer(self.consumer_group)
        try:
            try:
                metadata = session.consumer.list_topics(self.topic, timeout=self.settings.timeout)
            except KafkaException as exc:
                raise session.failure(exc, f"asking for topic {self.topic!r}") from None
            topic = metadata.topics.get(self.topic)
            if topic is None or topic.error is not None:
                if topic is None or topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise kafka_error(
                        "kafka_topic_unknown", f"{self.settings.label} has no topic {self.topic!r}."
                    )
                raise session.failure(topic.error, f"asking for topic {self.topic!r}")
            return sorted(topic.partitions)
        finally:
            session.rollback_and_close()

    def extract(self, stream_id: str = "") -> ExtractResult[RowStreamArtifact]:
        """A pending read of the topic: its partitions now (from the broker's metadata), its
        offsets from the ledger when the load's transaction begins (:func:`copy_topic`)."""
        self.run = KafkaRun(stream_id, self.topic, self.partitions(), self.options.on_lost_offsets)
        result: ExtractResult[RowStreamArtifact] = ExtractResult(
            KafkaArtifact(self.columns, self._opener, source_label=self.label)
        )
        result.artifact.run = self.run  # type: ignore[attr-defined]
        return result

    def _opener(self, artifact: RowStreamArtifact, meter: ByteMeter) -> Iterator[Row]:
        run = self.run
        assert run is not None
        session = self.settings.consumer(self.consumer_group)
        artifact.attach_source(session)
        run.session = session
        self._bounds(session, run)
        pending = {r.partition: r.end_offset for r in run.reads.values()
                   if r.start_offset < r.end_offset}  # fmt: skip
        if pending:
            session.consumer.assign(
                [TopicPartition(self.topic, p, run.reads[p].start_offset) for p in pending]
            )
        yield from self._consume(session, run, pending, meter)
        session.group_offsets = [
            TopicPartition(self.topic, r.partition, r.next_offset) for r in run.reads.values()
        ]

    def _bounds(self, session: KafkaConsumerSession, run: KafkaRun) -> None:
        """Each partition's start (the ledger's offset, checked) and end (high watermark)."""
        lost: list[str] = []
        for p in run.partitions:
            try:
                low, high = session.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.settings.timeout, cached=False
                )
            except KafkaException as exc:
                raise session.failure(exc, f"asking for the offsets of partition {p}") from None
            start = run.ledger.get(p)
            read = PartitionRead(p, low if start is None else start, high, new=start is None)
            if start is not None and not low <= start <= high:
                held = f"offsets {low}..{high - 1}" if high > low else "no message"
                gone = (
                    f"restarting at the earliest offset skips offsets {start}..{low - 1}"
                    if start < low
                    else f"the topic was recreated: restarting reads its offsets from {low}"
                )
                lost.append(
                    f"partition {p}: the ledger resumes at {start}, the broker holds {held} "
                    f"({gone})"
                )
                if run.on_lost is LostOffsets.EARLIEST:
                    read = PartitionRead(p, low, high, lost=(start, low))
            run.reads[p] = read
        if lost and run.on_lost is LostOffsets.FAIL:
            raise kafka_error(
                "kafka_offsets_lost", f"Topic {self.topic!r}: " + "; ".join(lost) + "."
            )

    def _consume(
        self,
        session: KafkaConsumerSession,
        run: KafkaRun,
        pending: dict[int, int],
        meter: ByteMeter,
    ) -> Iterator[Row]:
        options = self.options
        to_row = message_rows(options.value_format, options.model, keyed=options.keyed)
        budget = options.max_messages_per_run
        idle_since = time.monotonic()
        while pending and (budget is None or budget > 0):
            batch = session.consumer.consume(min(budget or 10_000, 10_000), timeout=0.5)
            if not batch:
                if time.monotonic() - idle_since > self.settings.timeout:
                    raise session.failure(
                        KafkaError(KafkaError._TIMED_OUT, "no message arrived"),
                        f"reading partitions {sorted(pending)} up to {pending}",
                    )
                continue
            idle_since = time.monotonic()
            if budget is not None:
                batch = batch[:budget]  # librdkafka returns at most what was asked
            size, taken, rows = self._batch(session, run, pending, batch, to_row)
            meter.add(size)
            if budget is not None:
                budget -= taken
            yield from rows

    def _batch(
        self,
        session: KafkaConsumerSession,
        run: KafkaRun,
        pending: dict[int, int],
        batch: list[Message],
        to_row: Any,
    ) -> tuple[int, int, list[Row]]:
        """One consumed batch: (bytes, messages taken, rows). The hot path: one pass, locals."""
        rows: list[Row] = []
        size = taken = 0
        reads, keyed = run.reads, self.options.keyed
        for message in batch:
            p, offset = message.partition(), message.offset()
            end = pending.get(p) if p is not None else None
            if message.error() is not None or end is None or offset is None or offset >= end:
                self._edge(session, pending, message)
                continue
            read = reads[p]  # type: ignore[index]
            if read.first_offset is None:
                read.first_offset = offset
            read.last_offset = offset
            read.messages += 1
            taken += 1
            if offset + 1 >= end:
                self._done(session, pending, p)  # type: ignore[arg-type]
            key, value = message.key(), message.value()
            size += len(key or b"") + len(value or b"")
            envelope = Envelope(p, offset, message.timestamp(), key, message.headers())  # type: ignore[arg-type]
            try:
                row: Row = to_row(envelope, value)
            except MessageRefused as refused:
                self._refused(run, envelope, value, refused)
                continue
            if value is None and keyed and row[3] is not None:
                run.tombstones.append((str(row[3]), envelope.partition, offset))
            rows.append(row)
        return size, taken, rows

    def _edge(
        self, session: KafkaConsumerSession, pending: dict[int, int], message: Message
    ) -> None:
        """A message that is not a row: the end of a partition, one past the run's end (the
        next run's), or an error (raised with its code)."""
        p, error = message.partition(), message.error()
        if error is not None and error.code() != KafkaError._PARTITION_EOF:
            raise session.failure(error, f"reading partition {p}")
        if p is not None:
            self._done(session, pending, p)

    def _refused(
        self, run: KafkaRun, envelope: Envelope, value: bytes | None, refused: MessageRefused
    ) -> None:
        where = f"topic {self.topic!r}, partition {envelope.partition}, offset {envelope.offset}"
        if self.options.dead_letter_table is None:
            raise kafka_error(refused.code, f"The message at {where}: {refused.reason}.")
        run.dead_letters.append(
            DeadLetter(
                self.topic, envelope.partition, envelope.offset,
                message_timestamp(*envelope.timestamp), envelope.key, value,
                headers_json(envelope.headers), refused.code, refused.reason,
            )
        )  # fmt: skip

    def _done(self, session: KafkaConsumerSession, pending: dict[int, int], p: int) -> None:
        if pending.pop(p, None) is not None:
            session.consumer.pause([TopicPartition(self.topic, p)])
