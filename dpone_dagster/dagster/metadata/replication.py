"""What a replication group's run says: each table's materialization and the
``dpone_slot_healthy`` check of the group's slot, built through the group's sets
(:mod:`dpone_dagster.dagster.metadata.keys.replication`), the stream check's (the applied
position) and the common one.

The slot is an operational object: a slot nobody drains keeps WAL on the source's disk until it
fills, and a slot the server invalidated (``max_slot_wal_keep_size``) has lost changes. The
check warns when the slot retains more WAL than a threshold, and when an open transaction on
the source holds its WAL back (naming it, with what to do:
:attr:`~dpone_dagster.replication.slot_health.SlotStatus.held_by`); it fails (error) when its
``wal_status`` is ``unreserved`` (the server may remove WAL it still needs at the next
checkpoint) or ``lost`` (it has). With the source's standby known
(``PostgresSourceResource.standby_dsn``), it also warns when the standby does not hold a copy of
the slot its promotion keeps, or when the copy trails the slot by more than the threshold: a
failover to it would need a resync (:mod:`dpone_dagster.replication.failover`).
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from dpone_dagster.dagster.metadata.keys.base import bullets
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.keys.replication import (
    ReplicationMetadataSet,
    SlotMetadataSet,
)
from dpone_dagster.dagster.metadata.keys.stream_check import StreamCheckMetadataSet
from dpone_dagster.dagster.metadata.parts import schema_change_metadata
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.changes import lsn_text
from dpone_dagster.replication.failover import StandbySlot
from dpone_dagster.replication.join import rows_loaded
from dpone_dagster.replication.replication_report import ReplicationReport, TableChanges
from dpone_dagster.replication.slot_health import SlotStatus, SlotWait

SLOT_CHECK_NAME = "dpone_slot_healthy"
"""The name of the asset check on a replicated table's slot."""

AT_RISK = ("unreserved", "lost")
"""The ``wal_status`` values that fail the check: WAL the slot needs is, or may be, gone."""


def slot_metadata(status: SlotStatus) -> dict[str, Any]:
    """The slot's figures as numbers (``safe_wal_size`` left out when unlimited), and the open
    transactions that hold its WAL back: their age as a number (0 when none does), each of
    them as JSON."""
    held = status.held_by
    ages = [h.seconds for h in held if h.seconds is not None]
    return {
        **ReplicationMetadataSet(slot=status.slot),
        **SlotMetadataSet(
            wal_status=status.wal_status,
            safe_wal_size=status.safe_wal_size,
            lag_bytes=status.lag_bytes,
            retained_wal_bytes=status.retained_bytes,
            slot_held_seconds=max(ages) if ages else (None if held else 0.0),
            slot_held_by=dg.JsonMetadataValue([h.as_dict() for h in held]) if held else None,
            slot_failover=status.failover,
        ),
    }


def standby_metadata(standby: StandbySlot | None) -> dict[str, Any]:
    """Whether the standby holds a copy of the slot, and how far it trails (empty without a
    standby)."""
    if standby is None:
        return {}
    return dict(
        SlotMetadataSet(
            standby_holds_slot=standby.holds,
            standby_slot_lag_bytes=standby.lag_bytes if standby.holds else None,
        )
    )


def slot_check(
    key: dg.AssetKey,
    slot: str,
    status: SlotStatus | None,
    warn_bytes: int,
    standby: StandbySlot | None = None,
) -> dg.AssetCheckResult:
    """``dpone_slot_healthy`` of one table of the group.

    Fails with severity ``ERROR`` when the slot is missing, ``unreserved`` or ``lost``; with
    severity ``WARN`` when it retains more than ``warn_bytes`` of WAL, or when ``standby`` (the
    source's standby, when known) does not hold a copy of it or its copy trails by more than
    ``warn_bytes``; passes otherwise.
    """
    threshold = dict(SlotMetadataSet(retained_wal_warn_bytes=warn_bytes))
    if status is None:
        metadata = {**threshold, **ReplicationMetadataSet(slot=slot)}
    else:
        metadata = {**slot_metadata(status), **threshold}
    metadata.update(standby_metadata(standby))
    failure = _slot_failure(slot, status, warn_bytes, standby)
    if failure is None:
        return dg.AssetCheckResult(
            asset_key=key, check_name=SLOT_CHECK_NAME, passed=True, metadata=metadata
        )
    severity, description = failure
    if status is not None and status.held_by:
        actions = dg.MetadataValue.md(bullets(held_actions(status)))
        metadata.update(CommonMetadataSet(next_actions=actions))
    return dg.AssetCheckResult(
        asset_key=key, check_name=SLOT_CHECK_NAME, passed=False, severity=severity,
        description=description, metadata=metadata,
    )  # fmt: skip


def _slot_failure(
    slot: str, status: SlotStatus | None, warn_bytes: int, standby: StandbySlot | None = None
) -> tuple[dg.AssetCheckSeverity, str] | None:
    """Why the slot fails its check, and how badly (``None``: it passes)."""
    if status is None:
        return dg.AssetCheckSeverity.ERROR, f"Slot {slot} does not exist on the source."
    if status.wal_status in AT_RISK:
        what = "has lost WAL it needed" if status.wal_status == "lost" else "may lose WAL"
        return dg.AssetCheckSeverity.ERROR, (
            f"Slot {slot} is {status.wal_status}: it {what} "
            "(max_slot_wal_keep_size); resync the group."
        )
    warnings = []
    if status.held_by:
        warnings.append(held_description(status))
    retained = status.retained_bytes
    if retained > warn_bytes:
        warnings.append(
            f"Slot {slot} retains {retained} bytes of WAL, over {warn_bytes}: "
            + (
                "see the transaction above."
                if status.held_by
                else "run the group more often, or drop the slot if the group is gone."
            )
        )
    if standby is not None:
        warnings.extend(_standby_warnings(slot, status, standby, warn_bytes))
    return (dg.AssetCheckSeverity.WARN, " ".join(warnings)) if warnings else None


def _standby_warnings(
    slot: str, status: SlotStatus, standby: StandbySlot, warn_bytes: int
) -> list[str]:
    """Why a promotion of the standby would not keep the group going (empty: it would)."""
    if not standby.holds:
        why = (
            "the slot is not a failover slot (the group's failover option, PostgreSQL 17+)"
            if status.failover is False
            else standby.describe()
        )
        return [
            f"Slot {slot} would not survive a failover: {why}. A promoted standby without it "
            "fails the group with replication_failover_slot_missing (a resync); see "
            "docs/replication.md, Failover."
        ]
    if standby.lag_bytes is not None and standby.lag_bytes > warn_bytes:
        return [
            f"The standby's copy of slot {slot} trails it by {standby.lag_bytes} bytes of WAL, "
            f"over {warn_bytes}: is the standby's slot sync running (sync_replication_slots, "
            "hot_standby_feedback)?"
        ]
    return []


HELD_SHOWN = 3
"""Holders a description names (the oldest; the metadata lists every one)."""


def held_description(status: SlotStatus) -> str:
    """Why the slot's WAL is held back, naming the open transactions that hold it (the
    oldest :data:`HELD_SHOWN`), and what to do."""
    held = status.held_by
    named = "; ".join(h.describe() for h in held[:HELD_SHOWN])
    more = f"; and {len(held) - HELD_SHOWN} more" if len(held) > HELD_SHOWN else ""
    which = "an open transaction" if len(held) == 1 else f"{len(held)} open transactions"
    return (
        f"Slot {status.slot}'s WAL is held back by {which} on the source ({named}{more}): "
        f"the slot keeps every WAL byte written since it began ({status.retained_bytes} "
        "bytes now), however often the group runs; the runs still apply everything "
        "committed. " + " ".join(held_actions(status))
    )


def held_actions(status: SlotStatus) -> list[str]:
    """What to do about the transactions holding the slot back: end them, have the server end
    idle ones, bound what a slot may keep."""
    pids = ", ".join(str(h.pid) for h in status.held_by)
    keep = (
        "raise max_slot_wal_keep_size if the source's disk can afford it "
        f"({status.safe_wal_size} bytes left before the slot is lost)"
        if status.safe_wal_size is not None
        else "set max_slot_wal_keep_size (unlimited now) so that a stuck transaction costs a "
        "resync of the group instead of the source's disk"
    )
    return [
        f"End it: commit or roll back in its application, or SELECT pg_terminate_backend(pid) "
        f"on the source (pid {pids}).",
        "Set idle_in_transaction_session_timeout on the source (ALTER ROLE ... SET, or for the "
        "server) so that sessions left idle in a transaction end by themselves.",
        f"Or {keep}.",
    ]


def _group_changes(report: ReplicationReport, table: TableName) -> dict[str, Any]:
    """The group's changes of the run (tables joined, left, partitions merged) and the table's
    sequences, each left out when empty."""

    def listed(values: Sequence[object]) -> dg.JsonMetadataValue | None:
        return dg.JsonMetadataValue(list(values)) if values else None

    return dict(
        ReplicationMetadataSet(
            tables_joined=listed([t.qualified for t in report.tables_joined]),
            tables_left=listed([t.qualified for t in report.tables_removed]),
            partitions_merged=listed([t.qualified for t in report.partitions_merged]),
            sequences=listed([s.as_json() for s in report.sequences if s.table == table]),
        )
    )


def replication_metadata(
    report: ReplicationReport, table: TableChanges | None, source_table: TableName
) -> dict[str, Any]:
    """A table's materialization: its changes by kind (none when the run had none for it), the
    group's run and slot, as numbers; the group's changes and the table's sequences."""
    copies = (*([report.initial_copy] if report.initial_copy else []), *report.join_copies)
    copied = rows_loaded(copies).get(source_table)
    metadata: dict[str, Any] = {
        **CommonMetadataSet(
            rows_inserted=table.inserted if table else 0,
            rows_updated=table.updated if table else 0,
            rows_deleted=table.deleted if table else 0,
            rows_loaded=copied,
            lag_seconds=report.lag_seconds,
        ),
        **ReplicationMetadataSet(
            publication=report.group.publication,
            truncates=table.truncated if table else 0,
            rows_truncated=table.truncated if table else 0,  # deprecated: dpone/truncates
            transactions=report.transactions,
            transactions_skipped=report.skipped_transactions,
            upto_lsn=lsn_text(report.upto_lsn),
            budget_reached=report.budget_reached,
            initial_copy=report.initial_copy is not None or source_table in report.tables_joined,
        ),
        **StreamCheckMetadataSet(applied_lsn=lsn_text(report.applied_lsn)),
        **slot_metadata(report.slot),
        **_group_changes(report, source_table),
    }
    metadata.update(schema_change_metadata(table.schema_changes if table else ()))
    return metadata


# -- the run's log -------------------------------------------------------------------------------


def run_summary(report: ReplicationReport, checks: Sequence[dg.AssetCheckResult]) -> str:
    """The one line a run writes to its log once it has applied (where the person on call looks
    first): the transactions and each table's changes, the lag, the WAL the slot retains (and
    what holds it), and each check's verdict.

    Args:
        report: The run's report.
        checks: The check results the run reported (``dpone_slot_healthy``,
            ``dpone_reconciled``).
    """
    slot = report.slot
    held = ", ".join(str(h.pid) for h in slot.held_by)
    tables = "; ".join(
        f"{t.table}: inserted {t.inserted}, updated {t.updated}, deleted {t.deleted}, "
        f"truncates {t.truncated}"
        for t in report.tables
    )
    skipped = f" ({report.skipped_transactions} read again, skipped)"
    lag = "unknown" if report.lag_seconds is None else f"{report.lag_seconds:.3f} s"
    parts = [
        f"dpone: replication slot {slot.slot}: applied {report.transactions} source "
        f"transaction(s) up to {lsn_text(report.applied_lsn)}"
        + (skipped if report.skipped_transactions else "")
        + (", stopped by max_changes_per_run" if report.budget_reached else ""),
        tables,
        f"lag {report.lag_bytes} bytes, {lag}",
        f"slot retains {slot.retained_bytes} bytes of WAL ({slot.wal_status})"
        + (f", held back by pid {held}" if held else ""),
        "checks: " + (check_verdicts(checks) or "none selected"),
    ]
    return "; ".join(parts)


def check_verdicts(checks: Sequence[dg.AssetCheckResult]) -> str:
    """Each check's verdict over the group's tables: ``passed`` (how many), or its severity
    with the tables it concerns.

    Examples:
        >>> ok = dg.AssetCheckResult(asset_key="a", check_name="c", passed=True)
        >>> bad = dg.AssetCheckResult(asset_key="b", check_name="c", passed=False)
        >>> check_verdicts([ok, bad])
        'c: passed on 1, ERROR on 1 (b)'
    """
    by_name: dict[str, dict[str, list[str]]] = {}
    for check in checks:
        if check.passed:
            verdict = "passed"
        else:
            verdict = (check.severity or dg.AssetCheckSeverity.ERROR).value
        key = check.asset_key.to_user_string() if check.asset_key else "?"
        by_name.setdefault(str(check.check_name), {}).setdefault(verdict, []).append(key)
    return "; ".join(
        f"{name}: "
        + ", ".join(
            f"{verdict} on {len(keys)}" + ("" if verdict == "passed" else f" ({', '.join(keys)})")
            for verdict, keys in verdicts.items()
        )
        for name, verdicts in by_name.items()
    )


def slot_wait_message(wait: SlotWait, pool: str | None) -> tuple[str, str]:
    """The log level and line of a run's wait for its slot (its start, or its end).

    Args:
        wait: The wait, as the engine reports it.
        pool: The op's concurrency pool (the advice names it).
    """
    holder = f"the session of pid {wait.holder_pid}"
    if not wait.done:
        queue = (
            f"give its pool {pool!r} a limit of 1 (dagster instance concurrency set {pool} 1) "
            "with concurrency.pools.granularity: run in the instance's dagster.yaml"
            if pool
            else "give the group a pool (pool=) of limit 1"
        )
        return "warning", (
            f"dpone: replication slot {wait.slot} is held by {holder} (another run of this "
            "group, or a killed run's server process still decoding): this run waits for it, "
            f"for at most {wait.timeout:g} s (lock_wait). So that an overlapping run waits in "
            f"Dagster's queue instead, {queue}."
        )
    if wait.released:
        return "info", (
            f"dpone: replication slot {wait.slot} was let go by {holder} after "
            f"{wait.waited:.1f} s of waiting; the run goes on."
        )
    return "warning", (
        f"dpone: replication slot {wait.slot} is still held by {holder} after {wait.waited:.1f} "
        "s of waiting; the run stops (replication_slot_active)."
    )
