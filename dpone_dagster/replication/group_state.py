"""A replication group's durable state in the ledger (``replication_groups``, migration 4).

One row per group, keyed by its slot. It is written before the slot is created (phase
``copying``: the slot is this ledger's from then on), becomes ``streaming`` in the initial
copy's own transaction (with the slot's consistent point), and its applied position moves in
the same target transaction as the rows of the source transactions it covers. Every write runs
under the group's advisory lock, taken by the caller's transaction (:meth:`GroupLedger.lock`).

Its ``tables`` hold, per table, ``[schema, name]``, or ``[schema, name, state]`` where ``state``
(:class:`TableState`) says where the table joined the stream (a table copied alone after the
group's initial copy, :mod:`.join`) and, for a partitioned table, which partitions the target
holds the rows of (:mod:`.partitions`), and under ``kept`` the catalogs the table's last plan
read (:mod:`.kept_catalogs`; a rewrite of the tables drops them, and the next plan reads the
catalogs again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from psycopg.types.json import Jsonb

from dpone_dagster.core.ledger import LedgerStore
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName

from .changes import Lsn, lsn_text, parse_lsn

Phase = Literal["copying", "streaming"]

Leaves = frozenset[tuple[int, int]]
"""A partitioned table's leaf partitions: each one's OID and ``pg_relation_filenode``."""


@dataclass(frozen=True)
class TableState:
    """What the ledger holds of one table of the group, beyond its name.

    Attributes:
        start: The consistent point of the snapshot the table was copied under when it joined
            a streaming group (None: the group's initial copy): the stream applies its changes
            only in source transactions that commit after it.
        leaves: For a partitioned table, the partitions whose rows the target holds (None for
            another table, or a partitioned table of a ledger written before they were kept).
        entry: The OID of the table's ``pg_publication_rel`` row while the group streamed it
            (None: not known yet): another one means the publication lost the table meanwhile.
    """

    start: Lsn | None = None
    leaves: Leaves | None = None
    entry: int | None = None


@dataclass(frozen=True)
class GroupState:
    """A group's row of the ledger.

    Attributes:
        slot: The slot (the row's key).
        publication: The publication.
        tables: The group's tables when the row was last written.
        phase: ``copying`` (the initial copy has not committed) or ``streaming``.
        consistent_lsn: The slot's consistent point (where the initial copy's snapshot is).
        applied_lsn: The commit LSN of the last source transaction applied (the consistent
            point after the initial copy): a transaction that commits at or before it is
            skipped.
        applied_end_lsn: The end of that transaction's commit record (where the slot is
            advanced to).
        applied_commit_time: When that transaction committed at the source.
        transactions: Source transactions applied since the initial copy.
        members: Each table's :class:`TableState`, by table (every table of ``tables``).
        source_timeline: The source's timeline the applied position was read on (None: not
            recorded yet; :mod:`.failover`).
        kept: Each table's kept catalogs, as the ledger's document (:mod:`.kept_catalogs`
            reads it), by table (a table whose plan kept none is absent).
    """

    slot: str
    publication: str
    tables: tuple[TableName, ...]
    phase: Phase
    consistent_lsn: Lsn | None
    applied_lsn: Lsn | None
    applied_end_lsn: Lsn | None
    applied_commit_time: datetime | None
    transactions: int
    members: Mapping[TableName, TableState] = field(default_factory=dict)
    source_timeline: int | None = None
    kept: Mapping[TableName, object] = field(default_factory=dict)

    @property
    def starts(self) -> dict[TableName, Lsn]:
        """The tables that joined the stream after the initial copy, and where."""
        return {t: m.start for t, m in self.members.items() if m.start is not None}


_FETCH = (
    "SELECT slot, publication, tables, phase, consistent_lsn::text, applied_lsn::text,"
    " applied_end_lsn::text, applied_commit_time, transactions, source_timeline"
    " FROM {replication_groups}"
    " WHERE slot = %s"
)


def _lsn(value: object) -> Lsn | None:
    return None if value is None else parse_lsn(str(value))


class GroupLedger:
    """The ``replication_groups`` table of one ledger schema, on the caller's connection.

    Args:
        schema: The ledger's schema.
    """

    def __init__(self, schema: str) -> None:
        self.store = LedgerStore(schema)
        self.table = self.store.tables.replication_groups

    def ensure(self, conn: Connection) -> None:
        """Brings the ledger up to date (its migrations)."""
        self.store.ensure(conn)

    @staticmethod
    def lock_key(slot: str) -> str:
        """The name of the group's advisory lock (a stream holds it for its session,
        :mod:`.stream`)."""
        return f"replication:{slot}"

    def lock(self, conn: Connection, slot: str) -> None:
        """The group's advisory lock, until the current transaction ends."""
        self.store.lock(conn, self.lock_key(slot))

    def fetch(self, conn: Connection, slot: str) -> GroupState | None:
        """The group's row, or ``None``."""
        query = self.store.tables.sql(_FETCH)
        row = conn.execute(query, (slot,)).fetchone()
        if row is None:
            return None
        members = _members(row[2])
        return GroupState(
            slot=str(row[0]), publication=str(row[1]), tables=tuple(members), members=members,
            phase="copying" if row[3] == "copying" else "streaming",
            consistent_lsn=_lsn(row[4]), applied_lsn=_lsn(row[5]), applied_end_lsn=_lsn(row[6]),
            applied_commit_time=row[7], transactions=int(row[8]), source_timeline=row[9],
            kept=_kept(row[2]),
        )  # fmt: skip

    def begin_copy(
        self, conn: Connection, slot: str, publication: str, tables: tuple[TableName, ...]
    ) -> None:
        """Writes (or resets) the group's row in phase ``copying``, before the slot exists."""
        query = self.store.tables.sql(
            "INSERT INTO {replication_groups} (slot, publication, tables, phase)"
            " VALUES (%s, %s, %s, 'copying') ON CONFLICT (slot) DO UPDATE SET"
            " publication = excluded.publication, tables = excluded.tables, phase = 'copying',"
            " consistent_lsn = NULL, applied_lsn = NULL, applied_end_lsn = NULL,"
            " applied_commit_time = NULL, transactions = 0, source_timeline = NULL,"
            " updated_at = clock_timestamp()"
        )
        conn.execute(query, (slot, publication, _tables(tables)))

    def set_timeline(self, conn: Connection, slot: str, timeline: int) -> None:
        """Records the source's timeline the group reads on (:mod:`.failover`)."""
        query = self.store.tables.sql(
            "UPDATE {replication_groups} SET source_timeline = %s, updated_at = clock_timestamp()"
            " WHERE slot = %s"
        )
        conn.execute(query, (timeline, slot))

    def copied(
        self,
        conn: Connection,
        slot: str,
        consistent_lsn: Lsn,
        members: Mapping[TableName, TableState],
    ) -> None:
        """Phase ``streaming`` from the slot's consistent point (in the copy's transaction).

        The snapshot holds every transaction whose commit record begins before the consistent
        point; one whose commit record begins exactly there (the record right after the one
        that made the slot consistent) is not in it, and the slot returns it. The applied
        position is therefore recorded one byte before the point, so that the stream's "commits
        at or before the applied position" skips exactly what the snapshot holds.
        """
        query = self.store.tables.sql(
            "UPDATE {replication_groups} SET phase = 'streaming', tables = %s,"
            " consistent_lsn = %s::pg_lsn, applied_lsn = %s::pg_lsn, applied_end_lsn = %s::pg_lsn,"
            " updated_at = clock_timestamp() WHERE slot = %s"
        )
        at = lsn_text(consistent_lsn)
        before = lsn_text(consistent_lsn - 1)
        conn.execute(query, (_tables(members), at, before, at, slot))

    def set_members(
        self, conn: Connection, slot: str, members: Mapping[TableName, TableState]
    ) -> None:
        """Records the group's tables and what it holds of each (tables that left or joined
        it, partitions that came or went)."""
        query = self.store.tables.sql(
            "UPDATE {replication_groups} SET tables = %s, updated_at = clock_timestamp()"
            " WHERE slot = %s"
        )
        conn.execute(query, (_tables(members), slot))

    def keep(self, conn: Connection, slot: str, table: TableName, document: object) -> None:
        """Keeps ``document`` as the catalogs ``table``'s plan read (:mod:`.kept_catalogs`), in
        the caller's transaction."""
        query = self.store.tables.sql(
            "UPDATE {replication_groups} SET tables = (SELECT jsonb_agg(CASE"
            " WHEN e->>0 = %s AND e->>1 = %s THEN jsonb_build_array(e->0, e->1,"
            " coalesce(e->2, '{{}}'::jsonb) || jsonb_build_object('kept', %s::jsonb)) ELSE e END"
            " ORDER BY n) FROM jsonb_array_elements(tables) WITH ORDINALITY AS t(e, n))"
            " WHERE slot = %s"
        )
        conn.execute(query, (table.schema, table.name, Jsonb(document), slot))

    def applied(
        self,
        conn: Connection,
        slot: str,
        position: tuple[Lsn, Lsn, datetime],
        transactions: int,
        *,
        was: Lsn,
    ) -> bool:
        """Moves the applied position from ``was`` to ``(commit LSN, end LSN, commit time)`` of
        the last source transaction applied, in the transaction that applied its rows.

        Returns:
            False, changing nothing, when the group's applied position is not ``was`` (or the
            group is gone): the one statement compares and sets.
        """
        query = self.store.tables.sql(
            "UPDATE {replication_groups} SET applied_lsn = %s::pg_lsn,"
            " applied_end_lsn = %s::pg_lsn, applied_commit_time = %s,"
            " transactions = transactions + %s, updated_at = clock_timestamp()"
            " WHERE slot = %s AND applied_lsn = %s::pg_lsn"
        )
        commit, end, at = position
        found = conn.execute(
            query, (lsn_text(commit), lsn_text(end), at, transactions, slot, lsn_text(was))
        )
        return found.rowcount == 1


def _tables(members: Mapping[TableName, TableState] | tuple[TableName, ...]) -> Jsonb:
    """The ``tables`` document of the tables (and their states, when given)."""
    if not isinstance(members, Mapping):
        members = dict.fromkeys(members, TableState())
    entries: list[list[object]] = []
    for table, state in members.items():
        extra: dict[str, object] = {}
        if state.start is not None:
            extra["start"] = lsn_text(state.start)
        if state.leaves is not None:
            extra["leaves"] = sorted([oid, node] for oid, node in state.leaves)
        if state.entry is not None:
            extra["entry"] = state.entry
        entries.append([table.schema, table.name, *([extra] if extra else [])])
    return Jsonb(entries)


def _kept(entries: list[list[Any]]) -> dict[TableName, object]:
    """The kept catalogs' documents of a ``tables`` document, by table."""
    return {
        TableName(str(schema), str(name)): extra[0]["kept"]
        for schema, name, *extra in entries
        if extra and isinstance(extra[0], dict) and "kept" in extra[0]
    }


def _members(entries: list[list[Any]]) -> dict[TableName, TableState]:
    """The tables and their states from a ``tables`` document."""
    members = {}
    for schema, name, *extra in entries:
        state: dict[str, Any] = extra[0] if extra else {}
        start, leaves, entry = state.get("start"), state.get("leaves"), state.get("entry")
        members[TableName(str(schema), str(name))] = TableState(
            start=None if start is None else parse_lsn(str(start)),
            leaves=None if leaves is None else frozenset((int(o), int(n)) for o, n in leaves),
            entry=None if entry is None else int(entry),
        )
    return members
