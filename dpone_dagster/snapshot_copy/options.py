"""``SnapshotCopyOptions``: a snapshot copy's options, one frozen object validated once.

:func:`~dpone_dagster.snapshot_copy_assets`, :meth:`~dpone_dagster.PostgresSourceResource.
copy_tables`, its events, the job of ``acquire -> extract -> load -> settle``, the component's
``snapshot_copies`` entries and the engine (:func:`~.engine.copy_tables`,
:class:`~.engine.SnapshotCopy`) all take this object. What is not a choice of the copy
(the DSNs, the tables, the sessions' options, a held snapshot, the progress hook) is the
engine's own arguments (:class:`~.tuning.CopyOptions`).

Examples:
    >>> SnapshotCopyOptions(strategy="partitioned_copy", workers=2).strategy
    <Strategy.PARTITIONED_COPY: 'partitioned_copy'>
    >>> try:
    ...     SnapshotCopyOptions.parse({"sink": "upsert"})
    ... except CopyPlanError as exc:
    ...     print(exc.code)
    copy_options_invalid
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import field_validator

from dpone_dagster.lifecycle import DponeError, Vocabulary
from dpone_dagster.lifecycle.options import ParsedOptions
from dpone_dagster.postgres.options import SNAPSHOT_COPY_BATCH_SIZE, BatchSize
from dpone_dagster.postgres.schema_change import SchemaChanges
from dpone_dagster.postgres.target_plan import CopyPlanError, Sink

__all__ = ["SnapshotCopyOptions", "Strategy"]


class Strategy(Vocabulary, option="strategy", refusal="copy_options_invalid", error=CopyPlanError):
    """How a snapshot copy reads the source (the one strategy vocabulary)."""

    WHOLE_COPY = "whole_copy"
    """Each table ``COPY``'d whole to a file under the snapshot, then loaded from the file."""
    STREAM_ROWS = "stream_rows"
    """A server-side cursor; every value reaches Python as PostgreSQL's text."""
    BATCHED_COPY = "batched_copy"
    """Lazy primary-key ranges, each one ``COPY`` relayed block by block into the target."""
    PARTITIONED_COPY = "partitioned_copy"
    """Worker sessions import one exported snapshot and relay integer-key ranges in parallel."""
    INTERNAL_QUERY = "internal_query"
    """Same database: ``INSERT INTO staging ... SELECT`` in the target session."""


class SnapshotCopyOptions(ParsedOptions):
    """How a snapshot copy reads and loads its tables; the defaults suit most tables.

    Each field takes its spelling as text too (``strategy="whole_copy"``), parsed here once.

    Raises:
        CopyPlanError: ``copy_options_invalid`` for an unknown strategy, sink or
            ``schema_changes``, fewer than one worker, a batch size below 1, or an unknown
            option (through :meth:`parse`; constructing it directly raises pydantic's
            ``ValidationError`` for the last).
    """

    refusal: ClassVar[str] = "copy_options_invalid"
    error: ClassVar[type[DponeError]] = CopyPlanError

    strategy: Strategy = Strategy.BATCHED_COPY
    """``whole_copy``, ``stream_rows``, ``batched_copy``, ``partitioned_copy`` or
    ``internal_query`` (source and target in one database)."""
    sink: Sink = Sink.REPLACE
    """``replace`` (atomic), ``append`` or ``merge`` (by primary key)."""
    workers: int = 4
    """Worker sessions of ``partitioned_copy``."""
    batch_size: BatchSize = SNAPSHOT_COPY_BATCH_SIZE
    """Rows per range of ``batched_copy`` (None: the default,
    :data:`~dpone_dagster.postgres.options.SNAPSHOT_COPY_BATCH_SIZE`)."""
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    """``evolve`` (an existing target takes added columns, widened types and keeps dropped
    columns, in the load's transaction, listed under ``dpone/schema_changes``) or ``freeze``
    (any difference fails with ``schema_change_incompatible``, nothing written; no type is
    created either)."""

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> BatchSize:
        if value is None:
            return SNAPSHOT_COPY_BATCH_SIZE
        return BatchSize.parse(value, refusal=cls.refusal)

    @field_validator("workers", mode="after")
    @classmethod
    def _workers(cls, value: int) -> int:
        if value < 1:
            raise CopyPlanError(
                cls.refusal,
                f"workers={value}: a copy needs at least one worker.",
                ["Use workers=1 or more."],
            )
        return value
