"""An incremental stream's options: one frozen object, validated once where it is built.

:class:`IncrementalOptions` is what ``incremental_asset``, ``PostgresSourceResource.incremental``,
the stream's event iterator, :class:`~dpone_dagster.incremental.IncrementalSync` and the
component's ``incremental_streams`` entries all take. What names the stream (its tables and its
cursor, which make its id) stays beside it, as the connections do.

Examples:
    >>> options = IncrementalOptions(deletes="hard", batch_size=10_000)
    >>> options.deletes, options.batch_size, options.reconcile
    (<Deletes.HARD: 'hard'>, 10000, True)
    >>> options.replace(reconcile=False).reconcile
    False
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar, Self

from pydantic import field_validator, model_validator

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.options import JobOptions
from dpone_dagster.core.sweep import Sweep
from dpone_dagster.postgres.identifiers import check_identifier
from dpone_dagster.postgres.options import INCREMENTAL_BATCH_SIZE, BatchSize
from dpone_dagster.postgres.schema_change import SchemaChanges

from .sweep import CheckScope

__all__ = ["DEFAULT_FILLFACTOR", "DEFAULT_SOFT_DELETE_COLUMN", "IncrementalOptions"]

DEFAULT_SOFT_DELETE_COLUMN = "_dpone_deleted_at"
"""The target column ``soft`` deletes set, created if missing."""
DEFAULT_FILLFACTOR = 90
"""The ``fillfactor`` of a target the stream creates: the room it leaves on each page keeps an
updated row on its page (a HOT update: no new index entry, and about a third less WAL for a run
that updates rows spread across the table)."""


class IncrementalOptions(JobOptions):
    """How an incremental stream runs (frozen; build it once, pass it whole).

    An invalid value is refused where the object is built, with the code of the parser that
    refuses it: ``incremental_options_invalid`` (a value of the wrong type too, through
    :meth:`~dpone_dagster.core.options.JobOptions.parse`), ``identifier_invalid`` for a
    soft-delete column PostgreSQL cannot hold, ``copy_options_invalid`` for an unknown
    ``schema_changes`` (the load's own vocabulary).

    Attributes:
        deletes: ``ignore`` (default), ``hard`` (delete target rows whose key the source lost;
            every run compares both key sets), ``soft`` (set ``soft_delete_column`` on them
            instead) or ``sweep`` (delete them when the rolling sweep reaches their key range:
            a run's cost does not grow with the table; a delete waits at most one full sweep,
            ``sweep``'s bound).
        soft_delete_column: The ``timestamptz`` column ``soft`` sets (added if missing).
        batch_size: Rows per batch (each commits with its receipt and the stream's state).
        lookback: For a date or timestamp cursor set from a client clock that may run behind
            the server's: each run reads this much below the stream's mark again.
        continue_from_backfill: The first run of a stream with no state starts from the mark
            of a complete backfill (``backfill_asset``, :class:`~dpone_dagster.backfill.
            Backfill`) of the same table and cursor instead of copying the table: the same
            engine, the next policy (:func:`~dpone_dagster.cursor.handoff.backfill_handoff`;
            an :class:`~dpone_dagster.incremental.IncrementalSync` given a ``handoff=`` of its
            own uses that instead).
        settle_timeout: Seconds a run waits for transactions open at its mark (see
            :mod:`dpone_dagster.cursor.mark_policies` for what happens after).
        reconcile: Verify each run in its final snapshot and record the verdict in its receipt
            (the asset's ``dpone_reconciled`` check); what it compares: ``check``.
        check: ``run`` (default: every key the run copied, exactly, and a rolling slice of the
            key so that every range is verified within ``sweep``'s bound; the cost follows the
            run) or ``full`` (both whole tables, every run). The asset's check run alone (the
            asset not selected) always compares both whole tables.
        sweep: The rolling slice's per-run budget
            (:class:`~dpone_dagster.incremental.Sweep`: ``runs``, default a full sweep in 288
            runs, once a day at a five-minute schedule; or ``rows`` or ``seconds`` per run).
        repair: When the check finds rows that differ for no reason the stream knows (the
            target changed behind its back), rewrite exactly those keys from the final batch's
            source snapshot through the stream's own merge and delete path, in its transaction;
            the check then passes, saying what it repaired (``dpone/repaired_keys``,
            ``dpone/repaired_ranges``). Off (default): the check fails naming the keys and the
            sweep's key ranges (``dpone/examples``, ``dpone/differing_ranges``). Needs
            ``reconcile``.
        schema_changes: ``evolve`` (default: a source column added, widened or dropped between
            runs changes the target in a batch's transaction, with its rows, listed under
            ``dpone/schema_changes``) or ``freeze`` (any difference fails the run with
            ``schema_change_incompatible`` before it begins). Rows copied before a column was
            added keep its default (or NULL) until their cursor moves.
        fillfactor: The ``fillfactor`` of a target the first run creates (10 to 100; the room
            left on each page keeps an updated row on its page; 100 packs pages full, as
            PostgreSQL does by default). An existing target keeps its own.
    """

    refusal: ClassVar[str] = "incremental_options_invalid"

    deletes: Deletes = Deletes.IGNORE
    soft_delete_column: str = DEFAULT_SOFT_DELETE_COLUMN
    batch_size: BatchSize = INCREMENTAL_BATCH_SIZE
    lookback: timedelta | None = None
    continue_from_backfill: bool = False
    settle_timeout: float = 30.0
    reconcile: bool = True
    check: CheckScope = CheckScope.RUN
    sweep: Sweep = Sweep()
    repair: bool = False
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    fillfactor: int = DEFAULT_FILLFACTOR

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> BatchSize:
        return BatchSize.parse(value, refusal=cls.refusal)

    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep(cls, value: Any) -> Any:
        return Sweep() if value is None else value  # None: the default budget, as before

    @field_validator("soft_delete_column")
    @classmethod
    def _soft_delete_column(cls, value: str) -> str:
        return check_identifier(value, what="soft-delete column")

    @field_validator("lookback")
    @classmethod
    def _lookback(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise engine_error(cls.refusal, f"lookback={value}.")
        return value

    @field_validator("settle_timeout")
    @classmethod
    def _settle_timeout(cls, value: float) -> float:
        if value < 0:
            raise engine_error(cls.refusal, f"settle_timeout={value}.")
        return value

    @field_validator("fillfactor", mode="before")
    @classmethod
    def _fillfactor(cls, value: Any) -> int:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or not 10 <= value <= 100:
            raise engine_error(
                cls.refusal,
                f"fillfactor={value!r}.",
                [f"Use a whole number from 10 to 100 ({DEFAULT_FILLFACTOR} by default; 100 "
                 "packs pages full)."],
            )  # fmt: skip
        return int(value)

    @model_validator(mode="after")
    def _repair_needs_the_check(self) -> Self:
        if self.repair and not self.reconcile:
            raise engine_error(
                self.refusal,
                "repair=True with reconcile=False: only the check finds what to repair.",
                ["Leave reconcile on with repair=True (or leave repair off)."],
            )
        return self
