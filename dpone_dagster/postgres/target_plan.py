"""Planning a copy: which columns move, in which COPY format, and how the target takes them.

A plan is read from both catalogs before any row moves, so that a bad table name, a
user-defined type the target has otherwise or a target that cannot take the rows fails at once
with a clear error and nothing written. A table the load creates (or evolves) brings the
user-defined types its columns need (:mod:`.target_types`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias

from psycopg import sql

from dpone_dagster.lifecycle import DponeError, Vocabulary

from .catalog import Column, TableCatalog, table_catalog
from .connection import Connection
from .copy import CopyFormat, copy_format_choice, major_versions
from .identifiers import TableName
from .privileges import require_schema, require_table
from .schema_change import ColumnChange, SchemaChanges, alter_statement, decide
from .target_catalog import TargetCatalog, target_catalog
from .target_types import TargetTypes, plan_types
from .user_types import UserType, needed_by, source_types


class CopyPlanError(DponeError):
    """The copy cannot be planned: a table, a type or a key the copy needs is missing."""


class Sink(Vocabulary, option="sink", refusal="copy_options_invalid", error=CopyPlanError):
    """How the target takes the staged rows (the one sink vocabulary)."""

    REPLACE = "replace"
    """The target becomes exactly the staged rows."""
    APPEND = "append"
    """The staged rows are inserted."""
    MERGE = "merge"
    """The staged rows are inserted or update the target's rows of the same key."""


@dataclass(frozen=True)
class TableMapping:
    """A source table and the target table it is copied into.

    Attributes:
        source: The source table.
        target: The target table (the source's name when not given).
    """

    source: TableName
    target: TableName

    @classmethod
    def of(cls, spec: TableSpec) -> TableMapping:
        """Builds a mapping from a name (same name on both sides) or a (source, target) pair.

        Names given as text are parsed as SQL would read them (``sales."Order Items"``).

        Raises:
            IdentifierError: ``identifier_invalid`` for a name PostgreSQL would not read.
        """
        if isinstance(spec, TableMapping):
            return spec
        if isinstance(spec, tuple):
            source, target = spec
            return cls(_table(source), _table(target))
        table = _table(spec)
        return cls(table, table)


TableSpec: TypeAlias = "str | TableName | TableMapping | tuple[str | TableName, str | TableName]"


def _table(value: str | TableName) -> TableName:
    return value if isinstance(value, TableName) else TableName.parse(value)


@dataclass(frozen=True)
class TablePlan:
    """Everything the copy of one table needs to know before it starts.

    Attributes:
        source: The source table.
        target: The target table.
        columns: The columns that move (the source's, generated columns excluded).
        written: The target's columns that receive them, in the same order (the source's
            columns when the target does not exist yet).
        source_columns: Every source column (the definition of a target to create).
        key: The source's primary key, in key order (empty when it has none).
        target_exists: The target table exists already.
        target_key: The primary key the target has, or will have when it is created.
        target_pk_name: The name of the target's primary-key constraint, when it exists.
        copy_format: ``binary`` when both ends agree on every column type, else ``text``.
        swap: The sink installs the loaded staging table as the target (a missing target, or a
            ``replace`` into a plain table nothing else depends on).
        unlogged_target: The target is an ``UNLOGGED`` table.
        partitioned_target: The target is a partitioned table (its rows live in partitions).
        versions: The source's and the target's major versions (None for a generic source).
        copy_format_reason: Why ``copy_format`` is ``text``, when it is.
        schema_changes: What the load changes in the existing target's schema, in the load's
            transaction (:mod:`.schema_change`): added, widened and kept columns.
        storage: The storage parameters (``name=value``, as ``pg_class.reloptions`` spells
            them) of a staging table that becomes the target: those of a target this load
            creates (its caller's), or those of the target a ``replace`` swaps out (kept).
        source_types: The source's user-defined types the table's columns need, in creation
            order (:func:`.user_types.source_types`).
        target_types: What the load creates in the target for them (extensions, types, enum
            labels).
        virtual_as_stored: The source's ``VIRTUAL`` generated columns that a target this load
            creates defines as ``STORED`` (a server before PostgreSQL 18 has no ``VIRTUAL``);
            their values are the same.
    """

    source: TableName
    target: TableName
    columns: tuple[Column, ...]
    written: tuple[Column, ...]
    source_columns: tuple[Column, ...]
    key: tuple[str, ...]
    target_exists: bool
    target_key: tuple[str, ...]
    target_pk_name: str | None
    copy_format: CopyFormat
    swap: bool
    unlogged_target: bool = False
    partitioned_target: bool = False
    versions: tuple[int, int] | None = None
    copy_format_reason: str | None = None
    schema_changes: tuple[ColumnChange, ...] = ()
    storage: tuple[str, ...] = ()
    source_types: tuple[UserType, ...] = ()
    target_types: TargetTypes = field(default_factory=TargetTypes)
    virtual_as_stored: tuple[str, ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        """Names of the columns that move, in source order."""
        return tuple(c.name for c in self.columns)


_HAS_ROWS = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})")


@dataclass(frozen=True)
class TargetRules:
    """What a load may do to its target beyond its rows.

    Attributes:
        schema_changes: ``evolve`` or ``freeze`` (:mod:`.schema_change`): an existing target
            whose columns differ, and the types a target lacks (``freeze`` creates none).
        keep: Target columns the copy itself owns (a soft-delete column): never taken for
            columns the source dropped.
        create_extensions: Extensions the load may create in the target when a table's types
            need them (never any other).
    """

    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    keep: Collection[str] = ()
    create_extensions: Collection[str] = ()


def plan_tables(
    source: Connection,
    target: Connection,
    mappings: Sequence[TableMapping],
    sink: Sink,
    rules: TargetRules = TargetRules(),
) -> list[TablePlan]:
    """Plans the copy of every table from both catalogs.

    Args:
        source: A session of the source database.
        target: A session of the target database.
        mappings: The tables to copy.
        sink: How the target takes the rows.
        rules: What the load may do to the target beyond its rows (schema changes, the types
            and extensions it may create).

    Raises:
        CatalogError: ``table_not_found`` for a source table that does not exist.
        CopyPlanError: ``copy_options_invalid`` (no tables, one target twice),
            ``target_not_a_table``, ``merge_needs_primary_key``.
        TargetTypeError: the refusals of :func:`.target_types.plan_types`.
        SchemaChangeError: ``schema_change_incompatible``.
    """
    if not mappings:
        raise CopyPlanError("copy_options_invalid", "No tables to copy.", ["Name a table."])
    targets = [m.target for m in mappings]
    twice = sorted({str(t) for t in targets if targets.count(t) > 1})
    if twice:
        raise CopyPlanError(
            "copy_options_invalid",
            f"Target table {', '.join(twice)} is named more than once.",
            ["Copy each source into its own target table."],
        )
    return [_plan_one(source, target, m, sink, rules) for m in mappings]


def _plan_one(
    source: Connection, target: Connection, mapping: TableMapping, sink: Sink, rules: TargetRules
) -> TablePlan:
    found = table_catalog(source, mapping.source)
    require_table(source, "source", mapping.source, ["SELECT"])
    return plan_target(target, new_target_plan(mapping, found, source, target), sink, rules=rules)


def new_target_plan(
    mapping: TableMapping,
    source: TableCatalog,
    source_conn: Connection,
    target_conn: Connection,
) -> TablePlan:
    """The plan of a copy of a source table (as its catalog describes it) into a target that
    does not exist yet: :func:`plan_target` completes it with the target's catalog. The
    user-defined types its columns need are read from the source here."""
    columns = tuple(c for c in source.columns if not c.generated)
    versions = major_versions(source_conn, target_conn)
    copy_format, reason = copy_format_choice(columns, versions)
    definition, stored = generated_as_target_can(source.columns, versions[1])
    return TablePlan(
        source=mapping.source,
        target=mapping.target,
        columns=columns,
        written=columns,
        source_columns=definition,
        key=source.key,
        target_exists=False,
        target_key=source.key,
        target_pk_name=None,
        copy_format=copy_format,
        swap=True,
        versions=versions,
        copy_format_reason=reason,
        source_types=source_types(source_conn, [c.type_oid for c in source.columns]),
        virtual_as_stored=stored,
    )


VIRTUAL_SINCE = 18
"""The first major version of PostgreSQL with ``VIRTUAL`` generated columns."""


def generated_as_target_can(
    columns: Sequence[Column], target_major: int
) -> tuple[tuple[Column, ...], tuple[str, ...]]:
    """``columns`` as a target of major version ``target_major`` can define them: a ``VIRTUAL``
    generated column stays ``VIRTUAL`` from PostgreSQL 18 on and becomes ``STORED`` before
    (same expression, same values); the names of the columns that did."""
    if target_major >= VIRTUAL_SINCE:
        return tuple(columns), ()
    stored = tuple(c.name for c in columns if c.virtual)
    return tuple(replace(c, virtual=False) for c in columns), stored


def plan_target(
    target: Connection,
    plan: TablePlan,
    sink: Sink,
    *,
    source_label: str | None = None,
    rules: TargetRules = TargetRules(),
    found: TargetCatalog | Literal["read"] | None = "read",
) -> TablePlan:
    """Completes a plan made for a new target with what the target's catalog says.

    Shared by the PostgreSQL copies and the generic sources (``dpone_dagster.sources``), whose
    plan comes from their type mapping instead of a source catalog.

    Args:
        target: A session of the target database.
        plan: The plan as if the target did not exist (created from the source's columns).
        sink: How the target takes the rows.
        source_label: How messages name the source (``plan.source`` by default).
        rules: What the load may do to the target beyond its rows (see :class:`TargetRules`).
        found: The target's catalog when the caller read it already (:func:`target_catalog`
            with ``swap`` for a ``replace``; ``None``: no such target); read here by default.

    Raises:
        CopyPlanError: ``target_not_a_table``, ``merge_needs_primary_key``.
        TargetTypeError: ``target_type_missing``, ``target_type_differs``,
            ``target_extension_missing``, ``target_extension_unavailable``
            (:func:`.target_types.plan_types`).
        SchemaChangeError: ``schema_change_incompatible`` (:func:`.schema_change.decide`; enum
            labels the target lacks under ``freeze``).
        DatabaseError: ``target_permission_denied`` for a role that could not carry the plan
            out (:mod:`.privileges`).
    """
    if found == "read":
        found = target_catalog(target, plan.target, swap=sink == "replace")
    if found is None:
        planned = _with_types(target, plan, plan.source_types, rules)
    else:
        label = source_label or str(plan.source)
        planned = _onto_existing(target, found, plan, sink, (label, rules))
    _require_target_rights(target, planned, sink)
    return planned


def _require_target_rights(target: Connection, plan: TablePlan, sink: Sink) -> None:
    """Refuses a target role that could not carry the plan out: ``USAGE, CREATE`` on the
    target's schema (staging tables live there), and on an existing target the sink's
    privileges, or its ownership where the load drops or alters it.

    Raises:
        DatabaseError: ``target_permission_denied``.
    """
    require_schema(target, "target", plan.target.schema)
    if not plan.target_exists:
        return
    if plan.swap:
        require_table(target, "target", plan.target, ["SELECT"], owner=True)
        return
    privileges = ["SELECT", "INSERT"]
    privileges += ["UPDATE"] if sink is Sink.MERGE else []
    privileges += ["DELETE"] if sink is Sink.REPLACE else []
    ddl = alter_statement(plan.target, plan.schema_changes) is not None
    require_table(target, "target", plan.target, privileges, owner=ddl)


def _with_types(
    target: Connection, plan: TablePlan, needed: Sequence[UserType], rules: TargetRules
) -> TablePlan:
    """``plan`` with what the target gets for the types ``needed``."""
    if not needed:
        return plan
    types = plan_types(
        target, needed, rules.schema_changes, table=str(plan.target),
        create_extensions=rules.create_extensions,
    )  # fmt: skip
    return replace(plan, target_types=types)


def _onto_existing(
    target: Connection,
    found: TargetCatalog,
    plan: TablePlan,
    sink: Sink,
    how: tuple[str, TargetRules],
) -> TablePlan:
    """The plan for a target that exists (``found``: its catalog): its columns, key and shape
    decide."""
    columns, (label, rules) = plan.columns, how
    relkind, persistence, pk_name = found.relkind, found.persistence, found.pk_name
    if relkind not in ("r", "p"):
        raise CopyPlanError(
            "target_not_a_table",
            f"Target {plan.target} exists but is not a table (relkind {relkind!r}).",
            ["Name a table as the target, or drop the object that holds its name."],
        )
    target_columns, target_key = found.table.columns, found.table.key
    changes = decide(
        columns, target_columns, (plan.key, target_key), rules.schema_changes,
        target_has_rows=lambda: _fetch_bool(target, _HAS_ROWS.format(plan.target.ident), ()),
        labels=(label, str(plan.target)), keep=rules.keep,
    )  # fmt: skip
    names = {c.name for c in columns}
    if sink == "merge" and (not target_key or not set(target_key) <= names):
        raise CopyPlanError(
            "merge_needs_primary_key",
            f"A merge into {plan.target} needs a target primary key made of copied columns "
            f"(target key: {list(target_key) or 'none'}).",
            ["Add a primary key to the target, or use the replace or append sink."],
        )
    evolved = {c.column: c.source for c in changes if c.source is not None}
    by_name = {c.name: c for c in target_columns}
    written = tuple(evolved.get(c.name) or by_name[c.name] for c in columns)
    typed = [s for s, t in zip(columns, written, strict=True) if _same_user_type(s, t)]
    plan = _with_types(target, plan, needed_by(plan.source_types, typed), rules)
    same_types = all(s.type_sql == t.type_sql for s, t in zip(columns, written, strict=True))
    copy_format, reason = copy_format_choice([*columns, *written], plan.versions)
    if not same_types:
        copy_format, reason = "text", "the target's column types differ from the source's"
    return replace(
        plan,
        written=written,
        target_exists=True,
        target_key=target_key,
        target_pk_name=pk_name,
        copy_format=copy_format,
        copy_format_reason=reason,
        swap=sink == "replace" and found.swappable,
        storage=found.storage if sink == "replace" and found.swappable else (),
        unlogged_target=persistence == "u",
        partitioned_target=relkind == "p",
        schema_changes=changes,
        virtual_as_stored=(),
    )


def _same_user_type(source: Column, written: Column) -> bool:
    """The target column takes the source's own user-defined type (one it has, or one an
    evolved column brings)."""
    return (
        source.user_type
        and written.user_type
        and ((source.type_schema, source.type_name) == (written.type_schema, written.type_name))
    )


def _fetch_bool(
    conn: Connection,
    query: str | sql.Composed,
    params: tuple[object, ...],
) -> bool:
    row = conn.execute(query, params).fetchone()
    return bool(row and row[0])
