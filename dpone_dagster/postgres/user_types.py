"""What a catalog says of the user-defined types a table's columns need, in dependency order.

:func:`source_types` follows every column's type through array elements, domain base types,
composite attributes, range subtypes and a multirange's range, down to the built-in types, and
returns each user-defined type it met as a :class:`UserType`: an enum (its labels in order), a
domain (base type, default, ``NOT NULL``, checks), a composite type (its attributes), a range
type (subtype, operator class, collation, difference function, multirange's name), or a type
an extension owns (the walk stops there: the extension brings it). Types come out in the order
they can be created: a domain over an enum after the enum, a composite after the domain it
holds. :func:`types_named` reads the same definitions of the types of those names in another
database (the target), so the two are compared as definitions, never as OIDs or spellings.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from psycopg import sql

from dpone_dagster.lifecycle import DponeError

from .catalog import Column, TypeRef
from .connection import Connection

TypeKind = Literal["enum", "domain", "composite", "range", "extension", "other"]

# OIDs below FirstNormalObjectId belong to the server's own catalog (built-in types).
_FIRST_USER_OID = 16384

_WALK = """
WITH RECURSIVE need(oid) AS (
    {seed}
  UNION
    SELECT d.dep FROM need JOIN pg_type t ON t.oid = need.oid
    CROSS JOIN LATERAL (
        SELECT t.typelem WHERE t.typtype = 'b' AND t.typcategory = 'A' AND t.typelem <> 0
        UNION ALL SELECT t.typbasetype WHERE t.typtype = 'd'
        UNION ALL SELECT a.atttypid FROM pg_attribute a
                  WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0
                    AND NOT a.attisdropped
        UNION ALL SELECT r.rngsubtype FROM pg_range r WHERE r.rngtypid = t.oid
        UNION ALL SELECT r.rngtypid FROM pg_range r WHERE r.rngmultitypid = t.oid
    ) AS d(dep)
    WHERE t.oid >= 16384 AND NOT EXISTS (
        SELECT 1 FROM pg_depend e WHERE e.classid = 'pg_type'::regclass AND e.objid = t.oid
                                    AND e.deptype = 'e')
)
SELECT t.oid::bigint, n.nspname::text, t.typname::text, t.typtype::text,
       t.typtype = 'b' AND t.typcategory = 'A' AND t.typelem <> 0, t.typelem::bigint,
       x.extname::text, x.extversion, xn.nspname::text,
       (SELECT c.relkind::text FROM pg_class c WHERE c.oid = t.typrelid),
       ARRAY(SELECT enumlabel::text FROM pg_enum WHERE enumtypid = t.oid ORDER BY enumsortorder),
       CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) END,
       t.typbasetype::bigint, t.typnotnull, pg_get_expr(t.typdefaultbin, 0),
       ARRAY(SELECT k.conname::text FROM pg_constraint k
             WHERE k.contypid = t.oid AND k.contype = 'c' ORDER BY k.conname),
       ARRAY(SELECT pg_get_constraintdef(k.oid) FROM pg_constraint k
             WHERE k.contypid = t.oid AND k.contype = 'c' ORDER BY k.conname),
       ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum),
       ARRAY(SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum),
       ARRAY(SELECT a.atttypid::bigint FROM pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum),
       format_type(r.rngsubtype, NULL), r.rngsubtype::bigint,
       (SELECT ARRAY[on_.nspname::text, o.opcname::text] FROM pg_opclass o
        JOIN pg_namespace on_ ON on_.oid = o.opcnamespace WHERE o.oid = r.rngsubopc),
       (SELECT ARRAY[cn.nspname::text, c.collname::text] FROM pg_collation c
        JOIN pg_namespace cn ON cn.oid = c.collnamespace WHERE c.oid = r.rngcollation),
       r.rngcanonical <> 0,
       (SELECT ARRAY[pn.nspname::text, p.proname::text] FROM pg_proc p
        JOIN pg_namespace pn ON pn.oid = p.pronamespace WHERE p.oid = r.rngsubdiff),
       (SELECT ARRAY[mn.nspname::text, m.typname::text] FROM pg_type m
        JOIN pg_namespace mn ON mn.oid = m.typnamespace WHERE m.oid = r.rngmultitypid)
FROM need
JOIN pg_type t ON t.oid = need.oid
JOIN pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_depend e ON e.classid = 'pg_type'::regclass AND e.objid = t.oid
                     AND e.deptype = 'e' AND e.refclassid = 'pg_extension'::regclass
LEFT JOIN pg_extension x ON x.oid = e.refobjid
LEFT JOIN pg_namespace xn ON xn.oid = x.extnamespace
LEFT JOIN pg_range r ON r.rngtypid = t.oid
WHERE t.oid >= 16384
"""
_BY_OID = _WALK.format(seed="SELECT unnest(%(oids)s::oid[])")
_BY_NAME = _WALK.format(
    seed="SELECT t.oid FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
    "JOIN unnest(%(schemas)s::text[], %(names)s::text[]) AS w(s, n) "
    "ON n.nspname = w.s AND t.typname = w.n"
)


class TargetTypeError(DponeError):
    """A type or an extension the copy needs cannot be had in the target as the source has it."""


@dataclass(frozen=True)
class UserType:
    """A user-defined type as its catalog defines it.

    Attributes:
        schema: Its schema.
        name: Its name.
        kind: ``enum``, ``domain``, ``composite``, ``range``, ``extension`` (an extension's
            type) or ``other`` (a base type with functions of its own, a table's row type: the
            package does not create those).
        labels: An enum's labels, in order.
        base: A domain's base type, a range's subtype.
        not_null: A domain's ``NOT NULL``.
        default: A domain's default expression.
        checks: A domain's check constraints, ``(name, definition)``, by name.
        attributes: A composite's attributes, ``(name, type)``, in order.
        range_options: A range's ``SUBTYPE_OPCLASS``, ``COLLATION``, ``SUBTYPE_DIFF`` and
            ``MULTIRANGE_TYPE_NAME`` (``(schema, name)`` each, or None).
        canonical: A range has a canonical function (the package does not create those).
        extension: The extension that owns the type, with its version and schema.
    """

    schema: str
    name: str
    kind: TypeKind
    labels: tuple[str, ...] = ()
    base: TypeRef | None = None
    not_null: bool = False
    default: str | None = None
    checks: tuple[tuple[str, str], ...] = ()
    attributes: tuple[tuple[str, TypeRef], ...] = ()
    range_options: tuple[tuple[str, str] | None, ...] = ()
    canonical: bool = False
    extension: tuple[str, str, str] | None = None

    @property
    def qualified(self) -> str:
        """``schema.name``, as messages name it."""
        return f"{self.schema}.{self.name}"

    @property
    def depends_on(self) -> tuple[str, ...]:
        """The user-defined types this one names (they must exist first)."""
        refs = [self.base, *(t for _, t in self.attributes)]
        return tuple(f"{r.user[0]}.{r.user[1]}" for r in refs if r is not None and r.user)

    def signature(self) -> tuple[object, ...]:
        """What two databases' types of this name must share to be the same type."""
        options = tuple(o if o is None else tuple(o) for o in self.range_options)
        return (
            self.kind, self.labels, self.base and self.base.identity, self.not_null,
            self.default, tuple(sorted(d for _, d in self.checks)),
            tuple((a, t.identity) for a, t in self.attributes), options, self.canonical,
            self.extension and self.extension[0],
        )  # fmt: skip

    def describe(self) -> str:
        """The definition in words, for messages (``enum ('sad', 'ok')`` and the like)."""
        if self.kind == "enum":
            return f"enum ({', '.join(repr(label) for label in self.labels)})"
        if self.kind == "domain":
            assert self.base is not None
            parts = [f"domain over {self.base.identity}"]
            parts += ["NOT NULL"] if self.not_null else []
            parts += [f"DEFAULT {self.default}"] if self.default is not None else []
            return " ".join([*parts, *(d for _, d in self.checks)])
        if self.kind == "composite":
            return f"composite ({', '.join(f'{a} {t.identity}' for a, t in self.attributes)})"
        if self.kind == "range":
            assert self.base is not None
            return f"range of {self.base.identity}"
        if self.kind == "extension":
            assert self.extension is not None
            return f"type of extension {self.extension[0]}"
        return "a type the package does not create"


def source_types(conn: Connection, type_oids: Iterable[int]) -> tuple[UserType, ...]:
    """The user-defined types the types ``type_oids`` (columns' ``atttypid``) need, each once,
    in an order they can be created in (what a type names comes before it)."""
    oids = list(dict.fromkeys(oid for oid in type_oids if oid >= _FIRST_USER_OID))
    if not oids:
        return ()
    rows = conn.execute(_BY_OID, {"oids": oids}).fetchall()
    by_oid = {int(r[0]): r for r in rows}
    first = [by_oid[int(by_oid[o][5])] if by_oid[o][4] else by_oid[o] for o in oids if o in by_oid]
    return _in_order(_types(rows), [f"{r[1]}.{r[2]}" for r in first])


def types_named(conn: Connection, names: Collection[tuple[str, str]]) -> dict[str, UserType]:
    """The types of these ``(schema, name)`` in ``conn``'s database (and the types they need),
    by ``schema.name``; a name the database lacks is absent."""
    if not names:
        return {}
    schemas, plain = [s for s, _ in names], [n for _, n in names]
    rows = conn.execute(_BY_NAME, {"schemas": schemas, "names": plain}).fetchall()
    return {t.qualified: t for t in _types(rows)}


def create_statements(user_type: UserType) -> list[sql.Composed]:
    """The statements that create ``user_type`` (its schema exists: :func:`.catalog.ensure_schema`
    first): an enum, a composite, a range or a domain (its checks added one by one, as the
    catalog prints them)."""
    name = sql.Identifier(user_type.schema, user_type.name)
    if user_type.kind == "enum":
        labels = sql.SQL(", ").join(sql.Literal(label) for label in user_type.labels)
        return [sql.SQL("CREATE TYPE {} AS ENUM ({})").format(name, labels)]
    if user_type.kind == "composite":
        attributes = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(a), t.composed())
            for a, t in user_type.attributes
        )
        return [sql.SQL("CREATE TYPE {} AS ({})").format(name, attributes)]
    assert user_type.base is not None
    if user_type.kind == "range":
        return [sql.SQL("CREATE TYPE {} AS RANGE ({})").format(name, _range(user_type))]
    parts: list[sql.Composable] = [
        sql.SQL("CREATE DOMAIN {} AS {}").format(name, user_type.base.composed())
    ]
    if user_type.default is not None:  # the catalog's own expression text
        parts.append(sql.SQL("DEFAULT {}").format(sql.SQL(user_type.default)))
    if user_type.not_null:
        parts.append(sql.SQL("NOT NULL"))
    checks = [
        sql.SQL("ALTER DOMAIN {} ADD CONSTRAINT {} {}").format(
            name, sql.Identifier(check), sql.SQL(definition)
        )
        for check, definition in user_type.checks
    ]
    return [sql.SQL(" ").join(parts), *checks]


def _range(user_type: UserType) -> sql.Composed:
    assert user_type.base is not None
    options = [sql.SQL("SUBTYPE = {}").format(user_type.base.composed())]
    keys = ("SUBTYPE_OPCLASS", "COLLATION", "SUBTYPE_DIFF", "MULTIRANGE_TYPE_NAME")
    for key, value in zip(keys, user_type.range_options, strict=True):
        if value is not None:
            options.append(sql.SQL("{} = {}").format(sql.SQL(key), sql.Identifier(*value)))
    return sql.SQL(", ").join(options)


def needed_by(types: Sequence[UserType], columns: Iterable[Column]) -> tuple[UserType, ...]:
    """The types of ``types`` (a table's, in creation order) that ``columns`` need, in the same
    order: their own and every type those name."""
    by_name = _by_name(types)
    wanted = [f"{c.type_schema}.{c.type_name}" for c in columns if c.user_type]
    need: set[str] = set()
    while wanted:
        found = by_name.get(wanted.pop())
        if found is not None and found.qualified not in need:
            need.add(found.qualified)
            wanted.extend(found.depends_on)
    return tuple(t for t in types if t.qualified in need)


def _in_order(types: Sequence[UserType], first: Sequence[str]) -> tuple[UserType, ...]:
    """``types`` in an order they can be created in: each after what it names, else in the
    order of ``first`` (the columns' types), then by name."""
    by_name = _by_name(types)
    ordered: dict[str, UserType] = {}

    def visit(name: str) -> None:
        found = by_name.get(name)
        if found is not None and found.qualified not in ordered:
            for dependency in found.depends_on:
                visit(dependency)
            ordered[found.qualified] = found

    for name in [*first, *sorted(by_name)]:
        visit(name)
    return tuple(ordered.values())


def _by_name(types: Iterable[UserType]) -> dict[str, UserType]:
    """Types by ``schema.name``, a range also by its multirange's name (which comes with it)."""
    by_name = {t.qualified: t for t in types}
    for t in list(by_name.values()):
        multirange = t.range_options[3] if t.kind == "range" else None
        if multirange is not None:
            by_name.setdefault(".".join(multirange), t)
    return by_name


def _types(rows: Sequence[Sequence[Any]]) -> list[UserType]:
    """The types (not the arrays) among the walk's rows, their references resolved."""
    by_oid: Mapping[int, Sequence[Any]] = {int(r[0]): r for r in rows}

    def ref(spelling: str, oid: int) -> TypeRef:
        row = by_oid.get(oid)
        if row is None:  # a built-in type
            return TypeRef(spelling)
        if row[4]:  # an array: named by its element
            element = by_oid[int(row[5])]
            return TypeRef(spelling, (element[1], element[2]), array=True)
        return TypeRef(spelling, (row[1], row[2]))

    return [_user_type(r, ref) for r in rows if not r[4] and r[3] != "m"]


def _user_type(row: Sequence[Any], ref: Any) -> UserType:
    """One type from its row of the walk (``ref`` resolves a referenced type)."""
    schema, name, typtype = row[1], row[2], row[3]
    if row[6] is not None:
        return UserType(schema, name, "extension", extension=(row[6], row[7], row[8]))
    if typtype == "e":
        return UserType(schema, name, "enum", labels=tuple(row[10]))
    if typtype == "d":
        checks = tuple(zip(row[15], row[16], strict=True))
        return UserType(
            schema, name, "domain", base=ref(row[11], int(row[12])), not_null=bool(row[13]),
            default=row[14], checks=checks,
        )  # fmt: skip
    if typtype == "c" and row[9] == "c":
        attributes = tuple(
            (a, ref(s, int(o))) for a, s, o in zip(row[17], row[18], row[19], strict=True)
        )
        return UserType(schema, name, "composite", attributes=attributes)
    if typtype == "r":
        options = tuple(None if o is None else (o[0], o[1]) for o in (*row[22:24], *row[25:27]))
        return UserType(
            schema, name, "range", base=ref(row[20], int(row[21])), range_options=options,
            canonical=bool(row[24]),
        )  # fmt: skip
    return UserType(schema, name, "other")
