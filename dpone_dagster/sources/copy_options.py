"""``SourceCopyOptions``: a generic source's copy options, one frozen object validated once.

:func:`~dpone_dagster.mysql_copy_asset`, :func:`~dpone_dagster.rest_copy_asset`, the resources'
``copy_table`` (:meth:`~dpone_dagster.MySQLSourceResource.copy_table`,
:meth:`~dpone_dagster.RestSourceResource.copy_table`), their events and the loader
(:func:`~.load.load_source`) all take this object: how the rows land in the target. What is
read (a MySQL table, query, database and columns; an API path, its model, records path,
pagination, parameters, id field and page limit) is the source reader's own description
(:class:`~.mysql.MySQLSource`, :class:`~.rest.RestSource`), as the topic is a Kafka copy's and
the tables are a snapshot copy's; the target table, the target session's options and the
progress hook are the loader's own arguments.

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

from typing import ClassVar

from pydantic import field_validator

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.lifecycle.options import ParsedOptions
from dpone_dagster.postgres.schema_change import SchemaChanges
from dpone_dagster.postgres.target_plan import CopyPlanError, Sink

__all__ = ["SourceCopyOptions"]


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
