"""Tables that join a streaming group, copied alone under a snapshot whose place in its stream
is known.

:func:`join_tables` runs after the publication names the joining tables (its ``ALTER
PUBLICATION ... ADD TABLE`` committed, :mod:`.follow`). It creates a ``TEMPORARY`` logical slot
with an exported snapshot on a replication connection: every source transaction that committed
before the slot's consistent point ``P`` is in the snapshot, every later one comes after ``P``
in the group's own slot, and the publication already names the tables there. The tables are
copied under that snapshot (``replace``) and their rows commit with the ledger's record of each
table and of ``P`` (:attr:`~.group_state.TableState.start`); from then on the stream applies a
joined table's changes only in source transactions that commit after ``P`` (:mod:`.stream`).
The other tables are neither copied nor paused beyond this run: it streams them right after.

New partitions of a streaming partitioned table (:mod:`.partitions`) are merged into its target
under the same snapshot, their rows committed with the ledger's record of the partitions; the
stream then replays their changes from the group's applied position on top (each carries its
whole row, so every row ends as the source has it).

A copy commits only while the group's applied position is at or before ``P``: a run that
streamed past ``P`` meanwhile has already skipped the table's changes up to its own position,
so the copy is refused (``replication_join_overtaken``, nothing written). ``kill -9`` at any
moment: the temporary slot ends with its session; before the copy commits the ledger does not
hold the table (the next run copies it again), after it, it does (the next run streams it).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_plan import Sink, TableMapping
from dpone_dagster.snapshot_copy.copy_report import CopyReport

from .changes import Lsn, lsn_text
from .copying import GroupContext, copy_under
from .group_state import TableState
from .slot import create_slot

Members = dict[TableName, TableState]


@dataclass(frozen=True)
class Joining:
    """What a run copies before it streams, and what the ledger then holds.

    Attributes:
        whole: Tables copied whole (``replace``): tables that join the group, and partitioned
            tables copied again.
        merge: New partitions and their partitioned table, ``(partition, parent)``: merged.
        members: Every table of the group and what the ledger holds of it once the copies
            committed (a whole table's ``start`` is set to the copy's snapshot).
    """

    whole: tuple[TableName, ...]
    merge: tuple[tuple[TableName, TableName], ...]
    members: Mapping[TableName, TableState]

    def __bool__(self) -> bool:
        return bool(self.whole or self.merge)


@dataclass(frozen=True)
class Joined:
    """What :func:`join_tables` copied.

    Attributes:
        start: The consistent point of the snapshot the copies read under.
        copies: The snapshot copies' reports (the whole tables', then the partitions').
    """

    start: Lsn
    copies: tuple[CopyReport, ...]


def join_tables(context: GroupContext, joining: Joining) -> Joined:
    """Copies ``joining`` under one new snapshot (see the module); the ledger holds
    ``joining.members`` once both copies committed.

    Raises:
        EngineError: ``replication_join_overtaken``; the slot codes of
            :func:`~.slot.create_slot` (``replication_slots_exhausted``,
            ``replication_senders_exhausted``...).
        CopyError: a copy failed, nothing of it committed.
    """
    group = context.group
    name = f"{group.slot[:44]}_join_{secrets.token_hex(4)}"
    context.progress("joining")
    with create_slot(context.source, name, context.options, temporary=True) as created:
        point, copies = created.consistent_point, []
        merged = {root for _, root in joining.merge}
        if joining.whole:

            def whole(members: Members) -> Members:
                final = {t: replace(s, start=point) if t in joining.whole else s
                         for t, s in joining.members.items()}  # fmt: skip
                for root in merged:  # recorded with their own copy, below
                    final[root] = replace(final[root], leaves=members[root].leaves)
                return final

            copies.append(copy_under(context, joining.whole, created.snapshot, sink=Sink.REPLACE,
                                     before_commit=_recording(context, point, whole)))  # fmt: skip
        if joining.merge:

            def partitions(members: Members) -> Members:
                return {**members, **{r: joining.members[r] for r in merged}}

            mappings = [TableMapping(leaf, root) for leaf, root in joining.merge]
            recording = _recording(context, point, partitions)
            copies.append(copy_under(context, mappings, created.snapshot, sink=Sink.MERGE,
                                     before_commit=recording))  # fmt: skip
    context.progress("joined")
    return Joined(point, tuple(copies))


def _recording(
    context: GroupContext, point: Lsn, write: Callable[[Members], Members]
) -> Callable[[Connection], None]:
    """The copy's ``before_commit``: under the group's lock, refuses a group whose applied
    position reached ``point``, else records ``write`` of the ledger's members."""
    ledger, slot = context.ledger, context.group.slot

    def record(conn: Connection) -> None:
        ledger.lock(conn, slot)
        state = ledger.fetch(conn, slot)
        if state is None or state.applied_lsn is None:
            raise engine_error("replication_failed", "The group's ledger row is gone.")
        if state.applied_lsn >= point:  # a transaction at the point is not in the snapshot
            raise engine_error(
                "replication_join_overtaken",
                f"The group of slot {slot!r} applied up to {lsn_text(state.applied_lsn)}, past "
                f"the copy's snapshot at {lsn_text(point)}.",
            )
        ledger.set_members(conn, slot, write(dict(state.members)))

    return record


def rows_loaded(copies: Sequence[CopyReport]) -> dict[TableName, int]:
    """The rows each target table took from ``copies`` (a parent's partitions summed)."""
    loaded: dict[TableName, int] = {}
    for copy in copies:
        for table in copy.tables:
            loaded[table.target] = loaded.get(table.target, 0) + (table.rows_loaded or 0)
    return loaded
