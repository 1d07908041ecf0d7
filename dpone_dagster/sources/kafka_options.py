"""``KafkaCopyOptions``: a Kafka copy's options, one frozen object validated once.

:func:`~dpone_dagster.kafka_copy_asset`, :meth:`~dpone_dagster.KafkaSourceResource.copy_topic`,
its events and the engine (:class:`~.kafka_read.KafkaSource`, read by
:func:`~.kafka.copy_topic`) all take this object. What is not a choice of the copy (the
cluster's settings, the topic, the target table, the ledger's schema, the target session's
options, the progress hook) is the engine's own arguments.

Examples:
    >>> KafkaCopyOptions(sink="merge", max_messages_per_run=10_000).sink
    <Sink.MERGE: 'merge'>
    >>> try:
    ...     KafkaCopyOptions.parse({"sink": "replace"})
    ... except SourceError as exc:
    ...     print(exc.code)
    kafka_options_invalid
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, field_validator, model_validator

from dpone_dagster.core.options import JobOptions
from dpone_dagster.lifecycle import DponeError, Vocabulary
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.schema_change import SchemaChanges
from dpone_dagster.postgres.target_plan import Sink

from .kafka_client import kafka_error
from .kafka_messages import ValueFormat, value_columns
from .protocol import SourceError

__all__ = ["KafkaCopyOptions", "LostOffsets"]


class LostOffsets(
    Vocabulary, option="on_lost_offsets", refusal="kafka_options_invalid", error=SourceError
):
    """What a run does when the broker no longer holds the ledger's offset of a partition."""

    FAIL = "fail"
    """Stop with ``kafka_offsets_lost`` (the default): nothing is written."""
    EARLIEST = "earliest"
    """Restart the partition at the earliest offset the broker holds; the report names the gap."""


class KafkaCopyOptions(JobOptions):
    """How a Kafka topic becomes rows of its table; the defaults suit most topics.

    Raises:
        SourceError: ``kafka_options_invalid`` for a bad option (``replace``, a model with
            ``bytes``, a model field named like an envelope column, a budget below 1...);
            ``rest_type_unmappable`` for a model field no column type fits.
        CopyPlanError: ``copy_options_invalid`` for an unknown sink.
    """

    refusal: ClassVar[str] = "kafka_options_invalid"
    error: ClassVar[type[DponeError]] = SourceError

    value_format: ValueFormat = ValueFormat.JSON
    """``json`` (one ``value jsonb`` column, or :attr:`model`'s fields) or ``bytes`` (one
    ``value bytea`` column)."""
    sink: Sink = Sink.APPEND
    """``append`` (every message a row; key ``(kafka_partition, kafka_offset)``) or ``merge``
    (one row per ``kafka_key``, the latest; a tombstone deletes it)."""
    model: type[BaseModel] | None = None
    """A pydantic model every JSON value must fit; its fields become columns."""
    consumer_group: str | None = None
    """Where the committed offsets are published for monitoring (``dpone-<schema.table>`` by
    default); the ledger is the authority."""
    max_messages_per_run: int | None = None
    """At most this many messages per run (all partitions together)."""
    dead_letter_table: TableName | None = None
    """Messages that cannot be loaded go there with their reason (one table per stream: its key
    is the message's topic, partition and offset), instead of stopping the run with
    ``kafka_message_invalid`` / ``kafka_key_missing``."""
    on_lost_offsets: LostOffsets = LostOffsets.FAIL
    """``fail`` (``kafka_offsets_lost``) or ``earliest`` (restart a partition whose ledger
    offset the broker no longer holds at its earliest offset)."""
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    """``evolve`` or ``freeze`` (a model that gained a field)."""

    @classmethod
    def refused(cls, detail: str) -> DponeError:
        """The Kafka source's catalogued error of an invalid option."""
        return kafka_error(cls.refusal, detail)

    @property
    def keyed(self) -> bool:
        """Every message must have a key (the ``merge`` sink)."""
        return self.sink is Sink.MERGE

    @field_validator("sink", mode="after")
    @classmethod
    def _sink(cls, value: Sink) -> Sink:
        if value is Sink.REPLACE:
            raise kafka_error(
                cls.refusal,
                "A topic is a log: its table takes sink='append' or sink='merge', not replace.",
            )
        return value

    @field_validator("max_messages_per_run", mode="after")
    @classmethod
    def _budget(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise kafka_error(cls.refusal, "max_messages_per_run must be >= 1.")
        return value

    @field_validator("dead_letter_table", mode="before")
    @classmethod
    def _dead_letter_table(cls, value: Any) -> Any:
        return TableName.parse(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _model_fits(self) -> Self:
        value_columns(self.value_format, self.model)  # refuses a model the format cannot take
        return self
