"""Tuning and hooks of a snapshot copy."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .connection import ConnectionOptions
from .progress import ProgressCallback


@dataclass(frozen=True)
class CopyOptions:
    """Tuning and hooks of a copy; the defaults suit most tables.

    Attributes:
        batch_rows: Rows per batch (batched COPY).
        fetch_rows: Rows per fetch (streamed rows).
        spool_dir: Directory of whole-COPY files; a new temporary directory when None.
        source_options: Options of every source session.
        target_options: Options of every target session.
        progress: Called as bytes move.
        progress_every: Bytes between two progress calls.
    """

    batch_rows: int = 250_000
    fetch_rows: int = 5_000
    spool_dir: str | os.PathLike[str] | None = None
    source_options: ConnectionOptions = field(default_factory=ConnectionOptions)
    target_options: ConnectionOptions = field(default_factory=ConnectionOptions)
    progress: ProgressCallback | None = None
    progress_every: int = 64 << 20
