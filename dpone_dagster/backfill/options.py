"""The ordered backfill's options: one frozen object, validated once where it is built.

:class:`BackfillOptions` is what ``backfill_asset``, ``PostgresSourceResource.backfill``, its
event iterator, the component's YAML and :class:`~dpone_dagster.backfill.Backfill` all take.
What names the run's scope (the tables, the cursor, the partition range, a label), where the
ledger lives and how sessions connect are not options: they are the engine's own arguments, or
the asset's.

Examples:
    >>> BackfillOptions(batch_size=50_000, on_changed="repair").on_changed
    <OnChanged.REPAIR: 'repair'>
    >>> from dpone_dagster.lifecycle import DponeError
    >>> try:
    ...     BackfillOptions.parse({"batch_size": 0})
    ... except DponeError as exc:
    ...     print(exc.code)
    plan_invalid
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import field_validator

from dpone_dagster.core.options import JobOptions
from dpone_dagster.cursor.range_checks import OnChanged
from dpone_dagster.postgres.options import BatchSize

__all__ = ["BackfillOptions"]


class BackfillOptions(JobOptions):
    """How an ordered backfill runs; the defaults suit most tables.

    Attributes:
        batch_size: Rows per batch (each batch commits with its receipt; rows tied on the last
            cursor value are added); by default chosen once, when the run is planned, from
            the source table's width (about 64 MiB of it a batch:
            :mod:`dpone_dagster.backfill.batch_size`).
        reconcile: Reconcile the run (count and hash per batch range) once it reaches its
            mark, and again while it is blocked; an asset reports it through the
            ``dpone_reconciled`` check, which it declares only when this is true.
        on_changed: What the reconciliation does with rows the source updated or deleted
            after their batch was copied: ``"fail"`` (default) keeps the copied history and
            fails with ``backfill_record_changed`` (the run is ``blocked``); ``"repair"``
            rewrites the differing ranges from the reconciliation's one source snapshot, so
            the run ends equal to the source at that snapshot (label
            ``repaired_to_one_snapshot``), and a batch that meets a row an earlier batch
            copied with other values (its cursor value moved forward) replaces it instead of
            failing. Not part of the run's scope: a blocked run can be run again with
            ``"repair"``. For a table that keeps changing after its backfill, see
            ``incremental_asset``.
        settle_timeout: Seconds the plan waits for transactions in flight at the high-water
            mark (``backfill_high_water_mark_unsettled`` when they do not end in time).
        write_pause: A reference to a bounded write pause (ticket, window) when the cursor does
            not grow with commit order; the plan then does not wait for in-flight writers.

    Raises:
        EngineError: ``plan_invalid`` (from :meth:`parse`, or at once for a bad ``batch_size``
            or ``on_changed``), naming the option.
    """

    refusal: ClassVar[str] = "plan_invalid"

    batch_size: BatchSize | None = None
    reconcile: bool = True
    on_changed: OnChanged = OnChanged.FAIL
    settle_timeout: float = 60.0
    write_pause: str | None = None

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: object) -> BatchSize | None:
        return None if value is None else BatchSize.parse(value, refusal=cls.refusal)

    @field_validator("on_changed", mode="before")
    @classmethod
    def _on_changed(cls, value: object) -> OnChanged:
        return OnChanged.parse(value)
