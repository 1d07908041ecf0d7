"""Partitioned tables in a group: replicated through their parent, partitions that come and go.

A partitioned table is named in a group by its parent (the root of its partition tree). The
publication publishes through the root (:mod:`.publication`), so every change of any partition
arrives as the parent's, a row whose partition key moves it to another partition included (a
delete and an insert); the target is one table holding every partition's rows. A group that
names a partitioned table and one of its own partitions, at any depth, is refused before
anything is created or changed (:func:`refuse_overlap`, ``replication_partition_overlap``).

``ATTACH PARTITION``, ``DETACH PARTITION``, dropping a partition and truncating one partition
alone write none of its rows to the WAL (and ``pgoutput`` does not send a partition's own
``TRUNCATE`` when it publishes through the root), so the stream alone cannot follow them. The
ledger keeps, per partitioned table, its leaf partitions (OID and ``pg_relation_filenode``) as
they were read before the snapshot the target's rows came from; each run reads them again
(:func:`partition_trees`, before any snapshot it takes) and :func:`compare` decides:

- a partition that is new (attached, or made with ``CREATE TABLE ... PARTITION OF``): its rows
  are merged into the target under a snapshot taken after that read (:mod:`.join`); the
  stream then replays that partition's changes from the group's applied position on top, each
  carrying its whole row, so every row ends as the source has it;
- a partition gone or rewritten (detached, dropped, truncated alone; also ``VACUUM FULL`` or
  ``CLUSTER`` of it), a new partition of a table without a primary key (its rows could not be
  merged by key), or no partitions on record: the parent is copied again alone, as a table that
  joins the group (:mod:`.join`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName

from .group_state import Leaves

_TREES = (
    "SELECT t.n, EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i"
    "  WHERE i.indrelid = c.oid AND i.indisprimary),"
    " ln.nspname::text, lc.relname::text, lc.oid::int8,"
    " pg_catalog.pg_relation_filenode(lc.oid)::int8"
    " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(schema, name, n)"
    " JOIN pg_catalog.pg_namespace AS s ON s.nspname = t.schema"
    " JOIN pg_catalog.pg_class AS c ON c.relnamespace = s.oid AND c.relname = t.name"
    "  AND c.relkind = 'p'"
    " LEFT JOIN LATERAL pg_catalog.pg_partition_tree(c.oid) AS p ON p.isleaf"
    " LEFT JOIN pg_catalog.pg_class AS lc ON lc.oid = p.relid AND lc.relkind = 'r'"
    " LEFT JOIN pg_catalog.pg_namespace AS ln ON ln.oid = lc.relnamespace"
    " ORDER BY t.n, lc.oid"
)

_ANCESTORS = (
    "SELECT t.n, an.nspname::text, ac.relname::text"
    " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(schema, name, n)"
    " JOIN pg_catalog.pg_namespace AS s ON s.nspname = t.schema"
    " JOIN pg_catalog.pg_class AS c ON c.relnamespace = s.oid AND c.relname = t.name"
    " CROSS JOIN LATERAL pg_catalog.pg_partition_ancestors(c.oid) AS a"
    " JOIN pg_catalog.pg_class AS ac ON ac.oid = a.relid"
    " JOIN pg_catalog.pg_namespace AS an ON an.oid = ac.relnamespace"
    " WHERE a.relid <> c.oid ORDER BY t.n"
)


@dataclass(frozen=True)
class Partition:
    """A leaf partition of a partitioned table.

    Attributes:
        table: Its name.
        oid: Its OID.
        filenode: Its ``pg_relation_filenode`` (a new one after a ``TRUNCATE`` or a rewrite).
    """

    table: TableName
    oid: int
    filenode: int


@dataclass(frozen=True)
class PartitionTree:
    """A partitioned table of the group and its leaf partitions, as read now.

    Attributes:
        root: The partitioned table.
        keyed: It has a primary key (its partitions' rows can be merged by key).
        partitions: Its leaf partitions (regular tables; a foreign partition's rows are not in
            this server's WAL and are left out).
    """

    root: TableName
    keyed: bool
    partitions: tuple[Partition, ...]

    @property
    def leaves(self) -> Leaves:
        """What the ledger keeps of the partitions."""
        return frozenset((p.oid, p.filenode) for p in self.partitions)


@dataclass(frozen=True)
class TreeChange:
    """What a run does about a partitioned table whose partitions changed (:func:`compare`).

    Attributes:
        copy_again: The parent is copied again alone, as a table that joins the group.
        merge: The new partitions whose rows are merged into the target.
    """

    copy_again: bool
    merge: tuple[TableName, ...] = ()


def partition_trees(
    conn: Connection, tables: Sequence[TableName]
) -> dict[TableName, PartitionTree]:
    """The partitioned tables among ``tables``, each with its leaf partitions (one round trip).

    Read it before the snapshot the target's rows come from: a partition attached after the
    read and before the snapshot is then merged once more by the next run (harmless), where one
    attached after the snapshot would otherwise be taken as held.
    """
    rows = conn.execute(_TREES, ([t.schema for t in tables], [t.name for t in tables]))
    found: dict[TableName, tuple[bool, list[Partition]]] = {}
    for n, keyed, schema, name, oid, filenode in rows.fetchall():
        _, partitions = found.setdefault(tables[int(n) - 1], (bool(keyed), []))
        if oid is not None:
            partitions.append(Partition(TableName(str(schema), str(name)), int(oid), int(filenode)))
    return {t: PartitionTree(t, keyed, tuple(p)) for t, (keyed, p) in found.items()}


def compare(tree: PartitionTree, recorded: Leaves | None) -> TreeChange | None:
    """What the run does about ``tree`` given the partitions the target holds the rows of
    (``recorded``, None when the ledger has none): None when nothing changed."""
    if recorded is None:
        return TreeChange(copy_again=True)
    if recorded - tree.leaves:  # a partition gone or rewritten: its rows left without a change
        return TreeChange(copy_again=True)
    new = tuple(p.table for p in tree.partitions if (p.oid, p.filenode) not in recorded)
    if not new:
        return None
    return TreeChange(copy_again=not tree.keyed, merge=new if tree.keyed else ())


def refuse_overlap(conn: Connection, tables: Sequence[TableName]) -> None:
    """Refuses a group that names a partitioned table and one of its own partitions.

    Raises:
        EngineError: ``replication_partition_overlap``, naming each partition and its parent.
    """
    named = set(tables)
    rows = conn.execute(_ANCESTORS, ([t.schema for t in tables], [t.name for t in tables]))
    overlaps = [
        f"{tables[int(n) - 1]} is a partition of {ancestor}"
        for n, schema, name in rows.fetchall()
        if (ancestor := TableName(str(schema), str(name))) in named
    ]
    if overlaps:
        raise engine_error("replication_partition_overlap", f"{'; '.join(overlaps)}.")
