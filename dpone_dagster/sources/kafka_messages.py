"""Kafka messages as rows: the columns a topic's table has, and one message made one row.

Every row starts with the message's coordinates and envelope, in named columns:

===================  ===========  ===================================================
column               type         value
===================  ===========  ===================================================
``kafka_partition``  integer      the partition
``kafka_offset``     bigint       the offset (with the partition: the row's identity)
``kafka_timestamp``  timestamptz  the message timestamp (null when the broker has none)
``kafka_key``        text         the key as UTF-8 text (null: no key)
``kafka_headers``    jsonb        ``[{"key": ..., "value": ...}, ...]`` in order (null: none)
===================  ===========  ===================================================

then the value's columns, by ``value_format``: ``bytes`` is one ``value bytea``; ``json``
without a model is one ``value jsonb``; ``json`` with a pydantic model is the model's fields
(mapped by :func:`~dpone_dagster.sources.model_columns`, every one nullable: a tombstone, a
message whose value is null, has no value). A header value that is not UTF-8 is kept as
``{"key": ..., "base64": ...}``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from dpone_dagster.core.errors import ENGINE_ERRORS
from dpone_dagster.lifecycle import Vocabulary

from .protocol import Row, SourceColumn, SourceError
from .rest_schema import model_columns, row_builder


class ValueFormat(
    Vocabulary, option="value_format", refusal="kafka_options_invalid", error=SourceError
):
    """How a Kafka message's value becomes columns."""

    JSON = "json"
    """JSON: one ``value jsonb`` column, or a pydantic model's fields."""
    BYTES = "bytes"
    """The raw bytes: one ``value bytea`` column."""


ENVELOPE: tuple[SourceColumn, ...] = (
    SourceColumn("kafka_partition", "integer", "partition", nullable=False),
    SourceColumn("kafka_offset", "bigint", "offset", nullable=False),
    SourceColumn("kafka_timestamp", "timestamptz", "timestamp"),
    SourceColumn("kafka_key", "text", "key"),
    SourceColumn("kafka_headers", "jsonb", "headers"),
)
"""The columns every Kafka table starts with."""

KEY_COLUMN = "kafka_key"
"""The column the ``merge`` sink keys on."""

APPEND_KEY = ("kafka_partition", "kafka_offset")
"""The primary key of a table the ``append`` sink creates: a message lands once."""


def value_columns(value_format: ValueFormat, model: type[BaseModel] | None) -> list[SourceColumn]:
    """The value's columns (see the module's table).

    Raises:
        SourceError: ``kafka_options_invalid`` for a model with ``bytes``, or a field named like
            an envelope column; ``rest_type_unmappable`` for a field no column type fits.
    """
    if value_format is ValueFormat.BYTES:
        if model is not None:
            raise SourceError.from_catalog(
                ENGINE_ERRORS, "kafka_options_invalid", "A model reads JSON values, not bytes."
            )
        return [SourceColumn("value", "bytea", "bytes")]
    if model is None:
        return [SourceColumn("value", "jsonb", "json")]
    columns = [replace(c, nullable=True) for c in model_columns(model)]
    clash = sorted({c.name for c in columns} & {c.name for c in ENVELOPE})
    if clash:
        raise SourceError.from_catalog(
            ENGINE_ERRORS, "kafka_options_invalid",
            f"The model's field(s) {clash} collide with the envelope's columns.",
        )  # fmt: skip
    return columns


class MessageRefused(Exception):  # noqa: N818 - a refusal, not a crash
    """A message that cannot become a row: its code (``kafka_message_invalid`` or
    ``kafka_key_missing``) and the reason, without the value itself."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def message_timestamp(kind: int, millis: int) -> datetime | None:
    """A message's timestamp as an aware datetime (None when the broker sent none)."""
    # confluent_kafka.TIMESTAMP_NOT_AVAILABLE is 0; a broker without timestamps sends it.
    if kind == 0 or millis < 0:
        return None
    return datetime.fromtimestamp(millis / 1000, tz=UTC)


def headers_json(headers: Any) -> str | None:
    """The headers (pairs, or a mapping) as the ``jsonb`` text of ``kafka_headers`` (``None``
    without headers)."""
    if not headers:
        return None
    items: list[dict[str, str | None]] = []
    for name, raw in headers.items() if isinstance(headers, dict) else headers:
        value = raw.encode() if isinstance(raw, str) else raw
        if value is None:
            items.append({"key": name, "value": None})
            continue
        try:
            items.append({"key": name, "value": value.decode()})
        except UnicodeDecodeError:
            items.append({"key": name, "base64": base64.b64encode(value).decode()})
    return json.dumps(items)


class Envelope(NamedTuple):
    """What a message carries besides its value, as :class:`confluent_kafka.Message` gives it
    (a tuple: one is built per message)."""

    partition: int
    offset: int
    timestamp: tuple[int, int]
    key: bytes | None
    headers: Any
    """``[(name, value), ...]`` (librdkafka's list of pairs), or None."""


def _bytes_value(value: bytes) -> tuple[Any, ...]:
    return (value,)


def _json_value(value: bytes) -> tuple[Any, ...]:
    # pydantic-core's parser (4x the standard library's), without NaN and Infinity, which jsonb
    # refuses, as it refuses the NUL character.
    try:
        from_json(value, allow_inf_nan=False, cache_strings=False)
    except ValueError as exc:
        reason = f"the value is not JSON: {exc}"
        raise MessageRefused("kafka_message_invalid", reason) from None
    if b"\\u0000" in value:
        reason = "the value holds \\u0000, which jsonb cannot store"
        raise MessageRefused("kafka_message_invalid", reason)
    return (value.decode(),)


def _value_row(
    value_format: ValueFormat, model: type[BaseModel] | None
) -> Callable[[bytes], tuple[Any, ...]]:
    """The value's columns from its bytes (chosen once per run: it runs per message)."""
    if value_format is ValueFormat.BYTES:
        return _bytes_value
    if model is None:
        return _json_value
    build, validate, name = row_builder(model), model.model_validate_json, model.__name__

    def modelled(value: bytes) -> tuple[Any, ...]:
        try:
            return build(validate(value))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<value>'}: {e['msg']}"
                for e in exc.errors(include_input=False)[:3]
            )
            raise MessageRefused(
                "kafka_message_invalid", f"the value does not match {name}: {problems}"
            ) from None

    return modelled


def message_rows(
    value_format: ValueFormat, model: type[BaseModel] | None, *, keyed: bool
) -> Callable[[Envelope, bytes | None], Row]:
    """A function making one message one row, in the columns' order.

    Args:
        value_format: How the value becomes columns.
        model: The pydantic model of a JSON value, or None.
        keyed: Every message must have a key (the ``merge`` sink).

    The function raises :class:`MessageRefused` for a message that cannot be loaded: a missing
    key (``kafka_key_missing``), a key that is not UTF-8, a value that is not JSON or does not
    fit the model (``kafka_message_invalid``).
    """
    nulls = (None,) * len(value_columns(value_format, model))
    value_row = _value_row(value_format, model)

    def row(message: Envelope, value: bytes | None) -> Row:
        partition, offset, (kind, millis), raw_key, headers = message
        key: str | None = None
        if raw_key is not None:
            try:
                key = raw_key.decode()
            except UnicodeDecodeError:
                raise MessageRefused("kafka_message_invalid", "the key is not UTF-8") from None
        elif keyed:
            raise MessageRefused("kafka_key_missing", "the message has no key")
        values = nulls if value is None else value_row(value)
        # confluent_kafka.TIMESTAMP_NOT_AVAILABLE is 0; a broker without timestamps sends it.
        stamp = None if kind == 0 or millis < 0 else datetime.fromtimestamp(millis / 1000, UTC)
        return (partition, offset, stamp, key, headers and headers_json(headers), *values)

    return row
