"""A pydantic model as a table: its fields as PostgreSQL columns, its instances as rows.

=========================================  ====================  =============================
field annotation                           PostgreSQL            staged value
=========================================  ====================  =============================
``bool``                                   boolean
``int``                                    bigint
``float``                                  double precision
``Decimal``                                numeric
``str``, ``Enum``, ``Literal["a", ...]``   text                  an enum's ``.value``
``datetime``                               timestamptz           a naive value is taken as UTC
``date`` / ``time`` / ``timedelta``        date / time / interval
``UUID``                                   uuid
``bytes``                                  bytea
``dict``, ``list``, ``tuple``, a model,    jsonb                 pydantic's JSON of the value
``Any``
=========================================  ====================  =============================

``X | None`` (``Optional[X]``) makes the column nullable. Any other union, or a type not in the
table, is refused with ``rest_type_unmappable`` before any request is sent.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from pydantic import BaseModel, TypeAdapter

from .protocol import Row, SourceColumn, SourceError

_SCALARS: list[tuple[type, str]] = [
    # bool before int: bool is a subclass of int. datetime before date, for the same reason.
    (bool, "boolean"),
    (int, "bigint"),
    (float, "double precision"),
    (Decimal, "numeric"),
    (enum.Enum, "text"),
    (str, "text"),
    (datetime, "timestamptz"),
    (date, "date"),
    (time, "time"),
    (timedelta, "interval"),
    (UUID, "uuid"),
    (bytes, "bytea"),
]
_JSON_ORIGINS = (dict, list, tuple, set, frozenset)


def _unmappable(model: type[BaseModel], name: str, annotation: object) -> SourceError:
    return SourceError(
        "rest_type_unmappable",
        f"Field {model.__name__}.{name} is annotated {annotation!r}, which has no PostgreSQL "
        "column type here; no request was sent.",
        [
            "Annotate it with one type (or one type | None): bool, int, float, Decimal, str, "
            "an Enum, datetime, date, time, timedelta, UUID, bytes, or dict/list/a model (jsonb).",
        ],
    )


def _pg_type(annotation: object) -> tuple[str, bool] | None:
    """``(pg_type, nullable)`` for an annotation, or None when it cannot be mapped."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            return None
        inner = _pg_type(members[0])
        return None if inner is None else (inner[0], True)
    if origin is typing.Annotated:
        return _pg_type(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        return ("text", False) if all(isinstance(v, str) for v in values) else None
    if annotation is Any or origin in _JSON_ORIGINS or annotation in _JSON_ORIGINS:
        return "jsonb", False
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "jsonb", False
        for base, pg_type in _SCALARS:
            if issubclass(annotation, base):
                return pg_type, False
    return None


def model_columns(model: type[BaseModel]) -> list[SourceColumn]:
    """The model's fields as columns, in declaration order.

    Raises:
        SourceError: ``rest_type_unmappable`` for a field no column type fits.

    Examples:
        >>> class Order(BaseModel):
        ...     id: int
        ...     note: str | None = None
        >>> [(c.name, c.pg_type, c.nullable) for c in model_columns(Order)]
        [('id', 'bigint', False), ('note', 'text', True)]
    """
    columns = []
    for name, field in model.model_fields.items():
        mapped = _pg_type(field.annotation)
        if mapped is None:
            raise _unmappable(model, name, field.annotation)
        pg_type, nullable = mapped
        columns.append(SourceColumn(name, pg_type, repr(field.annotation), nullable))
    return columns


def _naive_as_utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def row_builder(model: type[BaseModel]) -> Callable[[BaseModel], Row]:
    """Returns a function turning a validated instance into a staged row (column order)."""
    converters: list[tuple[str, Callable[[Any], object] | None]] = []
    for column in model_columns(model):
        annotation = model.model_fields[column.name].annotation
        convert: Callable[[Any], object] | None = None
        if column.pg_type == "jsonb":
            adapter: TypeAdapter[Any] = TypeAdapter(annotation or Any)
            convert = lambda v, a=adapter: a.dump_json(v).decode()  # noqa: E731
        elif column.pg_type == "timestamptz":
            convert = _naive_as_utc
        elif column.pg_type == "text":
            convert = lambda v: v.value if isinstance(v, enum.Enum) else v  # noqa: E731
        converters.append((column.name, convert))

    def build(record: BaseModel) -> Row:
        values = []
        for name, convert in converters:
            value = getattr(record, name)
            values.append(value if convert is None or value is None else convert(value))
        return tuple(values)

    return build
