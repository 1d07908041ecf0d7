"""Schema changes: the one place that compares a source's columns with an existing target's.

:func:`decide` is called by the plan of every load into an existing target (a snapshot copy,
a generic source; the backfill refuses changes instead). It returns what the load must do:

- nothing, when every column's type is equal however spelled (:func:`~.catalog.normal_type`),
  or the target's already holds every value of the source's (``integer`` into ``bigint``);
- under ``evolve`` (the default), :class:`ColumnChange` s: a new source column is added with the
  source's exact type (with its constant default, and NOT NULL where the target's existing rows
  allow it); a type that :func:`widens` is widened; a column the source no longer has is kept
  (new rows get NULL or its default; a NOT NULL without a default is dropped so they can);
- anything else (a narrowing, ``text`` to ``integer``, a changed primary key, a key column the
  source lost), and under ``freeze`` every change, raises ``schema_change_incompatible``
  listing each column's before and after, before anything is written.

:func:`apply_changes` runs the DDL in the load's own transaction (:mod:`.load`), so a reader
never sees the new schema without the data, and a failed load leaves the old schema.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from psycopg import sql

from dpone_dagster.lifecycle import DponeError, Vocabulary

from .catalog import Column, NormalType, column_type, normal_type
from .connection import Connection
from .identifiers import TableName


class SchemaChangeError(DponeError):
    """The source's columns differ from the target's in a way the load will not apply."""


class SchemaChanges(
    Vocabulary, option="schema_changes", refusal="copy_options_invalid", error=SchemaChangeError
):
    """What the load does when the source's columns differ from the target's (the one
    schema-change vocabulary)."""

    EVOLVE = "evolve"
    """Add a column, widen a type, keep a dropped column, in the load's transaction."""
    FREEZE = "freeze"
    """Refuse every difference (``schema_change_incompatible``)."""


ChangeKind = Literal["added", "widened", "kept"]


@dataclass(frozen=True)
class ColumnChange:
    """One difference between the source's columns and the target's, and what evolve does.

    Attributes:
        column: The column's name.
        kind: ``added`` (a new source column, added to the target), ``widened`` (the target's
            type widened to the source's) or ``kept`` (no longer in the source: kept in the
            target, new rows get NULL or its default).
        before: The target's type before (None for an added column).
        after: The target's type after (for ``kept``: unchanged).
        detail: What the target does, in words (nullability, default).
        source: The source's column (for ``added`` and ``widened``).
        not_null: An added column gets NOT NULL.
        drop_not_null: A kept column loses its NOT NULL (it has no default to fill new rows).
    """

    column: str
    kind: ChangeKind
    before: str | None
    after: str
    detail: str
    source: Column | None = None
    not_null: bool = False
    drop_not_null: bool = False

    def describe(self) -> str:
        """One line: ``added "note" text NOT NULL DEFAULT 'x'`` and the like."""
        if self.kind == "widened":
            return f"widened {self.column!r}: {self.before} -> {self.after}"
        verb = "added" if self.kind == "added" else "kept"
        return f"{verb} {self.column!r} {self.after} ({self.detail})"


_INTEGERS = ("smallint", "integer", "bigint")
_WIDER_AS_IS = {("real", "double precision"), ("character varying", "text")}


def widens(before: NormalType, after: NormalType) -> bool:
    """``after`` holds every value of ``before`` exactly (or is the same type).

    The widenings: ``varchar(n)`` to a longer ``varchar`` or ``text``; ``smallint`` to
    ``integer`` to ``bigint``; ``numeric(p,s)`` to a larger ``p`` with the same ``s`` or an
    unconstrained ``numeric``; ``real`` to ``double precision``; ``timestamp(p)`` (and
    ``time(p)``, with or without time zone) to a larger ``p``. Arrays only when equal.
    """
    if before == after:
        return True
    if before.array or after.array:  # arrays only as they are
        return False
    pair = (before.name, after.name)
    if pair in _WIDER_AS_IS:
        return True
    if before.name in _INTEGERS and after.name in _INTEGERS:
        return _INTEGERS.index(before.name) <= _INTEGERS.index(after.name)
    if before.name != after.name or not after.modifiers:  # unconstrained holds every value
        return before.name == after.name and before.name in ("character varying", "numeric")
    if not before.modifiers:
        return False
    if before.name == "numeric":
        (p, *s), (q, *t) = before.modifiers, after.modifiers
        return q >= p and (s or [0]) == (t or [0])
    if before.name == "character varying" or before.name.startswith(("timestamp", "time ")):
        return after.modifiers[0] >= before.modifiers[0]
    return False


def decide(
    source: Sequence[Column],
    target: Sequence[Column],
    keys: tuple[tuple[str, ...], tuple[str, ...]],
    mode: SchemaChanges,
    *,
    target_has_rows: Callable[[], bool],
    labels: tuple[str, str],
    keep: Collection[str] = (),
) -> tuple[ColumnChange, ...]:
    """Compares the copied source columns with the target's and decides what the load does.

    Args:
        source: The columns that move (generated columns excluded), in source order.
        target: Every column of the existing target.
        keys: The source's and the target's primary keys (either may be empty: unknown).
        mode: ``evolve`` or ``freeze``.
        target_has_rows: Whether the target holds rows (asked only when an added NOT NULL
            column has no constant default).
        labels: How messages name the source and the target.
        keep: Target columns the copy owns (a soft-delete column): not a dropped column.

    Returns:
        The changes evolve applies, in source order then the kept columns (empty: none).

    Raises:
        SchemaChangeError: ``schema_change_incompatible``, listing every column's before and
            after, for a change evolve refuses or any change under ``freeze``.
    """
    theirs = {c.name: c for c in target}
    changes: list[ColumnChange] = []
    refused: list[str] = []
    for column in source:
        found = theirs.get(column.name)
        if found is None:
            changes.append(_added(column, target_has_rows))
        elif found.generated:
            refused.append(f"{column.name!r}: generated in the target -> {column.type_sql}")
        elif not widens(normal_type(column), normal_type(found)):
            if widens(normal_type(found), normal_type(column)):
                changes.append(
                    ColumnChange(
                        column.name, "widened", found.type_sql, column.type_sql,
                        "widened to the source's type", source=column,
                    )
                )  # fmt: skip
            else:
                refused.append(f"{column.name!r}: {found.type_sql} -> {column.type_sql}")
    names = {c.name for c in source}
    source_key, target_key = keys
    for column in target:
        if column.name in names or column.generated or column.name in keep:
            continue
        if column.name in target_key:
            refused.append(f"{column.name!r}: {column.type_sql} (primary key) -> absent")
        else:
            changes.append(_kept(column))
    if source_key and target_key and source_key != target_key:
        refused.append(f"primary key: ({', '.join(target_key)}) -> ({', '.join(source_key)})")
    _refuse(refused, changes, mode, labels)
    return tuple(changes)


def _added(column: Column, target_has_rows: Callable[[], bool]) -> ColumnChange:
    default = "" if column.default_sql is None else f" DEFAULT {column.default_sql}"
    if not column.not_null:
        detail, not_null = "nullable, as in the source", False
    elif column.default_sql is not None or not target_has_rows():
        detail, not_null = "NOT NULL, as in the source", True
    else:
        detail, not_null = (
            "nullable: NOT NULL in the source, but the target's existing rows have no value "
            "and the source gives no constant default",
            False,
        )
    return ColumnChange(
        column.name, "added", None, f"{column.type_sql}{default}", detail,
        source=column, not_null=not_null,
    )  # fmt: skip


def _kept(column: Column) -> ColumnChange:
    drop = column.not_null and not column.any_default
    if drop:
        detail = "no longer in the source: kept, its NOT NULL dropped so new rows get NULL"
    elif column.any_default:
        detail = "no longer in the source: kept, new rows get its default"
    else:
        detail = "no longer in the source: kept, new rows get NULL"
    return ColumnChange(
        column.name, "kept", column.type_sql, column.type_sql, detail, drop_not_null=drop
    )


def _refuse(
    refused: Sequence[str], changes: Sequence[ColumnChange], mode: str, labels: tuple[str, str]
) -> None:
    source, target = labels
    if refused:
        raise SchemaChangeError(
            "schema_change_incompatible",
            f"The columns of {source} changed in a way target {target} cannot take without "
            f"losing data: {'; '.join(refused)}. Nothing was written.",
            [
                "Change the target yourself (or copy into a new target table), then run again.",
                "Or restore the source column's type or name.",
            ],
        )
    if mode == "freeze" and changes:
        raise SchemaChangeError(
            "schema_change_incompatible",
            f"schema_changes='freeze' refuses every change, and the columns of {source} differ "
            f"from target {target}: {'; '.join(c.describe() for c in changes)}. Nothing was "
            "written.",
            [
                "Run with schema_changes='evolve' to apply these changes with the data.",
                "Or change the target yourself, then run again.",
            ],
        )


def apply_changes(
    conn: Connection,
    table: TableName,
    changes: Sequence[ColumnChange],
) -> None:
    """Runs the DDL of ``changes`` on ``table`` in ``conn``'s current transaction (one
    ``ALTER TABLE``; nothing when no change needs DDL)."""
    statement = alter_statement(table, changes)
    if statement is not None:
        conn.execute(statement)


def alter_statement(table: TableName, changes: Sequence[ColumnChange]) -> sql.Composed | None:
    """The one ``ALTER TABLE`` of ``changes`` on ``table``; None when no change needs DDL."""
    actions: list[sql.Composable] = []
    for change in changes:
        ident = sql.Identifier(change.column)
        column = change.source
        if change.kind == "added" and column is not None:
            add = sql.SQL("ADD COLUMN {} {}").format(ident, column_type(column))
            parts: list[sql.Composable] = [add]
            if column.default_sql is not None:
                parts.append(sql.SQL("DEFAULT {}").format(sql.SQL(column.default_sql)))
            if change.not_null:
                parts.append(sql.SQL("NOT NULL"))
            actions.append(sql.SQL(" ").join(parts))
        elif change.kind == "widened" and column is not None:
            actions.append(sql.SQL("ALTER COLUMN {} TYPE {}").format(ident, column_type(column)))
        elif change.drop_not_null:
            actions.append(sql.SQL("ALTER COLUMN {} DROP NOT NULL").format(ident))
    if not actions:
        return None
    return sql.SQL("ALTER TABLE {} {}").format(table.ident, sql.SQL(", ").join(actions))


def column_differences(before: Sequence[Column], after: Sequence[Column]) -> list[str]:
    """Each column whose name or type (however spelled) differs between ``before`` and
    ``after``, as ``'name': before -> after`` (``absent`` for a missing column). For a copy that
    cannot change its columns at all (the backfill, mid-run)."""
    old = {c.name: c for c in before}
    new = {c.name: c for c in after}
    found = []
    for name in [*old, *(n for n in new if n not in old)]:
        was, now = old.get(name), new.get(name)
        if was is None or now is None or normal_type(was) != normal_type(now):
            spelled = [c.type_sql if c is not None else "absent" for c in (was, now)]
            found.append(f"{name!r}: {spelled[0]} -> {spelled[1]}")
    return found
