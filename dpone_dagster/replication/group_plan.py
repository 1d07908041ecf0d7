"""A replication group, and the load plan of each table from the Relation messages of the slot.

A :class:`ReplicationGroup` is parsed once where it enters (its names here, its options as a
:class:`~.options.ReplicationOptions`). Each table's plan is made from the
:class:`~.changes.Relation` the slot sends before the table's first change of a read and after
every change of its columns, so a column added, widened or dropped at the source reaches the
one schema-change policy
(:func:`~dpone_dagster.postgres.schema_change.decide`) at the position in the stream where it
happened, and is applied in the data's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import Column, TableCatalog, table_catalog
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName, check_identifier
from dpone_dagster.postgres.target_catalog import TargetCatalog, target_catalog
from dpone_dagster.postgres.target_plan import (
    Sink,
    TableMapping,
    TablePlan,
    TargetRules,
    new_target_plan,
    plan_target,
)
from dpone_dagster.postgres.threads import at_once

from .changes import Relation
from .options import ReplicationOptions


@dataclass(frozen=True)
class ReplicationGroup:
    """The tables one slot and one publication replicate, and the group's options.

    Args:
        tables: The source tables (names as text, ``"shop.orders"``, or ``TableName``); each
            target table has the same name.
        slot: The logical slot's name (lower-case letters, digits and underscores, as
            PostgreSQL requires).
        publication: The publication's name.
        options: How the target takes the changes and how runs are checked (deletes, schema
            changes, budget, sequences, failover, the check and its sweep).

    Raises:
        EngineError: ``replication_options_invalid`` for no table, a table named twice or a
            bad slot name.
        IdentifierError: ``identifier_invalid`` for a name PostgreSQL would not read.
    """

    tables: tuple[TableName, ...]
    slot: str
    publication: str
    options: ReplicationOptions = field(default_factory=ReplicationOptions)

    def __post_init__(self) -> None:
        tables = tuple(t if isinstance(t, TableName) else TableName.parse(t) for t in self.tables)
        object.__setattr__(self, "tables", tables)
        _refuse_names(self)
        check_identifier(self.publication, what="publication")

    @property
    def soft_column(self) -> str | None:
        """The soft-delete column under ``soft`` deletes, else None."""
        soft = self.options.deletes is Deletes.SOFT
        return self.options.soft_delete_column if soft else None


def _refuse_names(group: ReplicationGroup) -> None:
    if not group.tables:
        raise engine_error("replication_options_invalid", "A group needs at least one table.")
    if len(set(group.tables)) != len(group.tables):
        raise engine_error("replication_options_invalid", "A table is named twice.")
    slot = group.slot
    if not slot or len(slot) > 63 or not all(c.islower() or c.isdigit() or c == "_" for c in slot):
        raise engine_error(
            "replication_options_invalid",
            f"slot={slot!r}: a slot name is 1 to 63 lower-case letters, digits or underscores.",
            ["Name the slot e.g. 'dpone_shop'."],
        )


_KEYLESS = (
    "SELECT t.schema || '.' || t.name, c.relreplident::text"
    " FROM unnest(%s::text[], %s::text[]) AS t(schema, name)"
    " JOIN pg_namespace n ON n.nspname = t.schema"
    " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.name"
    " WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"
)


def refuse_keyless(conn: Connection, group: ReplicationGroup) -> None:
    """Refuses, before anything is created, a table without a primary key that the keyless
    apply (:mod:`.keyless`) cannot replicate exactly: one without ``REPLICA IDENTITY FULL``
    (the slot would not send the old row's full image that identifies it), and any keyless
    table under ``soft`` deletes (:func:`refuse_keyless_table`).

    Raises:
        EngineError: ``replica_identity_missing`` or ``replication_options_invalid``, naming
            each table.
    """
    tables = group.tables
    rows = conn.execute(_KEYLESS, ([t.schema for t in tables], [t.name for t in tables]))
    for name, identity in rows.fetchall():
        refuse_keyless_table(str(name), str(identity), group)


def refuse_keyless_table(table: str, identity: str, group: ReplicationGroup) -> None:
    """Refuses the keyless ``table`` whose replica identity is ``identity`` (``relreplident``,
    or a Relation message's) unless it is ``f`` (``FULL``) and the group's deletes ``hard``.

    A keyless table may hold equal rows, so a soft-deleted row could not be told from its live
    duplicates (nor revived by key): ``deletes="soft"`` needs a primary key on every table.

    Raises:
        EngineError: ``replica_identity_missing``, ``replication_options_invalid``.
    """
    if identity != "f":
        raise engine_error(
            "replica_identity_missing",
            f"No primary key and REPLICA IDENTITY {_IDENTITIES.get(identity, identity)}: "
            f"{table} (a table without a key is replicated by its old rows' full images, which "
            "the slot sends only under REPLICA IDENTITY FULL).",
        )
    if group.soft_column is not None:
        raise engine_error(
            "replication_options_invalid",
            f"deletes='soft' and {table} has no primary key: a soft-deleted row of a table "
            "without a key cannot be told from its live duplicates.",
            ["Add a primary key to the table, or use deletes='hard' for this group."],
        )


_IDENTITIES = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX", "f": "FULL"}


_FORMAT_TYPES = (
    "SELECT format_type(t.oid, t.mod) FROM unnest(%s::oid[], %s::int[]) WITH ORDINALITY"
    " AS t(oid, mod, n) ORDER BY t.n"
)


def relation_columns(src: Connection, table: TableName, relation: Relation) -> TableCatalog:
    """The table's catalog as the Relation message describes it: its columns in the message's
    order, with the source catalog's details (defaults, nullability, user-defined types) where
    the column still has the message's type, and the message's type otherwise (a column
    changed or dropped at the source after that position in the stream)."""
    found = table_catalog(src, table)
    oids = [c.type_oid for c in relation.columns]
    modifiers = [c.type_modifier for c in relation.columns]
    spelled = [str(r[0]) for r in src.execute(_FORMAT_TYPES, (oids, modifiers)).fetchall()]
    by_name = {c.name: c for c in found.columns}
    columns = []
    for sent, type_sql in zip(relation.columns, spelled, strict=True):
        known = by_name.get(sent.name)
        if known is not None and known.type_oid == sent.type_oid and known.type_sql == type_sql:
            columns.append(known)
        else:
            base = known or Column(sent.name, type_sql, sent.type_oid, False, None, False,
                                   sent.type_oid >= 16384, "", "")  # fmt: skip
            columns.append(replace(base, type_sql=type_sql, type_oid=sent.type_oid,
                                   default_sql=None, not_null=False))  # fmt: skip
    return replace(found, columns=tuple(columns))


def relation_catalogs(
    src: Connection, tgt: Connection, table: TableName, relation: Relation
) -> tuple[TableCatalog, TargetCatalog | None]:
    """What :func:`relation_plan` reads: the source's columns as ``relation`` describes them
    (:func:`relation_columns`) and the target's catalog (None: no such target), both servers
    at once."""
    return at_once(
        partial(relation_columns, src, table, relation),
        partial(target_catalog, tgt, table, swap=False),
    )


def relation_plan(
    src: Connection,
    tgt: Connection,
    table: TableName,
    relation: Relation,
    group: ReplicationGroup,
    *,
    catalogs: tuple[TableCatalog, TargetCatalog | None] | None = None,
) -> TablePlan:
    """The merge plan of ``table`` into its target from ``relation``: the schema-change policy
    decides what the target takes (its ``ALTER TABLE`` runs in the data's transaction).

    A table without a primary key is planned with the ``append`` sink (its changes are applied
    by :mod:`.keyless`), after :func:`refuse_keyless_table`.

    Args:
        src: A source session (its catalog).
        tgt: The target session of the data's transaction.
        table: The table.
        relation: The slot's Relation message of the table.
        group: The group (its options).
        catalogs: What :func:`relation_catalogs` returns, when the caller has it
            (:mod:`.kept_catalogs`); read here otherwise.

    Raises:
        SchemaChangeError: ``schema_change_incompatible``.
        CopyPlanError: ``merge_needs_primary_key`` for a target without the source's key.
        EngineError: ``replica_identity_missing``, ``replication_options_invalid``
            (:func:`refuse_keyless_table`).
    """
    catalog, found = catalogs or relation_catalogs(src, tgt, table, relation)
    if not catalog.key:  # applied by the old rows' images (.keyless), never merged by key
        refuse_keyless_table(str(table), relation.replica_identity, group)
    elif relation.replica_identity == "i" and (
        {c.name for c in relation.columns if c.is_key} != set(catalog.key)
    ):
        raise engine_error(
            "replica_identity_missing",
            f"{table} is under REPLICA IDENTITY USING INDEX of an index other than its primary "
            "key: its deletes and key changes would name rows by that index's columns.",
            [f"Run ALTER TABLE {table.qualified} REPLICA IDENTITY DEFAULT (or FULL) on the "
             "source, then run once with resync=True: the changes the slot holds from under "
             "that identity name their rows by the index, and the resync copies the tables "
             "again; nothing of this run was applied."],
        )  # fmt: skip
    plan = new_target_plan(TableMapping(table, table), catalog, src, tgt)
    own = () if group.soft_column is None else (group.soft_column,)
    rules = TargetRules(group.options.schema_changes, own)
    return plan_target(
        tgt, plan, Sink.MERGE if catalog.key else Sink.APPEND, rules=rules, found=found
    )
