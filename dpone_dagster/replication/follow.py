"""A streaming group meets its definition again at each run, before it streams.

:func:`follow_group` compares the group (its tables) with what the ledger and the source hold,
and brings them together without copying or pausing the tables that did not change:

- a table **joins** the group when the group names it and it is not streaming: the ledger does
  not hold it, or the publication no longer names it, or names it by another entry than the one
  the ledger recorded (dropped from the publication and added again by hand: its changes in
  between were not sent). It is copied alone (:mod:`.join`), under a snapshot taken after the
  publication named it. A joining table whose target already holds rows is refused
  (``replication_target_exists``) unless the run adopts it;
- a table **leaves** the group when the ledger holds it and the group no longer names it: the
  publication drops it, the stream no longer applies it, its target table is kept as it is, and
  the run's report names it (``tables_removed``);
- a partitioned table whose partitions changed is merged or copied again (:mod:`.partitions`);
  one the publication did not publish through its root (a group made by a release before it
  did) is copied again alone, after the option is turned on;
- the publication is made to name exactly the group's tables, after the setup's refusals
  (:func:`~.setup.check_replication_setup`: ownership, identity, a partition named with its
  parent, a table dropped at the source, a publication of the name another tool made). A
  publication that no longer exists is refused: its slot's changes since it went cannot be
  decoded.

A run whose group did not change reads the slot's state, the publication and the partition
trees (three queries: the slot's on the source session, the other two meanwhile on the control
session, and again after a wait for the slot) and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from psycopg import IsolationLevel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.sessions import Sessions, transaction
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.threads import at_once
from dpone_dagster.snapshot_copy.copy_report import CopyReport

from .copying import GroupContext, filled_targets
from .group_plan import refuse_keyless
from .group_state import GroupState, TableState
from .join import Joining, join_tables
from .partitions import PartitionTree, TreeChange, compare, partition_trees
from .publication import Publication, ensure_publication, read_publication
from .setup import check_replication_setup
from .slot import wait_for_slot
from .slot_health import SlotStatus, SlotWait


@dataclass(frozen=True)
class GroupChange:
    """What :func:`follow_group` changed.

    Attributes:
        joined: Tables copied alone this run (joined, or copied again).
        merged: New partitions whose rows were merged into their parent's target.
        left: Tables that left the group.
        copies: The snapshot copies' reports.
    """

    joined: tuple[TableName, ...] = ()
    merged: tuple[TableName, ...] = ()
    left: tuple[TableName, ...] = ()
    copies: tuple[CopyReport, ...] = field(default=())


def follow_group(
    context: GroupContext,
    sessions: Sessions,
    control: Connection,
    state: GroupState,
    *,
    adopt: bool,
) -> GroupChange:
    """Brings the source's publication, the ledger and the target to the group (see the
    module); ``control`` is another session of the source.

    Raises:
        EngineError: ``replication_group_changed`` (another publication),
            ``replication_slot_missing``, ``replication_standby_slot_missing``,
            ``replication_publication_missing``,
            ``replication_slot_foreign``, ``replication_target_exists``, the codes of
            :func:`~.setup.check_replication_setup` and of :func:`~.join.join_tables`.
    """
    group, src = context.group, sessions.source
    if state.publication != group.publication:  # its tables' history is another's
        raise engine_error(
            "replication_group_changed",
            f"The group of slot {group.slot!r} reads publication {state.publication!r}, "
            f"not {group.publication!r}.",
            ["Name the publication the group was created with, or run once with "
             "resync=True to start over with the new one."],
        )  # fmt: skip
    status, found, trees = _read_source(context, src, control)
    if status is None:
        raise engine_error(
            "replication_slot_missing",
            f"The source has no replication slot {group.slot!r}, which the ledger's group "
            "reads; nothing was changed.",
        )
    if status.failover and status.missing_standbys:  # its read would wait for them forever
        raise engine_error(
            "replication_standby_slot_missing",
            f"synchronized_standby_slots names {', '.join(status.missing_standbys)}, which "
            f"the source {src.info.dbname!r} has no valid physical slot of.",
        )
    publication = _own_publication(context, found)
    joining, left = _plan(context, state, publication, trees)
    if not (joining or left or set(publication.tables) != set(group.tables)):
        if joining.members != dict(state.members):  # what a ledger before entries lacked
            _record(context, sessions, joining)
        return GroupChange()
    check_replication_setup(src, slot=group.slot, publication=group.publication,
                            tables=group.tables, owner_comment=context.owner_comment,
                            replicated=state.tables)  # fmt: skip
    refuse_keyless(src, group)
    new = [t for t in joining.whole if t not in state.members]
    filled = filled_targets(sessions.target, new)
    if filled and not adopt:
        raise engine_error(
            "replication_target_exists",
            f"Target table(s) {', '.join(map(str, filled))} of table(s) joining the group "
            "already hold rows.",
        )
    ensure_publication(src, group.publication, group.tables, comment=context.owner_comment)
    published = read_publication(src, group.publication)
    joining = replace(joining, members=with_entries(joining.members, published))
    copies = (
        join_tables(context, joining).copies if joining else _record(context, sessions, joining)
    )
    merged = tuple(leaf for leaf, _ in joining.merge)
    return GroupChange(joining.whole, merged, left, copies)


def _read_source(
    context: GroupContext, src: Connection, control: Connection
) -> tuple[SlotStatus | None, Publication | None, dict[TableName, PartitionTree]]:
    """The slot's state, once no other session holds it (waited for as long as a lock is,
    ``lock_wait``, before the publication is touched), with the publication and the partition
    trees, read meanwhile on ``control`` and again when the slot was held (the run that held
    it may have changed them)."""
    group, waits = context.group, list[SlotWait]()

    def waiting(wait: SlotWait) -> None:
        waits.append(wait)
        if context.on_slot_wait is not None:
            context.on_slot_wait(wait)

    status, (found, trees) = at_once(
        partial(wait_for_slot, src, group.slot, context.slot_wait, waiting),
        partial(_source_group, control, group.publication, group.tables),
    )
    if waits:
        found, trees = _source_group(control, group.publication, group.tables)
    return status, found, trees


def _source_group(
    conn: Connection, publication: str, tables: tuple[TableName, ...]
) -> tuple[Publication | None, dict[TableName, PartitionTree]]:
    """The publication and the group's partition trees, as the source has them now."""
    return read_publication(conn, publication), partition_trees(conn, tables)


def with_entries(
    members: Mapping[TableName, TableState], publication: Publication | None
) -> dict[TableName, TableState]:
    """``members`` recording the publication's entry of each table (:mod:`.group_state`)."""
    entries = {} if publication is None else publication.entries
    return {t: replace(m, entry=entries.get(t)) for t, m in members.items()}


def _record(context: GroupContext, sessions: Sessions, joining: Joining) -> tuple[()]:
    """Records ``joining.members`` in the ledger, in a target transaction of its own."""
    tgt, slot = sessions.target, context.group.slot
    with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=False):
        context.ledger.lock(tgt, slot)
        context.ledger.set_members(tgt, slot, joining.members)
    return ()


def _own_publication(context: GroupContext, found: Publication | None) -> Publication:
    """The group's publication; refuses one that is gone (another tool's of the name is
    refused by :func:`~.setup.check_replication_setup` before the run would change it)."""
    if found is None:
        raise engine_error(
            "replication_publication_missing",
            f"Publication {context.group.publication!r}, which slot {context.group.slot!r} "
            "decodes, does not exist at the source.",
        )
    return found


def _plan(
    context: GroupContext,
    state: GroupState,
    publication: Publication,
    trees: dict[TableName, PartitionTree],
) -> tuple[Joining, tuple[TableName, ...]]:
    """What joins (whole, or by new partitions) and what leaves; what the ledger then holds."""
    tables, entries = context.group.tables, publication.entries
    streaming = {
        t for t in tables
        if t in state.members and t in entries and state.members[t].entry in (None, entries[t])
    }  # fmt: skip
    whole = [t for t in tables if t not in streaming]
    merge: list[tuple[TableName, TableName]] = []
    members: dict[TableName, TableState] = {}
    for table in tables:
        held = state.members[table] if table in streaming else TableState()
        tree = trees.get(table)
        members[table] = TableState(held.start, None if tree is None else tree.leaves,
                                    entries.get(table))  # fmt: skip
        if tree is None or table not in streaming:
            continue
        change = compare(tree, held.leaves) if publication.via_root else TreeChange(True)
        if change is not None and change.copy_again:
            whole.append(table)
        elif change is not None:
            merge.extend((leaf, table) for leaf in change.merge)
    left = tuple(t for t in state.tables if t not in tables)
    return Joining(tuple(whole), tuple(merge), members), left
