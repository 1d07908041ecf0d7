"""Planning a copy: which columns move, in which COPY format, and how the target takes them.

A plan is read from both catalogs before any row moves, so that a bad table name, a missing
user-defined type or a target that cannot take the rows fails at once with a clear error and
nothing written.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from psycopg import sql

from dpone_dagster.lifecycle import DponeError, Vocabulary

from .catalog import Column, TableCatalog, table_catalog
from .connection import Connection
from .copy import CopyFormat, copy_format_choice, major_versions
from .identifiers import TableName
from .schema_change import ColumnChange, SchemaChanges, decide
from .target_catalog import TargetCatalog, target_catalog


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

    @property
    def column_names(self) -> tuple[str, ...]:
        """Names of the columns that move, in source order."""
        return tuple(c.name for c in self.columns)


_HAS_ROWS = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})")

_TYPE_EXISTS = """
SELECT EXISTS (SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
               WHERE n.nspname = %s AND t.typname = %s)
"""


def plan_tables(
    source: Connection,
    target: Connection,
    mappings: Sequence[TableMapping],
    sink: Sink,
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE,
    *,
    keep: Collection[str] = (),
) -> list[TablePlan]:
    """Plans the copy of every table from both catalogs.

    Args:
        source: A session of the source database.
        target: A session of the target database.
        mappings: The tables to copy.
        sink: How the target takes the rows.
        schema_changes: ``evolve`` or ``freeze`` (:mod:`.schema_change`).
        keep: Target columns the copy itself owns (a soft-delete column): never taken for
            columns the source dropped.

    Raises:
        CatalogError: ``table_not_found`` for a source table that does not exist.
        CopyPlanError: ``copy_options_invalid`` (no tables, one target twice),
            ``target_not_a_table``, ``target_type_missing``, ``merge_needs_primary_key``.
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
    return [_plan_one(source, target, m, sink, (schema_changes, keep)) for m in mappings]


def _plan_one(
    source: Connection,
    target: Connection,
    mapping: TableMapping,
    sink: Sink,
    changes: tuple[SchemaChanges, Collection[str]],
) -> TablePlan:
    plan = new_target_plan(mapping, table_catalog(source, mapping.source), source, target)
    return plan_target(target, plan, sink, schema_changes=changes[0], keep=changes[1])


def new_target_plan(
    mapping: TableMapping,
    source: TableCatalog,
    source_conn: Connection,
    target_conn: Connection,
) -> TablePlan:
    """The plan of a copy of a source table (as its catalog describes it) into a target that
    does not exist yet: :func:`plan_target` completes it with the target's catalog."""
    columns = tuple(c for c in source.columns if not c.generated)
    versions = major_versions(source_conn, target_conn)
    copy_format, reason = copy_format_choice(columns, versions)
    return TablePlan(
        source=mapping.source,
        target=mapping.target,
        columns=columns,
        written=columns,
        source_columns=source.columns,
        key=source.key,
        target_exists=False,
        target_key=source.key,
        target_pk_name=None,
        copy_format=copy_format,
        swap=True,
        versions=versions,
        copy_format_reason=reason,
    )


def plan_target(
    target: Connection,
    plan: TablePlan,
    sink: Sink,
    *,
    source_label: str | None = None,
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE,
    keep: Collection[str] = (),
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
        schema_changes: ``evolve`` or ``freeze``: what a target whose columns differ gets.
        keep: Target columns the copy owns (see :func:`plan_tables`).
        found: The target's catalog when the caller read it already (:func:`target_catalog`
            with ``swap`` for a ``replace``; ``None``: no such target); read here by default.

    Raises:
        CopyPlanError: ``target_not_a_table``, ``target_type_missing``,
            ``merge_needs_primary_key``.
        SchemaChangeError: ``schema_change_incompatible`` (:func:`.schema_change.decide`).
    """
    if found == "read":
        found = target_catalog(target, plan.target, swap=sink == "replace")
    if found is None:
        _check_user_types(target, plan.target, plan.source_columns)
        return plan
    label = source_label or str(plan.source)
    return _onto_existing(target, found, plan, sink, (label, schema_changes, keep))


def _onto_existing(
    target: Connection,
    found: TargetCatalog,
    plan: TablePlan,
    sink: Sink,
    how: tuple[str, SchemaChanges, Collection[str]],
) -> TablePlan:
    """The plan for a target that exists (``found``: its catalog): its columns, key and shape
    decide."""
    columns = plan.columns
    relkind, persistence, pk_name = found.relkind, found.persistence, found.pk_name
    if relkind not in ("r", "p"):
        raise CopyPlanError(
            "target_not_a_table",
            f"Target {plan.target} exists but is not a table (relkind {relkind!r}).",
            ["Name a table as the target, or drop the object that holds its name."],
        )
    target_columns, target_key = found.table.columns, found.table.key
    changes = decide(
        columns, target_columns, (plan.key, target_key), how[1],
        target_has_rows=lambda: _fetch_bool(target, _HAS_ROWS.format(plan.target.ident), ()),
        labels=(how[0], str(plan.target)), keep=how[2],
    )  # fmt: skip
    _check_user_types(target, plan.target, [c.source for c in changes if c.source is not None])
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
    )


def _check_user_types(target: Connection, table: TableName, columns: Sequence[Column]) -> None:
    """A target created from the source needs every user-defined type the source uses."""
    missing = sorted(
        {
            f"{c.type_schema}.{c.type_name}"
            for c in columns
            if c.user_type and not _fetch_bool(target, _TYPE_EXISTS, (c.type_schema, c.type_name))
        }
    )
    if missing:
        raise CopyPlanError(
            "target_type_missing",
            f"Target table {table} would need user-defined type(s) {', '.join(missing)}, "
            f"which database {target.info.dbname!r} does not have.",
            [
                "Create the type(s) in the target database first (same schema and name).",
                "Or create the target table yourself with types the target has.",
            ],
        )


def _fetch_bool(
    conn: Connection,
    query: str | sql.Composed,
    params: tuple[object, ...],
) -> bool:
    row = conn.execute(query, params).fetchone()
    return bool(row and row[0])
