"""``CopyOptions``: the tuning, sessions and hooks of a snapshot copy (the engine's ``tuning``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dpone_dagster.postgres.connection import ConnectionOptions
from dpone_dagster.postgres.snapshot import check_snapshot_token

from .copy_progress import ProgressCallback


@dataclass(frozen=True)
class CopyOptions:
    """Tuning, sessions and hooks of a snapshot copy (the engine's ``tuning``, beside its
    options, :class:`~.options.SnapshotCopyOptions`); the defaults suit most
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
