"""``SourceCopyOptions``: a generic source's copy options, one frozen object validated once.

:func:`~dpone_dagster.mysql_copy_asset`, :func:`~dpone_dagster.rest_copy_asset`, the resources'
``copy_table`` (:meth:`~dpone_dagster.MySQLSourceResource.copy_table`,
:meth:`~dpone_dagster.RestSourceResource.copy_table`), their events and the loader
(:func:`~.load.load_source`) all take this object: how the rows land in the target. What is
read is the source's own object beside it (:class:`~.mysql_read.MySQLRead`,
:class:`~.rest_read.RestRead`), as the topic is a Kafka copy's and the tables are a snapshot
copy's; the target table, the target session's options and the progress hook are the loader's
own arguments. :func:`build_source_copy` builds both from a factory's or a resource method's
arguments.

Examples:
    >>> SourceCopyOptions(sink="merge", primary_key=["id"]).primary_key
    ('id',)
    >>> try:
    ...     SourceCopyOptions.parse({"sink": "upsert"})
    ... except CopyPlanError as exc:
    ...     print(exc.code)
    copy_options_invalid
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import field_validator

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.lifecycle.options import ParsedOptions, build_options
from dpone_dagster.postgres.schema_change import SchemaChanges
from dpone_dagster.postgres.target_plan import CopyPlanError, Sink

__all__ = ["SourceCopyOptions", "build_source_copy"]


class SourceCopyOptions(ParsedOptions):
    """How a generic source's rows land in their PostgreSQL table; the defaults suit most.

    Each field takes its spelling as text too (``sink="merge"``), parsed here once.

    Raises:
        CopyPlanError: ``copy_options_invalid`` for an unknown sink or ``schema_changes``, a
            primary key that is not a list of distinct column names, or an unknown option
            (through :meth:`parse`; constructing it directly raises pydantic's
            ``ValidationError`` for the last two).
    """

    refusal: ClassVar[str] = "copy_options_invalid"
    error: ClassVar[type[DponeError]] = CopyPlanError

    sink: Sink = Sink.REPLACE
    """``replace`` (atomic), ``append`` or ``merge`` (matching on the target's primary key)."""
    primary_key: tuple[str, ...] = ()
    """The primary key of a target the copy creates (a ``merge`` into a new target needs one)."""
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    """``evolve`` (an existing target takes added columns, widened types and keeps dropped
    columns, in the load's transaction, listed under ``dpone/schema_changes``) or ``freeze``
    (any difference fails with ``schema_change_incompatible``, nothing written)."""

    @field_validator("primary_key", mode="after")
    @classmethod
    def _primary_key(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name for name in value) or len(set(value)) != len(value):
            raise CopyPlanError(
                cls.refusal,
                f"primary_key={list(value)!r}: a primary key is distinct, non-empty column names.",
                ["Name each key column once, e.g. primary_key=['id']."],
            )
        return value


_R = TypeVar("_R", bound=ParsedOptions)


def build_source_copy(
    read_class: type[_R],
    read: _R | None,
    options: SourceCopyOptions | None,
    *,
    caller: str,
    shortcuts: Mapping[str, Any],
    legacy: Mapping[str, Any],
) -> tuple[_R, SourceCopyOptions]:
    """What a generic source's copy reads and how its rows land, from its caller's arguments.

    Each object is built by :func:`~dpone_dagster.lifecycle.options.build_options`: a shortcut
    or a deprecated keyword goes to the object that has a field of its name (``table=`` to the
    read, ``sink=`` to the options), and a deprecated keyword warns naming the argument that
    takes its object (``read=`` or ``options=``).

    Args:
        read_class: The source's read class (:class:`~.mysql_read.MySQLRead`,
            :class:`~.rest_read.RestRead`).
        read: The read the caller passed (``None``: built from the keywords).
        options: The options the caller passed (``None``: the defaults and the keywords).
        caller: The public name called, for the messages.
        shortcuts: The caller's keyword shortcuts (``None`` values: not given).
        legacy: The caller's other keyword arguments (its ``**legacy``), deprecated.

    Raises:
        TypeError: for an unknown keyword argument.
        SourceError: the read class's refusal (``mysql_source_invalid``,
            ``rest_source_invalid``) for a bad read.
        CopyPlanError: ``copy_options_invalid`` for bad options.
    """

    def of_read(values: Mapping[str, Any], to_read: bool) -> dict[str, Any]:
        return {k: v for k, v in values.items() if (k in read_class.model_fields) == to_read}

    chosen = build_options(
        SourceCopyOptions, options, caller=caller, shortcuts=of_read(shortcuts, False),
        legacy=of_read(legacy, False), stacklevel=4,
    )  # fmt: skip
    what = build_options(
        read_class, read, caller=caller, shortcuts=of_read(shortcuts, True),
        legacy=of_read(legacy, True), argument="read", stacklevel=4,
    )  # fmt: skip
    return what, chosen
