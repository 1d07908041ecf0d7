"""The Kafka source: a topic into a PostgreSQL table, its offsets committed with the rows.

:func:`copy_topic` runs one bounded run of a stream (a topic -> a table):

1. the topic's partitions are read from the broker's metadata (an unknown topic, an unreachable
   broker, a refused login: each its own code, before the target is touched);
2. the load path (:func:`~dpone_dagster.sources.load_source`) begins the target transaction; the
   stream's advisory lock is taken and the ledger's next offset per partition read in it;
3. the read window opens (the receipt's ``acquire()``), the broker's low and high watermarks are
   asked per partition: the high watermark is the run's end. A partition the ledger does not know
   (new stream, or a partition added since) starts at its earliest offset; one whose ledger offset
   is outside ``[low, high]`` (deleted by retention, or a recreated topic) is
   ``kafka_offsets_lost``, or with ``on_lost_offsets="earliest"`` restarts at ``low``, the
   report naming what was lost;
4. every partition is read from its offset up to its end (or ``max_messages_per_run`` in all);
   each message becomes a row (:mod:`.kafka_messages`), or a dead letter, or stops the run with
   ``kafka_message_invalid`` / ``kafka_key_missing`` naming topic, partition and offset; the
   receipt completes after the last offset is consumed;
5. the rows go through staging and the sink (``append``, or ``merge`` on ``kafka_key`` with
   tombstones deleting), the new offsets (and dead letters) are written in the same transaction,
   and the target's COMMIT decides everything at once;
6. only then are the offsets published to the consumer group, for monitoring.

A broker that reports a high watermark behind the messages it holds (Tansu after a multi-record
batch) makes a run load less than is there: the next run reads the rest, none lost or loaded
twice. The receipt makes no snapshot claim (a topic has none): the orchestrator's clock,
``snapshot_authority`` and ``source_token`` empty; byte evidence is the keys' and values' sizes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from pydantic import BaseModel

from dpone_dagster.core import LedgerStore
from dpone_dagster.lifecycle import ExtractResult, TerminalOutcome, Vocabulary
from dpone_dagster.postgres import ConnectionOptions, TableName
from dpone_dagster.postgres.connection import Connection, connect
from dpone_dagster.postgres.load import begin_read_write
from dpone_dagster.postgres.plan import Sink
from dpone_dagster.postgres.schema_change import SchemaChanges

from .kafka_client import KafkaConsumerSession, KafkaSettings, kafka_error
from .kafka_messages import (
    APPEND_KEY,
    ENVELOPE,
    KEY_COLUMN,
    Envelope,
    MessageRefused,
    ValueFormat,
    headers_json,
    message_rows,
    message_timestamp,
    value_columns,
)
from .kafka_offsets import DeadLetter, read_offsets, settle_keys, write_dead_letters, write_offsets
from .load import SourceLoadReport, load_source
from .protocol import (
    ByteMeter,
    ProgressHook,
    Row,
    RowStreamArtifact,
    SourceColumn,
    SourceError,
)


class LostOffsets(
    Vocabulary, option="on_lost_offsets", refusal="kafka_options_invalid", error=SourceError
):
    """What a run does when the broker no longer holds the ledger's offset of a partition."""

    FAIL = "fail"
    """Stop with ``kafka_offsets_lost`` (the default): nothing is written."""
    EARLIEST = "earliest"
    """Restart the partition at the earliest offset the broker holds; the report names the gap."""


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
class _Run:
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


@dataclass(frozen=True)
class KafkaCopyReport:
    """What one run of a Kafka stream did.

    Attributes:
        load: The generic load's report (outcome, rows, the extraction receipt, sink).
        topic: The topic.
        stream_id: The stream's id in the ledger (``topic -> schema.table``).
        run: The stream's run number.
        partitions: Per partition: start, end, first and last offset read, messages.
        dead_letters: Messages written to the dead-letter table.
        tombstoned: Target rows a tombstone deleted (``merge``).
        group_commit_error: Why publishing the offsets to the consumer group failed (monitoring
            only: the ledger holds them), or None.
    """

    load: SourceLoadReport
    topic: str
    stream_id: str
    run: int
    partitions: tuple[PartitionRead, ...]
    dead_letters: int
    tombstoned: int
    group_commit_error: str | None

    @property
    def messages(self) -> int:
        """Messages read in all (rows and dead letters)."""
        return sum(p.messages for p in self.partitions)

    @property
    def lost(self) -> dict[int, tuple[int, int]]:
        """Per partition restarted by ``on_lost_offsets="earliest"``: ``(ledger offset, restart
        offset)``."""
        return {p.partition: p.lost for p in self.partitions if p.lost is not None}


class _KafkaArtifact(RowStreamArtifact):
    """The run's messages as a row stream; for ``merge``, keys are settled once staged."""

    merge_target: TableName | None = None
    run: _Run | None = None

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
        value_format: ``json`` or ``bytes``.
        model: The pydantic model every JSON value must fit (its fields become columns).
        keyed: Every message must have a key (the ``merge`` sink).
        consumer_group: The group the committed offsets are published to (monitoring).
        max_messages_per_run: Read at most this many messages per run (all partitions).
        dead_letter_table: Write messages that cannot be loaded here instead of stopping (one
            table per stream: its key is the message's topic, partition and offset).
        on_lost_offsets: ``fail`` or ``earliest`` (see :class:`LostOffsets`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        value_format: ValueFormat | str = ValueFormat.JSON,
        model: type[BaseModel] | None = None,
        keyed: bool = False,
        consumer_group: str = "dpone-dagster",
        max_messages_per_run: int | None = None,
        dead_letter_table: TableName | None = None,
        on_lost_offsets: LostOffsets | str = LostOffsets.FAIL,
    ) -> None:
        if not topic:
            raise kafka_error("kafka_options_invalid", "The topic is empty.")
        if max_messages_per_run is not None and max_messages_per_run < 1:
            raise kafka_error("kafka_options_invalid", "max_messages_per_run must be >= 1.")
        self.settings = settings
        self.topic = topic
        self.value_format = ValueFormat.parse(value_format)
        self.model = model
        self.keyed = keyed
        self.consumer_group = consumer_group
        self.max_messages = max_messages_per_run
        self.dead_letter_table = dead_letter_table
        self.on_lost = LostOffsets.parse(on_lost_offsets)
        self.columns: list[SourceColumn] = [*ENVELOPE, *value_columns(self.value_format, model)]
        self.run: _Run | None = None

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
        self.run = _Run(stream_id, self.topic, self.partitions(), self.on_lost)
        result: ExtractResult[RowStreamArtifact] = ExtractResult(
            _KafkaArtifact(self.columns, self._opener, source_label=self.label)
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

    def _bounds(self, session: KafkaConsumerSession, run: _Run) -> None:
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
        run: _Run,
        pending: dict[int, int],
        meter: ByteMeter,
    ) -> Iterator[Row]:
        to_row = message_rows(self.value_format, self.model, keyed=self.keyed)
        budget = self.max_messages
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
        run: _Run,
        pending: dict[int, int],
        batch: list[Message],
        to_row: Any,
    ) -> tuple[int, int, list[Row]]:
        """One consumed batch: (bytes, messages taken, rows). The hot path: one pass, locals."""
        rows: list[Row] = []
        size = taken = 0
        reads, keyed = run.reads, self.keyed
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
        self, run: _Run, envelope: Envelope, value: bytes | None, refused: MessageRefused
    ) -> None:
        where = f"topic {self.topic!r}, partition {envelope.partition}, offset {envelope.offset}"
        if self.dead_letter_table is None:
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


def kafka_sink(sink: Sink | str) -> Sink:
    """``sink`` parsed: ``append`` or ``merge``.

    Raises:
        CopyPlanError: ``copy_options_invalid`` for an unknown sink.
        SourceError: ``kafka_options_invalid`` for ``replace`` (a topic is a log).
    """
    chosen = Sink.parse(sink)
    if chosen is Sink.REPLACE:
        raise kafka_error(
            "kafka_options_invalid",
            "A topic is a log: its table takes sink='append' or sink='merge', not replace.",
        )
    return chosen


def stream_id_of(topic: str, target: TableName) -> str:
    """The ledger id of the stream ``topic -> target``."""
    return f"{topic} -> {target.qualified}"


def copy_topic(
    source: KafkaSource,
    target_dsn: str,
    target: TableName,
    *,
    sink: Sink | str = Sink.APPEND,
    ledger_schema: str | None = None,
    options: ConnectionOptions | None = None,
    schema_changes: SchemaChanges | str = SchemaChanges.EVOLVE,
    on_progress: ProgressHook | None = None,
) -> KafkaCopyReport:
    """Runs the stream ``source.topic -> target`` once (see the module).

    Args:
        source: The topic (its ``keyed`` must be True for ``merge``; :func:`kafka_source_for`
            sets it).
        target_dsn: The PostgreSQL target; the ledger lives in its database.
        target: The target table (created on the first run: primary key ``(kafka_partition,
            kafka_offset)`` for ``append``, ``kafka_key`` for ``merge``).
        sink: ``append`` or ``merge``.
        ledger_schema: The ledger's schema (``dpone_ledger`` when None).
        options: Options of the target session.
        schema_changes: ``evolve`` or ``freeze`` (a model that gained a field).
        on_progress: Called with the rows staged so far, every 10,000 rows.

    Returns:
        The run's report.

    Raises:
        SourceError: ``kafka_topic_unknown``, ``kafka_unreachable``,
            ``kafka_authentication_failed``, ``kafka_options_invalid`` (nothing read or written).
        SourceLoadError: the run failed and nothing was committed: ``kafka_message_invalid``,
            ``kafka_key_missing``, ``kafka_offsets_lost``, ``kafka_read_failed``, or the target's
            errors; ``.report`` says what became of the artifact.
    """
    chosen = kafka_sink(sink)
    if (chosen is Sink.MERGE) != source.keyed:
        raise kafka_error("kafka_options_invalid", "merge reads keyed messages (keyed=True).")
    store = LedgerStore() if ledger_schema is None else LedgerStore(ledger_schema)
    stream_id = stream_id_of(source.topic, target)
    artifact = source.extract(stream_id).artifact  # the broker's errors before the target's
    try:
        _ensure_ledger(target_dsn, options, store)
    except BaseException:
        artifact.settle(TerminalOutcome.ABORT)
        raise
    run = source.run
    assert run is not None
    assert isinstance(artifact, _KafkaArtifact)
    artifact.merge_target = target if chosen is Sink.MERGE else None

    def begin(conn: Connection) -> None:
        begin_read_write(conn)
        run.ledger, run.number = read_offsets(conn, store, stream_id)

    def before_commit(conn: Connection) -> None:
        offsets = {p: r.next_offset for p, r in run.reads.items()}
        write_offsets(conn, store, stream_id, source.topic, offsets, run.number)
        if source.dead_letter_table is not None:
            write_dead_letters(conn, source.dead_letter_table, run.dead_letters)

    report = load_source(
        _Prepared(source, artifact), target_dsn, target, sink=chosen,
        primary_key=(KEY_COLUMN,) if chosen is Sink.MERGE else APPEND_KEY, options=options,
        schema_changes=schema_changes, begin=begin, before_commit=before_commit,
        on_progress=on_progress,
    )  # fmt: skip
    return KafkaCopyReport(
        load=report,
        topic=source.topic,
        stream_id=stream_id,
        run=run.number,
        partitions=tuple(run.reads[p] for p in sorted(run.reads)),
        dead_letters=len(run.dead_letters),
        tombstoned=run.tombstoned,
        group_commit_error=None if run.session is None else run.session.group_commit_error,
    )


class _Prepared:
    """The source with its extraction already made (``load_source`` extracts once)."""

    def __init__(self, source: KafkaSource, artifact: RowStreamArtifact) -> None:
        self.source = source
        self.artifact = artifact

    @property
    def label(self) -> str:
        """The source's label."""
        return self.source.label

    def describe(self) -> list[SourceColumn]:
        """The source's columns."""
        return self.source.describe()

    def extract(self) -> ExtractResult[RowStreamArtifact]:
        """The prepared extraction."""
        return ExtractResult(self.artifact)


def _ensure_ledger(dsn: str, options: ConnectionOptions | None, store: LedgerStore) -> None:
    with connect(dsn, options, side="target", autocommit=True) as conn:
        store.ensure(conn)


def kafka_source_for(
    settings: KafkaSettings,
    topic: str,
    *,
    sink: Sink | str,
    value_format: ValueFormat | str = ValueFormat.JSON,
    model: type[BaseModel] | None = None,
    consumer_group: str | None = None,
    max_messages_per_run: int | None = None,
    dead_letter_table: TableName | None = None,
    on_lost_offsets: LostOffsets | str = LostOffsets.FAIL,
    target: TableName | None = None,
) -> KafkaSource:
    """The :class:`KafkaSource` for a copy with ``sink`` (``keyed`` for ``merge``; the group
    ``dpone-<schema.table>`` unless one is named)."""
    group = consumer_group or (
        f"dpone-{target.schema}.{target.name}" if target else "dpone-dagster"
    )
    return KafkaSource(
        settings, topic, value_format=value_format, model=model,
        keyed=kafka_sink(sink) is Sink.MERGE, consumer_group=group,
        max_messages_per_run=max_messages_per_run, dead_letter_table=dead_letter_table,
        on_lost_offsets=on_lost_offsets,
    )  # fmt: skip
