"""What the slot still holds after the applied position: the check's explanation of a difference.

The target holds the source as of the group's applied position ``L``; the check reads the source
in a snapshot taken at ``S``. A transaction that committed after ``L`` (and by ``S``) is still in
the slot, which is advanced only to ``L``: :class:`SlotChanges` peeks the slot up to ``S`` and
tells, of a table, which keys such transactions changed (a keyed table's check: those keys
differ for a known reason, left to the next run) and which row images they added and removed
(a keyless table's check: the source's digest as of ``L`` is its digest at ``S`` without them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

# psycopg has no public name for a server encoding's Python codec (``conn.info.encoding`` is
# the client encoding's); pgoutput sends values in the database's own encoding.
from psycopg._encodings import pg2pyenc

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile.compare import Key

from .changes import UNCHANGED, Begin, Delete, Insert, Lsn, Relation, Row, Truncate, Update, Value
from .group_plan import ReplicationGroup
from .reader import read_changes

RowChange: TypeAlias = Insert | Update | Delete
Image: TypeAlias = tuple[int, list[str | None]]
"""A row image a change added (``1``) or removed (``-1``), its values as text."""


class SlotChanges:
    """The changes the slot holds after the applied position (see the module).

    Args:
        control: An idle source session that may read the slot.
        group: The group (its slot and publication).
        applied: The applied position ``L``: transactions that committed at or before it are
            the target's already.
        upto: The check's WAL position ``S`` (its source snapshot's).
        encoding: The source database's encoding (the slot's values are in it).
    """

    def __init__(
        self, control: Connection, group: ReplicationGroup, applied: Lsn, upto: Lsn, encoding: str
    ) -> None:
        self.control, self.group = control, group
        self.applied, self.upto = applied, upto
        self.codec = pg2pyenc(encoding.encode())
        self.peeks = 0

    def _changes(self, table: TableName) -> list[tuple[RowChange | Truncate, list[str]]]:
        """The row changes and truncates of ``table`` that committed after ``L``, each with the
        table's column names as its Relation message gave them."""
        self.peeks += 1
        names: dict[int, list[str]] = {}
        found: list[tuple[RowChange | Truncate, list[str]]] = []
        after = False
        changes = read_changes(self.control, slot=self.group.slot,
                               publication=self.group.publication, upto_lsn=self.upto,
                               max_changes=None)  # fmt: skip
        for _, message in changes:  # read to its end: the peek's transaction ends with it
            if isinstance(message, Begin):
                after = message.final_lsn > self.applied
            elif isinstance(message, Relation):
                if (message.schema, message.name) == (table.schema, table.name):
                    names[message.oid] = [c.name for c in message.columns]
            elif not after:
                continue
            elif isinstance(message, Truncate):
                touched = [names[oid] for oid in message.relations if oid in names]
                if touched:
                    found.append((message, touched[0]))
            elif isinstance(message, (Insert, Update, Delete)) and message.relation in names:
                found.append((message, names[message.relation]))
        return found

    def changed(self, table: TableName, key: Sequence[str], keys: Sequence[Key]) -> set[Key]:
        """Of ``keys`` of ``table``, those a transaction committed after the applied position
        (and by the check's snapshot) inserted, updated or deleted (every one, after a
        ``TRUNCATE`` of the table)."""
        wanted = set(keys)
        if not wanted:
            return set()
        every = self.all_keys(table, key)
        return wanted if every is None else wanted & every

    def all_keys(self, table: TableName, key: Sequence[str]) -> set[Key] | None:
        """Every key of ``table`` a transaction committed after the applied position (and by
        the check's snapshot) inserted, updated or deleted; ``None`` after a ``TRUNCATE`` of
        the table (every key)."""
        found: set[Key] = set()
        for message, names in self._changes(table):
            if isinstance(message, Truncate):
                return None
            where = [names.index(k) for k in key]
            for row in _rows(message):
                named = self._key(row, where)
                if named is not None:
                    found.add(named)
        return found

    def images(self, table: TableName, columns: Sequence[str]) -> list[Image] | None:
        """The row images of ``table`` (its ``columns``, as text) that transactions committed
        after the applied position added and removed, in order; ``None`` when they cannot be
        told (a ``TRUNCATE`` of the table, a column the change did not carry). A keyless table
        replicates under ``REPLICA IDENTITY FULL``: every update and delete carries its old row
        whole, and an unchanged TOASTed value of the new row is the old row's."""
        images: list[Image] = []
        for message, names in self._changes(table):
            if isinstance(message, Truncate) or not set(columns) <= set(names):
                return None
            where = [names.index(c) for c in columns]
            if isinstance(message, Insert):
                images.append((1, self._values(message.new, where)))
                continue
            old = message.old
            if old is None or any(v is UNCHANGED for v in old):
                return None  # no full old image: the identity is not FULL
            images.append((-1, self._values(old, where)))
            if isinstance(message, Update):
                new = [o if v is UNCHANGED else v for v, o in zip(message.new, old, strict=True)]
                images.append((1, self._values(new, where)))
        return images

    def _values(self, row: Sequence[Value], where: list[int]) -> list[str | None]:
        return [None if row[i] is None else row[i].decode(self.codec) for i in where]  # type: ignore[union-attr]

    def _key(self, row: Row, where: list[int]) -> Key | None:
        values = [row[i] for i in where]
        if not all(isinstance(v, bytes) for v in values):
            return None  # NULL or unchanged: not a key this row names
        return tuple(v.decode(self.codec) for v in values)  # type: ignore[union-attr]


def _rows(message: RowChange) -> list[Row]:
    if isinstance(message, Insert):
        return [message.new]
    if isinstance(message, Delete):
        return [message.old]
    return [message.new] if message.old is None else [message.new, message.old]
