"""The one batch-size option every copy shares (``batch_size``), and each engine's default."""

from __future__ import annotations

from typing import Final

from dpone_dagster.lifecycle import DponeError


class BatchSize(int):
    """Rows per batch (``batch_size``, the one name of the concept in every copy): a whole
    number of at least 1, parsed once where a caller's value enters (:meth:`parse`)."""

    @classmethod
    def parse(cls, value: object, *, refusal: str) -> BatchSize:
        """``value`` as a batch size (a :class:`BatchSize` is returned as it is).

        Args:
            value: What the caller passed.
            refusal: The entry point's code for a bad value.

        Raises:
            DponeError: ``refusal`` for anything but a whole number of at least 1.
        """
        if isinstance(value, BatchSize):
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DponeError(
                refusal,
                f"batch_size must be a whole number of at least 1, not {value!r}.",
                ["Leave batch_size unset for its default, or use a number such as 50_000."],
            )
        return cls(value)


SNAPSHOT_COPY_BATCH_SIZE: Final = BatchSize(250_000)
"""A snapshot copy's ``batched_copy`` range: each range is one COPY relayed block by block under
the copy's one snapshot, and nothing commits per range, so a larger range only saves range
queries; memory stays flat at any size."""
BACKFILL_BATCH_SIZE: Final = BatchSize(100_000)
"""A backfill batch of a run planned without an estimate of its table's rows (the plan otherwise
sizes the batches from the table's width, :mod:`dpone_dagster.backfill.batch_size`): each is one
target transaction (its rows and its receipt), so a crash redoes at most one batch."""
INCREMENTAL_BATCH_SIZE: Final = BatchSize(50_000)
"""An incremental stream's batch: each is one ``MERGE`` with the stream's state, in one target
transaction; half a backfill batch, because a merged row costs more than a copied one (an
update writes a new row version and its WAL) and a run usually brings far fewer rows."""
