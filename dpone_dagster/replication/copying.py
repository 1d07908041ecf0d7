"""The group's copies: tables read under a slot's exported snapshot into the target.

The group's initial copy (:mod:`.engine`) and the copy of a table that joins a streaming group
(:mod:`.join`) are the same operation: the snapshot copy engine
(:class:`~dpone_dagster.snapshot_copy.engine.SnapshotCopy`, its receipts) reads the tables
under the snapshot a slot was created with and loads them in one target transaction, in which
``before_commit`` writes the ledger's record of what the rows are (:func:`copy_under`).
:class:`GroupContext` is what a run of the group works with: the group, its ledger, the two
databases and the run's settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg import IsolationLevel, sql

from dpone_dagster.core.sessions import transaction
from dpone_dagster.postgres.connection import Connection, ConnectionOptions
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_plan import Sink, TableSpec
from dpone_dagster.snapshot_copy.copy_report import CopyReport
from dpone_dagster.snapshot_copy.engine import SnapshotCopy
from dpone_dagster.snapshot_copy.options import SnapshotCopyOptions, Strategy
from dpone_dagster.snapshot_copy.tuning import CopyOptions

from .group_plan import ReplicationGroup
from .group_state import GroupLedger
from .slot_health import SlotWait


@dataclass(frozen=True)
class GroupContext:
    """What a run of a group works with.

    Attributes:
        group: The group.
        ledger: Its ledger (in the target database).
        source: The source database's DSN.
        target: The target database's DSN.
        options: The source sessions' options.
        target_options: The target sessions' options.
        owner_comment: The comment the group's own publication carries (:mod:`.setup`).
        slot_wait: Seconds a run waits for the slot while another session holds it.
        progress: Called with each step's phase (:class:`~.replication_report.ReplicationProgress`).
        on_slot_wait: Called when a wait for the slot begins and ends (:func:`~.slot.
            wait_for_slot`).
    """

    group: ReplicationGroup
    ledger: GroupLedger
    source: str
    target: str
    options: ConnectionOptions | None
    target_options: ConnectionOptions | None
    owner_comment: str
    slot_wait: float
    progress: Callable[[str], None]
    on_slot_wait: Callable[[SlotWait], None] | None = None


def copy_under(
    context: GroupContext,
    tables: Sequence[TableSpec],
    snapshot: str,
    *,
    sink: Sink,
    before_commit: Callable[[Connection], None],
) -> CopyReport:
    """Copies ``tables`` (names, or ``(source, target)`` pairs) read under the exported
    ``snapshot`` into the target through ``sink``, ``before_commit`` in the load's transaction.

    Raises:
        CopyError: the copy failed; nothing of it was committed (its report tells how).
        DponeError: the plan's codes (``schema_change_incompatible``, ...), nothing written.
    """
    tuning = CopyOptions(
        snapshot_token=snapshot,
        source_options=context.options or ConnectionOptions(),
        target_options=context.target_options or ConnectionOptions(),
    )
    options = SnapshotCopyOptions(
        strategy=Strategy.BATCHED_COPY,
        sink=sink,
        schema_changes=context.group.options.schema_changes,
    )
    copy = SnapshotCopy(
        context.source, context.target, list(tables), options=options, tuning=tuning
    )
    with copy:
        copy.plan()
        copy.extract()
        return copy.load(before_commit=before_commit)


def filled_targets(tgt: Connection, tables: Sequence[TableName]) -> list[TableName]:
    """The target tables that exist and hold rows."""
    filled = []
    with transaction(tgt, IsolationLevel.READ_COMMITTED, read_only=True):
        for table in tables:
            exists = tgt.execute("SELECT to_regclass(%s)", (table.qualified,)).fetchone()
            if exists is None or exists[0] is None:
                continue
            row = tgt.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table.ident)
            ).fetchone()
            if row is not None and row[0]:
                filled.append(table)
    return filled
