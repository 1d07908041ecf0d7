"""A snapshot copy's keys: :class:`CopyMetadataSet`."""

import dagster as dg

from .base import DponeSet


class CopyMetadataSet(DponeSet):
    """A snapshot copy's own ``dpone/`` keys: how each table was copied, its read's
    authorities, its steps' seconds, and its ``dpone_reconciled`` check's proof.
    """

    strategy: str | None = None
    """The extraction strategy (copy; spec of a snapshot copy)."""
    copy_format: str | None = None
    """``binary`` or ``text`` COPY (copy)."""
    copy_format_reason: str | None = None
    """Why the rows moved as text, when they did (copy)."""
    terminal_receipt: dg.JsonMetadataValue | None = None
    """The artifact's terminal receipt (copy)."""
    seconds_plan: float | None = None
    """Seconds of the copy's plan step, all tables of one snapshot copy together (copy)."""
    seconds_extract: float | None = None
    """Seconds of the copy's extract step (copy)."""
    seconds_load: float | None = None
    """Seconds of the copy's load step (copy)."""
    clock_authority: str | None = None
    """The clock that issued the read window's timestamps (copy)."""
    snapshot_authority: str | None = None
    """What issued the snapshot (copy)."""
    proof: str | None = None
    """Which prover proved it: row versions or a content hash (check of a copy)."""
    source_rows: int | None = None
    """Rows the source held in the snapshot (check of a copy)."""
    target_rows: int | None = None
    """Rows the target holds (check of a copy)."""
    source_digest: str | None = None
    """The source's content digest (check of a copy)."""
    target_digest: str | None = None
    """The target's content digest (check of a copy)."""
