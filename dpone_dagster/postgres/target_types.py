"""What a target gets for the user-defined types of the tables a load creates or evolves.

:func:`plan_types` compares the types a table needs in the source (:mod:`.user_types`) with the
target's types of the same names, before anything is written, and decides:

- a type the target lacks is created with the table, in the load's transaction, in dependency
  order (enums, domains, composite and range types; arrays come with them); under ``freeze``
  nothing is created: ``target_type_missing``. Base types with functions of their own, a
  table's row type and a range with a canonical function are never created (also
  ``target_type_missing``, saying why);
- a type the target has with the same definition is used as it is; an enum whose labels are
  the source's with some missing gets them under ``evolve``, each in its place (``ALTER TYPE
  ... ADD VALUE ... BEFORE``); ``freeze`` refuses that (``schema_change_incompatible``);
- a type the target has with another definition is refused: ``target_type_differs``, naming
  both definitions;
- a type an extension owns is never created on its own: an extension the target lacks is
  ``target_extension_missing`` (its version on the source and the ``CREATE EXTENSION`` to run)
  or ``target_extension_unavailable`` (the target server cannot install it at all), unless the
  caller names it in ``create_extensions``: then the load runs ``CREATE EXTENSION`` (and that of
  each extension it requires, which must be named too) in its transaction;
  ``target_extension_not_permitted`` when the target's role may not.

PostgreSQL lets no transaction use an enum label it added itself, so added labels commit in a
transaction of their own just before the load's (:func:`commit_enum_labels`): a load that fails
after it leaves the labels, which no row uses. Everything else is created by
:func:`create_types`, in the load's transaction, so a failed load leaves nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from psycopg import sql

from .catalog import ensure_schema
from .connection import Connection, ConnectionOptions, connect
from .extensions import Extension, create_extension, plan_extensions
from .schema_change import SchemaChangeError, SchemaChanges
from .user_types import TargetTypeError, UserType, create_statements, types_named


@dataclass(frozen=True)
class EnumLabel:
    """A label an enum of the target gains.

    Attributes:
        type: The enum, ``(schema, name)``.
        label: The label.
        before: The target's label it goes before (None: at the end).
    """

    type: tuple[str, str]
    label: str
    before: str | None = None

    def describe(self) -> str:
        """``public.mood: 'meh' before 'ok'`` and the like."""
        where = "at the end" if self.before is None else f"before {self.before!r}"
        return f"{'.'.join(self.type)}: {self.label!r} {where}"


@dataclass(frozen=True)
class TargetTypes:
    """What a load creates in the target for one table's types.

    Attributes:
        extensions: Extensions to create, required ones first.
        types: User-defined types to create, in dependency order.
        labels: Enum labels to add (committed just before the load).
    """

    extensions: tuple[Extension, ...] = ()
    types: tuple[UserType, ...] = ()
    labels: tuple[EnumLabel, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.extensions or self.types or self.labels)

    @classmethod
    def merged(cls, parts: Sequence[TargetTypes]) -> TargetTypes:
        """What several loads created (the batches of one run), each object once, in order."""
        return cls(
            tuple(dict.fromkeys(e for p in parts for e in p.extensions)),
            tuple(dict.fromkeys(t for p in parts for t in p.types)),
            tuple(dict.fromkeys(label for p in parts for label in p.labels)),
        )


@dataclass
class _Findings:
    """What :func:`plan_types` found, type by type."""

    missing: list[str] = field(default_factory=list)
    differs: list[str] = field(default_factory=list)
    create: list[UserType] = field(default_factory=list)
    labels: list[EnumLabel] = field(default_factory=list)
    extensions: dict[str, tuple[str, str]] = field(default_factory=dict)
    absent: dict[str, list[str]] = field(default_factory=dict)


def plan_types(
    target: Connection,
    needed: Sequence[UserType],
    mode: SchemaChanges,
    *,
    table: str,
    create_extensions: Collection[str] = (),
) -> TargetTypes:
    """What the target must get for ``needed`` (the source's types a table uses, in dependency
    order), or the refusal, before anything is written.

    Args:
        target: A session of the target database.
        needed: The source's definitions of the types.
        mode: ``evolve`` creates what is missing and adds enum labels; ``freeze`` creates
            nothing.
        table: The target table, for messages.
        create_extensions: Extensions the load may create when the target lacks them.

    Raises:
        TargetTypeError: ``target_type_differs``, ``target_extension_unavailable``,
            ``target_extension_missing``, ``target_type_missing``.
        SchemaChangeError: ``schema_change_incompatible`` for labels to add under ``freeze``.
    """
    if not needed:
        return TargetTypes()
    theirs = types_named(target, [(t.schema, t.name) for t in needed])
    found = _Findings()
    for mine in needed:
        _compare(mine, theirs.get(mine.qualified), found)
    db = target.info.dbname
    if found.differs:
        raise TargetTypeError(
            "target_type_differs",
            f"Target table {table} needs type(s) that database {db!r} defines otherwise: "
            f"{'; '.join(found.differs)}. Nothing was written.",
            [
                "Make the target's type match the source's (ALTER TYPE, ALTER DOMAIN), or drop "
                "it if nothing uses it, then run again.",
                "Or copy into another target database.",
            ],
        )
    extensions, installed = plan_extensions(
        target, found.extensions, mode, allowed=create_extensions, table=table
    )
    elsewhere = [t for name in sorted(installed) for t in found.absent.get(name, ())]
    if elsewhere:
        raise TargetTypeError(
            "target_type_differs",
            f"Target table {table} needs type(s) {', '.join(elsewhere)}, whose extension "
            f"database {db!r} has in another schema. Nothing was written.",
            [
                "Move the target's extension into the source's schema (ALTER EXTENSION ... "
                "SET SCHEMA), then run again.",
            ],
        )
    _refuse_missing(found, mode, table, db)
    if found.labels and mode is SchemaChanges.FREEZE:
        listed = "; ".join(label.describe() for label in found.labels)
        raise SchemaChangeError(
            "schema_change_incompatible",
            f"schema_changes='freeze' refuses every change, and enum label(s) of the source are "
            f"missing in target {db!r} ({listed}), which table {table} would need. Nothing "
            "was written.",
            [
                "Run with schema_changes='evolve' to add the labels with the data.",
                "Or add them yourself (ALTER TYPE ... ADD VALUE ...), then run again.",
            ],
        )
    return TargetTypes(extensions, tuple(found.create), tuple(found.labels))


def _compare(mine: UserType, theirs: UserType | None, found: _Findings) -> None:
    """Files one needed type under what the target must do about it."""
    if mine.kind == "extension":
        assert mine.extension is not None
        name, version, schema = mine.extension
        found.extensions.setdefault(name, (version, schema))
        if theirs is None:  # fine if the target has no such extension yet: it brings the type
            found.absent.setdefault(name, []).append(mine.qualified)
        elif theirs.kind != "extension":
            found.differs.append(f"{mine.qualified}: source {mine.describe()}; target "
                                 f"{theirs.describe()}")  # fmt: skip
        return
    if theirs is None:
        reason = _not_creatable(mine)
        if reason is None:
            found.create.append(mine)
        else:
            found.missing.append(f"{mine.qualified} ({reason})")
        return
    if mine.kind == "enum" and theirs.kind == "enum":
        if _ordered_within(mine.labels, theirs.labels):
            return  # the target's enum holds every source label, in the same order
        if _ordered_within(theirs.labels, mine.labels):
            found.labels.extend(_labels_to_add(mine, theirs.labels))
            return
    if mine.signature() != theirs.signature():
        found.differs.append(
            f"{mine.qualified}: source {mine.describe()}; target {theirs.describe()}"
        )


def _not_creatable(mine: UserType) -> str | None:
    """Why the package does not create this type, or None when it does."""
    if mine.kind == "other":
        return "a base type with functions of its own, or a table's row type"
    if mine.kind == "range":
        own = [o for o in mine.range_options[:1] + mine.range_options[2:3] if o is not None]
        if mine.canonical or any(schema != "pg_catalog" for schema, _ in own):
            return "a range type with a function or operator class of its own"
    return None


def _ordered_within(few: Sequence[str], many: Sequence[str]) -> bool:
    """Every label of ``few`` is in ``many``, in the same order."""
    rest = iter(many)
    return all(label in rest for label in few)


def _labels_to_add(mine: UserType, have: Sequence[str]) -> list[EnumLabel]:
    """The source's labels the target's enum lacks, each placed before the next label the
    target has (at the end when none follows)."""
    added = []
    for index, label in enumerate(mine.labels):
        if label not in have:
            after = [later for later in mine.labels[index + 1 :] if later in have]
            added.append(EnumLabel((mine.schema, mine.name), label, after[0] if after else None))
    return added


def _refuse_missing(found: _Findings, mode: SchemaChanges, table: str, db: str) -> None:
    frozen = mode is SchemaChanges.FREEZE
    missing = found.missing + ([t.qualified for t in found.create] if frozen else [])
    if not missing:
        return
    why = " (schema_changes='freeze' creates nothing)" if frozen else ""
    actions = ["Create the type(s) in the target database first (same schema and name)."]
    if frozen:
        actions.append("Or run with schema_changes='evolve', which creates them with the table.")
    raise TargetTypeError(
        "target_type_missing",
        f"Target table {table} would need user-defined type(s) {', '.join(sorted(missing))}, "
        f"which database {db!r} does not have{why}. Nothing was written.",
        [*actions, "Or create the target table yourself with types the target has."],
    )


def add_enum_labels(conn: Connection, labels: Sequence[EnumLabel]) -> None:
    """Adds ``labels`` to the target's enums in ``conn``'s transaction: a transaction that
    then uses a label must be another one (PostgreSQL's rule)."""
    for label in labels:
        statement = sql.SQL("ALTER TYPE {} ADD VALUE IF NOT EXISTS {}").format(
            sql.Identifier(*label.type), sql.Literal(label.label)
        )
        if label.before is not None:
            statement = sql.SQL("{} BEFORE {}").format(statement, sql.Literal(label.before))
        conn.execute(statement)


def commit_enum_labels(
    dsn: str, options: ConnectionOptions | None, labels: Sequence[EnumLabel]
) -> None:
    """Adds ``labels`` in one transaction of their own, committed before the load's, which uses
    them (PostgreSQL lets no transaction use a label it added)."""
    if labels:
        with connect(dsn, options, side="target") as conn, conn.transaction():
            add_enum_labels(conn, labels)


def create_types(conn: Connection, plans: Sequence[TargetTypes]) -> None:
    """Creates the extensions and types of ``plans`` in ``conn``'s transaction, each once.

    Raises:
        TargetTypeError: ``target_extension_not_permitted`` when the role may not create an
            extension.
    """
    done: set[str] = set()
    for plan in plans:
        for extension in plan.extensions:
            if extension.name not in done:
                done.add(extension.name)
                create_extension(conn, extension)
        for user_type in plan.types:
            if user_type.qualified not in done:
                done.add(user_type.qualified)
                ensure_schema(conn, user_type.schema)
                for statement in create_statements(user_type):
                    conn.execute(statement)
