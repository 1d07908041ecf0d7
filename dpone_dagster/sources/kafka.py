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

from dataclasses import dataclass

from dpone_dagster.core import LedgerStore
from dpone_dagster.lifecycle import ExtractResult, TerminalOutcome
from dpone_dagster.postgres import ConnectionOptions, TableName
from dpone_dagster.postgres.connection import Connection, connect
from dpone_dagster.postgres.load import begin_read_write
from dpone_dagster.postgres.target_plan import Sink

from .copy_options import SourceCopyOptions
from .kafka_messages import APPEND_KEY, KEY_COLUMN
from .kafka_offsets import read_offsets, write_dead_letters, write_offsets
from .kafka_read import KafkaArtifact, KafkaSource, PartitionRead
from .load import SourceLoadReport, load_source
from .protocol import ProgressHook, RowStreamArtifact, SourceColumn

__all__ = [
    "KafkaCopyReport",
    "KafkaSource",
    "PartitionRead",
    "copy_topic",
    "stream_id_of",
]


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


def stream_id_of(topic: str, target: TableName) -> str:
    """The ledger id of the stream ``topic -> target``."""
    return f"{topic} -> {target.qualified}"


def copy_topic(
    source: KafkaSource,
    target_dsn: str,
    target: TableName,
    *,
    ledger_schema: str | None = None,
    connection_options: ConnectionOptions | None = None,
    on_progress: ProgressHook | None = None,
) -> KafkaCopyReport:
    """Runs the stream ``source.topic -> target`` once (see the module), with the source's
    options (:class:`~.kafka_options.KafkaCopyOptions`: sink, schema changes, ...).

    Args:
        source: The topic and the copy's options.
        target_dsn: The PostgreSQL target; the ledger lives in its database.
        target: The target table (created on the first run: primary key ``(kafka_partition,
            kafka_offset)`` for ``append``, ``kafka_key`` for ``merge``).
        ledger_schema: The ledger's schema (``dpone_ledger`` when None).
        connection_options: Options of the target session.
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
    options = source.options
    chosen = options.sink
    store = LedgerStore() if ledger_schema is None else LedgerStore(ledger_schema)
    stream_id = stream_id_of(source.topic, target)
    artifact = source.extract(stream_id).artifact  # the broker's errors before the target's
    try:
        _ensure_ledger(target_dsn, connection_options, store)
    except BaseException:
        artifact.settle(TerminalOutcome.ABORT)
        raise
    run = source.run
    assert run is not None
    assert isinstance(artifact, KafkaArtifact)
    artifact.merge_target = target if chosen is Sink.MERGE else None

    def begin(conn: Connection) -> None:
        begin_read_write(conn)
        run.ledger, run.number = read_offsets(conn, store, stream_id)

    def before_commit(conn: Connection) -> None:
        offsets = {p: r.next_offset for p, r in run.reads.items()}
        write_offsets(conn, store, stream_id, source.topic, offsets, run.number)
        if options.dead_letter_table is not None:
            write_dead_letters(conn, options.dead_letter_table, run.dead_letters)

    load = SourceCopyOptions(
        sink=chosen, primary_key=(KEY_COLUMN,) if chosen is Sink.MERGE else APPEND_KEY,
        schema_changes=options.schema_changes,
    )  # fmt: skip
    report = load_source(
        _Prepared(source, artifact), target_dsn, target, options=load,
        connection_options=connection_options, begin=begin, before_commit=before_commit,
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
