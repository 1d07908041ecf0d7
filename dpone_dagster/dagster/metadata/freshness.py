"""A stream's freshness: its Dagster ``FreshnessPolicy`` and the ``dpone_fresh`` check.

Dagster judges a ``FreshnessPolicy`` by materialization times alone (its freshness daemon: the
last materialization's age). A stream that runs on time can still hold old data: a source read
that waits on transactions in flight, a broker far ahead of the run's budget. So a stream asset
also carries the ``dpone_fresh`` check, which judges the same policy by the lag its
materialization reports (``dpone/lag_seconds``: how old the source state the target now holds
is): :func:`freshness_check`, the one function every stream asset (incremental, Kafka,
replication) calls with its metadata and its policy.

A policy is read through what its public constructors take (``FreshnessPolicy.time_window``'s
``fail_window`` and ``warn_window``, ``FreshnessPolicy.cron``'s ``deadline_cron``,
``lower_bound_delta`` and ``timezone``), which the policy keeps as attributes of those names:
Dagster names the two kinds of policy only in a private module. Its cron arithmetic (a
schedule's smallest interval, a cron policy's last tick) is croniter's, the library Dagster
keeps a private copy of. Dagster's public freshness checks
(``dg.build_last_update_freshness_checks``) judge the time of the last materialization, not the
age of the data it reports: ``dpone_fresh`` is that other judgement.

A backfill's partitions have no asset-level freshness (Dagster's is asset-level only): the
``dpone_partitions_fresh`` check
(:func:`~dpone_dagster.dagster.metadata.backfill.partitions_check`) lists each partition's state
from the ledger and names the stale ones.
"""

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
from croniter import CroniterError, croniter

from dpone_dagster.core.errors import engine_error
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.keys.freshness import FreshnessMetadataSet

FRESH_CHECK_NAME = "dpone_fresh"
"""The check that judges a stream's freshness policy by the lag it reports."""

WARN_INTERVALS = 1.5
"""A policy derived from a schedule warns when the data is this many intervals old."""
FAIL_INTERVALS = 2.0
"""... and fails at this many: one missed run fails it."""


def stream_freshness_policy(
    cron_schedule: str | None, freshness_policy: dg.FreshnessPolicy | None, *, refusal: str
) -> dg.FreshnessPolicy | None:
    """The policy a stream asset carries: ``freshness_policy`` when given, else one derived
    from ``cron_schedule`` (the schedule's smallest interval ``i``: warn after ``1.5 i``,
    fail after ``2 i``), else none.

    Args:
        cron_schedule: The cron schedule the stream runs on.
        freshness_policy: A policy of the user's (``dg.FreshnessPolicy.time_window(...)`` or
            ``.cron(...)``).
        refusal: The error code of a bad schedule (the factory's options code).

    Raises:
        DponeError: ``refusal`` for a cron schedule Dagster does not read.

    Examples:
        >>> stream_freshness_policy("*/10 * * * *", None, refusal="x").fail_window.to_timedelta()
        datetime.timedelta(seconds=1200)
    """
    if freshness_policy is not None or cron_schedule is None:
        return freshness_policy
    try:
        interval = _smallest_cron_interval(cron_schedule)
    except CroniterError as exc:
        raise engine_error(
            refusal, f"cron_schedule {cron_schedule!r} is not a cron schedule: {exc}"
        ) from None
    return dg.FreshnessPolicy.time_window(
        fail_window=interval * FAIL_INTERVALS, warn_window=interval * WARN_INTERVALS
    )


_SAMPLED_TICKS = 1000
"""Ticks of a schedule sampled for its smallest interval (from a year ago, as Dagster does: a
year's month lengths and leap day)."""


def _smallest_cron_interval(cron_schedule: str) -> timedelta:
    """The smallest interval between two ticks of ``cron_schedule`` (UTC), over its first
    :data:`_SAMPLED_TICKS` ticks from a year ago, at most twenty years of them.

    Raises:
        CroniterError: Not a cron schedule Dagster reads (five fields, or an alias such as
            ``@daily``), or one that never ticks (the 30th of February).

    Examples:
        >>> _smallest_cron_interval("0 9,17 * * 1-5")
        datetime.timedelta(seconds=28800)
    """
    if not croniter.is_valid(cron_schedule) or len(croniter.expand(cron_schedule)[0]) != 5:
        raise CroniterError("not five fields")  # Dagster's schedules have no seconds field
    start = datetime.now(UTC) - timedelta(days=365)
    horizon = start + timedelta(days=20 * 365)
    ticks = croniter(cron_schedule, start)
    times = [ticks.get_next(datetime), ticks.get_next(datetime)]
    while len(times) < _SAMPLED_TICKS and times[-1] < horizon:
        times.append(ticks.get_next(datetime))
    return min(b - a for a, b in itertools.pairwise(times))


def _as_timedelta(window: Any) -> timedelta:
    """A policy's window as a ``timedelta`` (Dagster stores some as its serializable form)."""
    return window if isinstance(window, timedelta) else window.to_timedelta()


def freshness_check_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    """The ``dpone_fresh`` check spec of a stream asset that carries a policy."""
    return dg.AssetCheckSpec(
        FRESH_CHECK_NAME,
        asset=key,
        description="The data's lag (dpone/lag_seconds) is within the freshness policy.",
    )


def _limits(policy: dg.FreshnessPolicy, now: datetime) -> tuple[float, float | None, str]:
    """The lag (seconds) that fails the policy now, the lag that warns, and the policy in words."""
    given: Any = policy  # what its public constructor took, kept under the same names
    if getattr(given, "fail_window", None) is not None:  # FreshnessPolicy.time_window(...)
        warn = None if given.warn_window is None else _as_timedelta(given.warn_window)
        fail = _as_timedelta(given.fail_window).total_seconds()
        warned = None if warn is None else warn.total_seconds()
        return (
            fail,
            warned,
            f"time window: fail after {fail:g} s"
            + (f", warn after {warned:g} s" if warned is not None else ""),
        )
    if getattr(given, "deadline_cron", None) is not None:  # FreshnessPolicy.cron(...)
        deadline, zone = str(given.deadline_cron), str(given.timezone)
        # The data must be at least as new as the start of the last completed cron window: the
        # latest tick at or before now (croniter's previous tick is strictly before its start).
        local = now.astimezone(ZoneInfo(zone)) + timedelta(microseconds=1)
        tick = croniter(deadline, local).get_prev(datetime)
        oldest = tick - _as_timedelta(given.lower_bound_delta)
        return (
            (now - oldest).total_seconds(),
            None,
            f"cron {deadline!r} ({zone}): data newer than {oldest.astimezone(UTC).isoformat()}",
        )
    raise TypeError(f"unknown freshness policy {type(policy).__name__}")


def freshness_check(
    key: dg.AssetKey,
    metadata: Mapping[str, Any],
    policy: dg.FreshnessPolicy,
    *,
    reported_at: datetime | None = None,
    now: datetime | None = None,
) -> dg.AssetCheckResult:
    """The ``dpone_fresh`` result of a materialization's lag against ``policy``.

    Passes while the lag is within the policy's warn window (or fail window when it has none);
    between the two it does not pass with severity ``WARN``; beyond the fail window it fails
    (``ERROR``). With no lag reported it does not pass (``WARN``): freshness is unknown.

    Args:
        key: The asset.
        metadata: The materialization's metadata (raw values or recorded metadata values):
            ``dpone/lag_seconds`` is read.
        policy: The asset's freshness policy.
        reported_at: When the lag was reported (a recorded materialization's time): the lag
            has grown by the time since. ``None``: now.
        now: The time of the judgement (UTC ``now`` by default).

    Returns:
        The check result, with ``dpone/lag_seconds``, ``dpone/fail_after_seconds``,
        ``dpone/warn_after_seconds`` and ``dpone/freshness_policy``.

    Examples:
        >>> policy = dg.FreshnessPolicy.time_window(fail_window=timedelta(minutes=10))
        >>> freshness_check(dg.AssetKey("t"), {"dpone/lag_seconds": 30.0}, policy).passed
        True
    """
    now = now or datetime.now(UTC)
    raw = metadata.get(CommonMetadataSet.key("lag_seconds"))
    lag = getattr(raw, "value", raw)
    fail, warn, words = _limits(policy, now)
    if not isinstance(lag, int | float):
        return dg.AssetCheckResult(
            asset_key=key, check_name=FRESH_CHECK_NAME, passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description="No lag reported (dpone/lag_seconds): the data's freshness is unknown.",
            metadata=dict(FreshnessMetadataSet(fail_after_seconds=fail, freshness_policy=words)),
        )  # fmt: skip
    if reported_at is not None:
        lag = float(lag) + max((now - reported_at).total_seconds(), 0.0)
    bad = lag > fail
    warned = not bad and warn is not None and lag > warn
    verdict = "exceeds" if bad else "exceeds the warning of" if warned else "is within"
    limit = warn if warned and warn is not None else fail
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=FRESH_CHECK_NAME,
        passed=not (bad or warned),
        severity=dg.AssetCheckSeverity.ERROR if bad else dg.AssetCheckSeverity.WARN,
        description=f"Lag {lag:.1f} s {verdict} {limit:g} s ({words}).",
        metadata={
            **CommonMetadataSet(lag_seconds=float(lag)),
            **FreshnessMetadataSet(
                fail_after_seconds=fail, warn_after_seconds=warn, freshness_policy=words
            ),
        },
    )


def stream_freshness(
    context: dg.AssetExecutionContext, key: dg.AssetKey, metadata: Mapping[str, Any] | None
) -> list[dg.AssetCheckResult]:
    """The ``dpone_fresh`` result a stream's step yields, when the run selected the check:
    judged from ``metadata`` (the step's materialization), or, when the step materialized
    nothing (the check alone), from the asset's latest recorded materialization."""
    policy = context.assets_def.specs_by_key[key].freshness_policy
    if policy is None or dg.AssetCheckKey(key, FRESH_CHECK_NAME) not in (
        context.selected_asset_check_keys
    ):
        return []
    if metadata is not None:
        return [freshness_check(key, metadata, policy)]
    event = context.instance.get_latest_materialization_event(key)
    recorded = event.asset_materialization if event is not None else None
    if event is None or recorded is None:
        return [freshness_check(key, {}, policy)]
    at = datetime.fromtimestamp(event.timestamp, UTC)
    return [freshness_check(key, recorded.metadata, policy, reported_at=at)]
