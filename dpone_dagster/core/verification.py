"""A stream's check, as the ledger keeps it and Dagster reports it: one document for the
incremental stream's and the replication group's ``dpone_reconciled``."""

from __future__ import annotations

import time
from datetime import datetime

from .documents import Count, Document


class Verification(Document):
    """A stream's check: the comparison of whole rows, both sides, in one source snapshot (the
    incremental stream's final batch, or a replication group's run, :mod:`dpone_dagster.core.
    sweep`).

    Attributes:
        ok: Every source row at or below the mark is in the target with equal values, and the
            target holds no other live row (``ignore``: rows the source deleted are allowed).
        keys_compared: Keys that crossed the wire.
        ranges_differing: Key-hash ranges whose digests differed.
        changed_since_mark: Rows that differ because the source changed them after the mark
            (their cursor is above it: the next run's); ``run``: every source row above it. A
            replication check (``applied_lsn`` set): keys that differ because a change to them
            committed after the applied position (still in the slot: the next run's).
        deleted_kept: Target rows whose key the source lost, kept under ``ignore``.
        unexplained: How many rows differ with no such reason.
        examples: Up to 20 of their keys.
        scope: ``full`` (both whole tables compared), ``run`` (the run's keys and a slice of
            the rolling sweep, :mod:`.sweep`) or ``table`` (a replicated table without a
            primary key, compared whole by its digest when ``ranges_checked`` is 1, not this
            run when 0; ``ranges_total``: the runs between two comparisons).
        keys_checked: ``run``: the run's keys verified (source rows in the run's cursor range).
        ranges_checked: ``run``: the sweep's key ranges verified by this run.
        ranges_total: ``run``: the ranges a full sweep takes (from the source's row estimate).
        rows_swept: ``run``: source rows in the ranges verified (about).
        sweep_started_at: ``run``: when the sweep in progress began (``None``: it completed
            with this run).
        swept_at: ``run``: when the last full sweep completed (every range verified since
            ``swept_from``); ``None`` until one has.
        swept_from: ``run``: when that sweep began.
        proved_at: The source snapshot's time the comparison proved equality at.
        differing_ranges: ``run``: the sweep's key ranges ``(after, end]`` (each bound a key as
            text, ``None``: open) in which the check found rows differing, unexplained.
        repaired_keys: Keys the run rewrote from the source because they differed
            (``repair=True``, :mod:`.repair`); they are not counted in ``unexplained``.
        repaired_rows: Target rows those repairs wrote (inserted, updated, deleted).
        repaired_ranges: ``run``: the sweep's key ranges those keys lay in.
        applied_lsn: A replication group's check: the applied position the target was proved
            at (changes after it are the next run's); ``None`` for an incremental stream.
        seconds: What the comparisons took (the run's keys, the sweep's slice, or both whole
            tables), as the check's own cost: the figure that follows the run, not the table.
    """

    ok: bool
    keys_compared: Count
    ranges_differing: Count
    changed_since_mark: Count
    deleted_kept: Count
    unexplained: Count
    examples: tuple[tuple[str, ...], ...] = ()
    scope: str = "full"
    keys_checked: Count = 0
    ranges_checked: Count = 0
    ranges_total: Count = 0
    rows_swept: Count = 0
    sweep_started_at: datetime | None = None
    swept_at: datetime | None = None
    swept_from: datetime | None = None
    proved_at: datetime | None = None
    differing_ranges: tuple[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ...] = ()
    repaired_keys: Count = 0
    repaired_rows: Count = 0
    repaired_ranges: tuple[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ...] = ()
    applied_lsn: str | None = None
    seconds: float | None = None


def timed(verification: Verification, started: float) -> Verification:
    """``verification`` with ``seconds`` since ``started`` (a ``time.monotonic()`` reading)."""
    return verification.model_copy(update={"seconds": round(time.monotonic() - started, 3)})
