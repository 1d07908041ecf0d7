"""Tuning, sessions and hooks of a snapshot copy, and the one batch-size option every copy
shares."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final

from dpone_dagster.lifecycle import DponeError

from .connection import ConnectionOptions
from .progress import ProgressCallback
from .snapshot import check_snapshot_token


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


@dataclass(frozen=True)
class CopyOptions:
    """Tuning, sessions and hooks of a snapshot copy (the engine's ``tuning``, beside its
    options, :class:`~.snapshot_copy_options.SnapshotCopyOptions`); the defaults suit most
    tables.

    Attributes:
        fetch_rows: Rows per fetch (streamed rows).
        spool_dir: Directory of whole-COPY files; a new temporary directory when None.
        source_options: Options of every source session.
        target_options: Options of every target session.
        progress: Called as bytes move.
        progress_every: Bytes between two progress calls.
        snapshot_token: A snapshot the caller exported and holds open
            (``SnapshotSession.open(dsn, export=True).token``). Every strategy then reads under
            exactly that snapshot: each source session (and, for ``internal``, the target
            session) imports it with ``SET TRANSACTION SNAPSHOT`` instead of taking its own, and
            the receipts name it (authority ``postgresql.pg_export_snapshot``, digest of this
            token). The caller keeps the exporting transaction open until the copy has read
            everything (and for as long as it wants to read the source as the copy saw it, e.g.
            to reconcile). None: the copy takes its own snapshot. With ``internal`` the load's
            writes also run in that snapshot, so target rows others wrote after it are
            invisible to the sink: updating one fails the load (a serialization error), and a
            row-by-row ``replace`` would not delete one. Hold the snapshot only from just
            before the copy, or let nothing else write the target meanwhile.

    Raises:
        SnapshotError: ``snapshot_token_invalid`` for a value that is not an exported token.
    """

    fetch_rows: int = 5_000
    spool_dir: str | os.PathLike[str] | None = None
    source_options: ConnectionOptions = field(default_factory=ConnectionOptions)
    target_options: ConnectionOptions = field(default_factory=ConnectionOptions)
    progress: ProgressCallback | None = None
    progress_every: int = 64 << 20
    snapshot_token: str | None = None

    def __post_init__(self) -> None:
        if self.snapshot_token is not None:
            check_snapshot_token(self.snapshot_token)
