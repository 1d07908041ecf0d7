"""The ``dpone_reconciled`` result of a stream's verification, the same for an incremental
stream's run and a replicated table's (:class:`~dpone_dagster.core.verification.Verification`):
passed or failed on the keys it compared, a warning when it verified nothing, a table without a
primary key compared whole by its digest. Built through the stream check's set
(:class:`~dpone_dagster.dagster.metadata.keys.stream_check.StreamCheckMetadataSet`) and the
common one."""

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from dpone_dagster.core.verification import Verification

from .keys.base import bullets
from .keys.common import CommonMetadataSet
from .keys.stream_check import StreamCheckMetadataSet
from .parts import CHECK_NAME, timestamp_value


def verification_check(
    key: dg.AssetKey, check: Verification | None, nothing: str
) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of a verification. A check that verified nothing
    (``None``, with ``nothing`` as its description, or a keyless table not compared this run)
    is a warning with ``dpone/verified`` false: never a silent pass."""
    if check is None:
        return unverified(key, nothing)
    if check.scope == "table":
        return whole_table_check(key, check)
    guarantee, scope = "equal_at_or_below_mark", {}
    description = "Every source row at or below the mark is in the target, equal"
    later = dict(StreamCheckMetadataSet(changed_since_mark=check.changed_since_mark))
    if check.applied_lsn is not None:  # a replicated table: proved at the applied position
        guarantee = "equal_at_applied_lsn"
        description = f"Every source row is in the target, equal, as of {check.applied_lsn}"
        later = dict(
            StreamCheckMetadataSet(
                applied_lsn=check.applied_lsn, changed_after_applied=check.changed_since_mark
            )
        )
    if check.scope == "run":
        guarantee = stream_guarantee(check)
        description = f"{guarantee}: every key of the run, and {check.ranges_checked} of " \
            f"{check.ranges_total} key range(s) of the sweep, are in the target, equal"  # fmt: skip
        scope = dict(
            StreamCheckMetadataSet(
                keys_checked=check.keys_checked, ranges_checked=check.ranges_checked,
                ranges_total=check.ranges_total, rows_swept=check.rows_swept,
                sweep_started_at=_iso(check.sweep_started_at), swept_at=_iso(check.swept_at),
            )
        )  # fmt: skip
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=check.ok,
        description=description + _verdict_words(check),
        metadata=dict(
            CommonMetadataSet(guarantee=guarantee, proved_at=timestamp_value(check.proved_at))
        )
        | dict(
            StreamCheckMetadataSet(
                verified=True,
                check_scope=check.scope,
                check_seconds=check.seconds,
                keys_compared=check.keys_compared,
                ranges_differing=check.ranges_differing,
                deleted_kept=check.deleted_kept,
                unexplained=check.unexplained,
                examples=dg.MetadataValue.json([list(k) for k in check.examples]),
                differing_ranges=_ranges(check.differing_ranges),
                repaired_keys=check.repaired_keys or None,
                repaired_rows=check.repaired_rows or None,
                repaired_ranges=_ranges(check.repaired_ranges),
            )
        )
        | later
        | scope,
    )


def unverified(
    key: dg.AssetKey, description: str, next_actions: Sequence[str] = ()
) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` warning of a run that verified nothing: why, and what to do."""
    metadata = {
        **StreamCheckMetadataSet(verified=False),
        **CommonMetadataSet(next_actions=_actions(next_actions)),
    }
    return dg.AssetCheckResult(
        asset_key=key, check_name=CHECK_NAME, passed=False,
        severity=dg.AssetCheckSeverity.WARN, description=description, metadata=metadata,
    )  # fmt: skip


_KEYLESS_ACTIONS = (
    "Give the table a primary key: its check then verifies the keys of every run.",
    "Or compare the whole table now: run the group's check job (replication_check_job).",
)


def whole_table_check(key: dg.AssetKey, check: Verification) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of a table without a primary key, compared whole by its
    digest (``scope`` ``table``): passed or failed when this run compared it, a warning when
    it did not (its last comparison, and when the next one comes)."""
    every = check.ranges_total
    cadence = "at every run" if every <= 1 else f"once every {every} runs (the sweep's budget)"
    last = "never yet" if check.swept_at is None else f"at {check.swept_at.isoformat()}"
    if not check.ranges_checked:
        why = (
            "a change after the applied position (a TRUNCATE) could not be taken out of the "
            "source's digest; the next run compares it"
            if check.changed_since_mark
            else f"it has no primary key and is compared whole {cadence}"
        )
        return unverified(
            key, f"This run compared nothing of the table: {why}. Last found equal: {last}.",
            _KEYLESS_ACTIONS,
        )  # fmt: skip
    if check.ok:
        description = (
            f"The whole table ({check.rows_swept} rows; no primary key, so compared by its "
            f"digest) is in the target, equal, as of {check.applied_lsn}; compared {cadence}."
        )
    else:
        description = (
            f"The whole table's digest differs from the source's as of {check.applied_lsn}: "
            f"{check.unexplained} row(s) or more are missing, extra or changed in the target "
            "(no key names them); compared again at every run until it agrees."
        )
    metadata = {
        **StreamCheckMetadataSet(
            verified=True, check_scope="table", check_seconds=check.seconds,
            unexplained=check.unexplained, ranges_checked=check.ranges_checked,
            ranges_total=check.ranges_total, rows_swept=check.rows_swept,
            swept_at=_iso(check.swept_at), applied_lsn=check.applied_lsn,
        ),
        **CommonMetadataSet(
            guarantee="equal_at_applied_lsn", proved_at=timestamp_value(check.proved_at),
            next_actions=None if check.ok else _actions(
                ("Resync the group (resync: true) to copy the table again.", *_KEYLESS_ACTIONS)
            ),
        ),
    }  # fmt: skip
    return dg.AssetCheckResult(
        asset_key=key, check_name=CHECK_NAME, passed=check.ok, description=description,
        metadata=metadata,
    )  # fmt: skip


def _actions(actions: Sequence[str]) -> dg.MarkdownMetadataValue | None:
    return dg.MetadataValue.md(bullets(actions)) if actions else None


def _verdict_words(check: Verification) -> str:
    left = ""
    if check.applied_lsn is not None and check.changed_since_mark:
        left = f"; {check.changed_since_mark} key(s) changed after the applied position: left " \
            "to the next run"  # fmt: skip
    if not check.ok:
        return f": {check.unexplained} row(s) are not{left}."
    if check.repaired_keys:
        return f" ({check.repaired_keys} key(s) that differed were repaired from the source)."
    return f"{left}."


KeyRanges = tuple[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ...]


def _ranges(ranges: KeyRanges) -> dg.JsonMetadataValue | None:
    """Key ranges ``(after, through]`` as JSON (left out when there are none)."""
    if not ranges:
        return None
    return dg.MetadataValue.json(
        [{"after": None if a is None else list(a), "through": None if b is None else list(b)}
         for a, b in ranges]
    )  # fmt: skip


def _iso(at: datetime | None) -> str:
    return "" if at is None else at.isoformat()


def stream_guarantee(check: Verification) -> str:
    """The label of a ``run`` check's guarantee: ``this run exact; table swept at <when the
    last full sweep completed>`` (``...; table not yet swept (since <when the sweep began>)``
    before the first full sweep)."""
    if check.swept_at is not None:
        return f"this run exact; table swept at {check.swept_at.isoformat()}"
    since = check.sweep_started_at or check.proved_at
    return "this run exact; table not yet swept" + (
        "" if since is None else f" (sweep begun at {since.isoformat()})"
    )
