"""A group that goes on from a promoted standby: the source's timeline, the check that the new
history holds what the target applied, and the standby's copy of the slot.

A logical slot lives on one server. PostgreSQL 17 added *failover slots*: a slot created with
``FAILOVER`` is copied to a physical standby that runs with ``sync_replication_slots = on``, so
that after the standby is promoted the slot's reader continues from the copy. The copy's position
trails the primary's (the standby's sync worker reads it every few hundred milliseconds to 30 s),
so after a failover a run re-reads transactions the target already holds: the ledger's applied
position skips them, as after any replay.

Two things can go wrong, and a run refuses both before it writes anything:

- The promoted server has no slot of the group (the standby never held a synchronized copy of
  it): ``replication_failover_slot_missing``. The changes since the target's position are in no
  WAL the group can read.
- The promoted server's history forked *before* what the target holds: the standby had not
  received transactions the target already applied (the primary let the slot's reader get ahead
  of its standby: no ``synchronized_standby_slots``), and the new primary's positions past the
  fork name other transactions, which the ledger would skip as applied:
  ``replication_source_diverged``.

Both are found through the source's *timeline*: a server promoted from a standby (or restored to
a point in time) writes its WAL on a new timeline, and its timeline history names the position
where each earlier timeline ended. The ledger keeps the timeline the group's applied position was
read on (``source_timeline``); a run on a later one checks that the earlier one ended at or past
the target's applied position (:func:`check_timeline`), then records the new one.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.sessions import transaction
from dpone_dagster.postgres.connection import (
    Connection,
    ConnectionOptions,
    SessionError,
    connect,
    describe_dsn,
)

from .changes import Lsn, lsn_text, parse_lsn
from .group_state import GroupLedger, GroupState
from .slot import replication_options, set_failover
from .slot_health import SlotStatus, failover_supported, slot_status

__all__ = ["FailoverSource", "StandbySlot", "check_timeline", "source_timeline", "standby_slot"]


def source_timeline(conn: Connection) -> int:
    """The timeline the source server writes its WAL on (the first eight hexadecimal digits
    of the current WAL segment's name)."""
    row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
    assert row is not None
    return int(str(row[0])[:8], 16)


def timeline_ends(dsn: str, options: ConnectionOptions | None, timeline: int) -> dict[int, Lsn]:
    """Where each timeline before ``timeline`` ended, from its history file (read over a
    replication connection: ``TIMELINE_HISTORY``, which the group's ``REPLICATION`` role may
    run).

    Returns:
        Each earlier timeline of the source's history, and the position it ended at (the
        switch point: WAL before it is the same on both timelines).
    """
    with connect(dsn, replication_options(options), side="source", autocommit=True) as conn:
        row = conn.execute(f"TIMELINE_HISTORY {int(timeline)}").fetchone()
    assert row is not None
    content = row[1]
    text = bytes(content).decode() if not isinstance(content, str) else content
    ends = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit():  # "<timeline> <switch point> <reason>"
            ends[int(fields[0])] = parse_lsn(fields[1])
    return ends


def check_timeline(
    conn: Connection,
    *,
    dsn: str,
    options: ConnectionOptions | None,
    slot: str,
    recorded: int | None,
    applied_end: Lsn,
) -> int:
    """The source's timeline, once it is known to hold everything the target applied.

    Args:
        conn: A session of the source database.
        dsn: The source's DSN (the timeline history is read on a replication connection).
        options: The sessions' options.
        slot: The group's slot.
        recorded: The timeline the ledger's applied position was read on (None: not recorded
            yet, a ledger from before this check; the current timeline is taken as it).
        applied_end: The end of the last applied transaction's commit record.

    Returns:
        The source's current timeline (to record when it is not ``recorded``).

    Raises:
        EngineError: ``replication_source_diverged`` (the history forked before
            ``applied_end``, or does not come from ``recorded``),
            ``replication_failover_slot_missing`` (a later timeline, and no slot).
    """
    current = source_timeline(conn)
    if recorded is None or current == recorded:
        return current
    where = describe_dsn(dsn)
    ends = {} if current < recorded else timeline_ends(dsn, options, current)
    end = ends.get(recorded)
    if end is None or end < applied_end:
        forked = (
            f"its history does not pass through timeline {recorded}"
            if end is None
            else f"timeline {recorded} ended at {lsn_text(end)}"
        )
        raise engine_error(
            "replication_source_diverged",
            f"The source {where} writes on timeline {current}, and {forked}: before "
            f"{lsn_text(applied_end)}, the end of the last transaction the target applied "
            f"(read on timeline {recorded}).",
        )
    if slot_status(conn, slot, holders=False) is None:
        raise engine_error(
            "replication_failover_slot_missing",
            f"The source {where} was promoted (timeline {recorded} ended at {lsn_text(end)}; "
            f"it writes on timeline {current} now) and has no replication slot {slot!r}.",
        )
    return current


@dataclass(frozen=True, slots=True)
class StandbySlot:
    """A standby's copy of the group's slot, read on the standby.

    Attributes:
        standby: The standby, as ``host:port/dbname`` (never a password).
        in_recovery: The server is a standby (a promoted one is not).
        present: It has a slot of the group's name.
        synced: The slot is a copy the standby's sync worker keeps (``synced``).
        persistent: The copy is kept (not ``temporary``: the sync worker persists a copy once
            the primary's slot has moved past where the standby could start decoding; a
            temporary copy is dropped at promotion).
        invalidation_reason: Why the standby invalidated its copy (None: valid).
        confirmed_flush_lsn: The copy's confirmed position (None when absent or not set).
        lag_bytes: How far the copy's confirmed position trails the primary's slot (None when
            either is unknown): the transactions a run re-reads, and skips, after a failover.
        error: Why the standby could not be read (None: it was).
    """

    standby: str
    in_recovery: bool = False
    present: bool = False
    synced: bool = False
    persistent: bool = False
    invalidation_reason: str | None = None
    confirmed_flush_lsn: Lsn | None = None
    lag_bytes: int | None = None
    error: str | None = None

    @property
    def holds(self) -> bool:
        """The standby holds a copy of the slot a promotion keeps."""
        return (
            self.in_recovery
            and self.present
            and self.synced
            and self.persistent
            and self.invalidation_reason is None
        )

    def describe(self) -> str:
        """Why the standby does not hold the slot (empty when it does)."""
        if self.error is not None:
            return f"standby {self.standby} could not be read: {self.error}"
        if not self.in_recovery:
            return f"{self.standby} is not a standby (not in recovery)"
        if not self.present:
            return f"standby {self.standby} has no copy of the slot"
        if not self.synced:
            return f"standby {self.standby}'s slot of that name is not a synchronized copy"
        if self.invalidation_reason is not None:
            return f"standby {self.standby} invalidated its copy ({self.invalidation_reason})"
        if not self.persistent:
            return (
                f"standby {self.standby}'s copy is still temporary (the primary's slot has not "
                "moved past where the standby can decode from yet)"
            )
        return ""


_STANDBY = (
    "SELECT pg_is_in_recovery(), s.synced, s.temporary, s.invalidation_reason,"
    " (s.confirmed_flush_lsn - '0/0'::pg_lsn)::int8"
    " FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_replication_slots AS s"
    " ON s.slot_name = %s"
)


def standby_slot(
    dsn: str, slot: str, primary: SlotStatus | None, options: ConnectionOptions | None = None
) -> StandbySlot:
    """The standby's copy of ``slot`` (never raises: a standby that cannot be read is
    reported, with why).

    Args:
        dsn: A DSN of the standby (any database of it).
        slot: The group's slot.
        primary: The primary's slot, for the copy's lag.
        options: The session's options.
    """
    where = describe_dsn(dsn)
    try:
        with connect(dsn, options, side="source", autocommit=True) as conn:
            if not failover_supported(conn):
                return StandbySlot(where, error="the standby runs a PostgreSQL before 17")
            row = conn.execute(_STANDBY, (slot,)).fetchone()
    except (SessionError, psycopg.Error) as exc:
        return StandbySlot(where, error=str(getattr(exc, "message", exc)).splitlines()[0])
    assert row is not None
    recovery, synced, temporary, reason, confirmed = row
    lag = None
    if confirmed is not None and primary is not None and primary.confirmed_flush_lsn:
        lag = max(0, primary.confirmed_flush_lsn - int(confirmed))
    return StandbySlot(
        standby=where,
        in_recovery=bool(recovery),
        present=synced is not None,
        synced=bool(synced),
        persistent=temporary is False,
        invalidation_reason=reason,
        confirmed_flush_lsn=None if confirmed is None else int(confirmed),
        lag_bytes=lag,
    )


@dataclass(frozen=True)
class FailoverSource:
    """What a run of a group does about a failover of its source, around its apply.

    Attributes:
        dsn: The source's DSN.
        options: The source sessions' options.
        slot: The group's slot.
        failover: The group's option (:attr:`~.group_plan.ReplicationGroup.failover`): ``None`` a
            failover slot where the source has them, ``True`` required, ``False`` a plain slot.
        standby: A DSN of the source's standby (its copy of the slot is read at the run's
            end), or None.
    """

    dsn: str
    options: ConnectionOptions | None
    slot: str
    failover: bool | None
    standby: str | None = None

    def refuse_unsupported(self, source: Connection) -> None:
        """Refuses ``failover=True`` on a source that has no failover slots.

        Raises:
            EngineError: ``replication_failover_unsupported``.
        """
        if self.failover and not failover_supported(source):
            raise engine_error(
                "replication_failover_unsupported",
                f"The source runs PostgreSQL {source.info.server_version // 10000}.",
            )

    def wanted(self, source: Connection) -> bool:
        """The group's slot should be a failover slot."""
        return failover_supported(source) if self.failover is None else self.failover

    def follow_timeline(
        self, control: Connection, tgt: Connection, state: GroupState, ledger: GroupLedger
    ) -> None:
        """Checks that the source's history holds what the target applied (a source promoted
        from a standby, :func:`check_timeline`), and records its timeline when it changed.

        Raises:
            EngineError: ``replication_source_diverged``, ``replication_failover_slot_missing``.
        """
        applied = state.applied_end_lsn or state.applied_lsn or 0
        timeline = check_timeline(control, dsn=self.dsn, options=self.options, slot=self.slot,
                                  recorded=state.source_timeline, applied_end=applied)  # fmt: skip
        if timeline == state.source_timeline:
            return
        with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
            ledger.lock(tgt, self.slot)
            ledger.set_timeline(tgt, self.slot, timeline)

    def slot_end(
        self, control: Connection, status: SlotStatus
    ) -> tuple[SlotStatus, StandbySlot | None]:
        """The slot after the run (made a failover slot when the group wants one and it is
        not), and the standby's copy of it when the standby is known."""
        if status.failover is False and self.wanted(control):
            set_failover(self.dsn, self.slot, self.options)
            changed = slot_status(control, self.slot)
            assert changed is not None
            status = changed
        if self.standby is None:
            return status, None
        return status, standby_slot(self.standby, self.slot, status, self.options)
