"""What the PostgreSQL catalog says about a table: its columns, types and primary key.

It is also the one place that reads a type's spelling as a type (:func:`normal_type`): the
catalog's ``numeric(14,2)``, a generic source's ``varchar(40)`` or ``timestamptz(3)``, and a
domain over its base type are compared by what they are, not how they are written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql
from psycopg.rows import TupleRow

from dpone_dagster.lifecycle import DponeError

from .connection import Connection
from .identifiers import TableName


class CatalogError(DponeError):
    """A table or column the catalog does not know."""


def ensure_schema(conn: Connection, schema: str) -> bool:
    """Creates ``schema`` if it does not exist; True when it was created.

    The catalog is read first: ``CREATE SCHEMA IF NOT EXISTS`` needs the database's ``CREATE``
    privilege even when the schema exists, and a role with ``USAGE, CREATE`` on the schema
    alone is all a load into an existing schema needs (least privilege).
    """
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", (schema,)
    ).fetchone()
    if row is not None and row[0]:
        return False
    # IF NOT EXISTS: another session may create it between the look-up and here.
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    return True


@dataclass(frozen=True)
class Column:
    """One column of a table, as the catalog describes it.

    Attributes:
        name: The exact column name.
        type_sql: The type as ``format_type`` prints it (``numeric(14,2)``, ``"My Enum"[]``).
        type_oid: The type's OID on this server.
        not_null: The column has a NOT NULL constraint.
        default_sql: The default expression when it is a constant, else None.
        generated: A generated (computed) column: never written.
        user_type: The type (or its array element) is user-defined (enum, domain, composite):
            its OID differs between databases, so binary COPY cannot carry it across.
        type_schema: Schema of a user-defined type, for messages.
        type_name: Name of a user-defined type (the element type for arrays).
        generation_sql: The expression of a generated column, else None.
        virtual: A ``VIRTUAL`` generated column (PostgreSQL 18 and later: computed when read,
            never stored), else ``STORED`` or not generated.
        base_type_sql: For a domain, its base type as ``format_type`` prints it, else None.
        any_default: The column has a default of any kind (a constant, ``nextval``, an
            expression) or is an identity column: an insert that leaves it out still fills it.
    """

    name: str
    type_sql: str
    type_oid: int
    not_null: bool
    default_sql: str | None
    generated: bool
    user_type: bool
    type_schema: str
    type_name: str
    generation_sql: str | None = None
    base_type_sql: str | None = None
    any_default: bool = False
    virtual: bool = False

    @property
    def ident(self) -> sql.Identifier:
        """The column's name composed for SQL."""
        return sql.Identifier(self.name)


_COLUMNS = """
SELECT a.attname,
       format_type(a.atttypid, a.atttypmod),
       a.atttypid::bigint,
       a.attnotnull,
       CASE WHEN d.adbin IS NOT NULL AND a.attgenerated = ''
                 AND pg_get_expr(d.adbin, d.adrelid) !~* '(nextval|\\()'
            THEN pg_get_expr(d.adbin, d.adrelid) END,
       a.attgenerated <> '',
       base.oid >= 16384,
       bn.nspname,
       base.typname,
       CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END,
       CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) END,
       d.adbin IS NOT NULL OR a.attidentity <> '',
       (SELECT k.ord FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
        WHERE i.indrelid = a.attrelid AND i.indisprimary AND k.attnum = a.attnum),
       EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = a.attrelid AND x.indkey[0] = a.attnum
               AND x.indisvalid AND x.indpred IS NULL),
       a.attnum,
       a.attgenerated = 'v'
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type base ON base.oid = CASE WHEN t.typelem <> 0 AND t.typcategory = 'A'
                                     THEN t.typelem ELSE t.oid END
JOIN pg_namespace bn ON bn.oid = base.typnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = ({relation}) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_RELATION_OID = """
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
"""

# The relation looked up inside the query: one round trip instead of two.
_COLUMNS_OF = _COLUMNS.format(relation=_RELATION_OID)


def columns_query(relation: str) -> str:
    """The columns query of the relation whose OID the SQL expression ``relation`` gives (a
    column of an outer query, such as ``f.oid``): for a query that reads more in the same
    round trip."""
    return _COLUMNS.format(relation=relation)


def relation_oid(conn: Connection, table: TableName) -> int | None:
    """The table's OID, or None when it does not exist (exact names, no search_path)."""
    row = conn.execute(_RELATION_OID, (table.schema, table.name)).fetchone()
    return int(row[0]) if row else None


@dataclass(frozen=True)
class TableCatalog:
    """A table as one catalog query describes it.

    Attributes:
        columns: Its columns, in order.
        key: Its primary-key columns in key order (empty when it has none).
        index_leads: The columns that lead a valid index without a predicate: a range of one
            of them is read through that index.
    """

    columns: tuple[Column, ...]
    key: tuple[str, ...]
    index_leads: frozenset[str]


def table_columns(conn: Connection, table: TableName) -> list[Column]:
    """Returns the table's columns in order.

    Raises:
        CatalogError: ``table_not_found`` when the table does not exist.
    """
    return list(table_catalog(conn, table).columns)


def table_catalog(conn: Connection, table: TableName) -> TableCatalog:
    """Returns the table's columns, primary key and index-leading columns, in one round trip.

    Raises:
        CatalogError: ``table_not_found`` when the table does not exist.
    """
    rows = conn.execute(_COLUMNS_OF, (table.schema, table.name)).fetchall()
    if not rows and relation_oid(conn, table) is None:  # one round trip when the table exists
        raise CatalogError(
            "table_not_found",
            f"Table {table} does not exist in database {conn.info.dbname!r}.",
            [
                "Check the schema and table name (quoted names keep their case).",
                "Check that the DSN points at the right database.",
            ],
        )
    return catalog_of(rows)


def catalog_of(rows: Sequence[TupleRow]) -> TableCatalog:
    """The :class:`TableCatalog` of a table from the rows of its columns query."""
    columns = tuple(
        Column(
            name=str(r[0]),
            type_sql=str(r[1]),
            type_oid=int(r[2]),
            not_null=bool(r[3]),
            default_sql=None if r[4] is None else str(r[4]),
            generated=bool(r[5]),
            user_type=bool(r[6]),
            type_schema=str(r[7]),
            type_name=str(r[8]),
            generation_sql=None if r[9] is None else str(r[9]),
            base_type_sql=None if r[10] is None else str(r[10]),
            any_default=bool(r[11]),
            virtual=bool(r[15]),
        )
        for r in rows
    )
    keyed = sorted((int(r[12]), str(r[0])) for r in rows if r[12] is not None)
    leads = frozenset(str(r[0]) for r in rows if r[13])
    return TableCatalog(columns, tuple(name for _, name in keyed), leads)


def column_list(columns: Sequence[Column] | Sequence[str]) -> sql.Composed:
    """``"a", "b", "c"`` for SQL text."""
    names = [c.name if isinstance(c, Column) else c for c in columns]
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def columns_equal(left: str, right: str, names: Sequence[str]) -> sql.Composed:
    """``"l"."a" = "r"."a" AND ...``: the rows of aliases ``left`` and ``right`` agree on the
    columns ``names`` (a join on a key; each equality may use the key's index)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(
            sql.Identifier(left), sql.Identifier(n), sql.Identifier(right), sql.Identifier(n)
        )
        for n in names
    )


@dataclass(frozen=True)
class TypeRef:
    """A type named inside a definition (a domain's base type, an attribute's type, a range's
    subtype).

    Attributes:
        spelling: The type as ``format_type`` prints it (its modifiers included).
        user: The user-defined type (or array element) it is, as ``(schema, name)``; None for a
            built-in type.
        array: An array of ``user``.
    """

    spelling: str
    user: tuple[str, str] | None = None
    array: bool = False

    @property
    def identity(self) -> str:
        """What the type is, the same in every database: ``schema.name`` (with ``[]``) for a
        user-defined type, the spelling of a built-in one."""
        if self.user is None:
            return self.spelling
        return f"{self.user[0]}.{self.user[1]}{'[]' if self.array else ''}"

    def composed(self) -> sql.Composable:
        """The type for DDL: a built-in as the catalog prints it, a user-defined type from its
        exact schema and name."""
        if self.user is None:
            return sql.SQL(self.spelling)  # format_type() output of a built-in type
        return sql.Composed([sql.Identifier(*self.user), sql.SQL("[]" if self.array else "")])


def column_type(column: Column) -> sql.Composable:
    """A column's type for DDL: built-in types as the catalog prints them, user-defined types
    (enums, domains, composites, their arrays) composed from their exact schema and name."""
    user = (column.type_schema, column.type_name) if column.user_type else None
    return TypeRef(column.type_sql, user, column.type_sql.endswith("[]")).composed()


@dataclass(frozen=True)
class NormalType:
    """A column type as what it is, whatever its spelling.

    Attributes:
        name: The type's canonical name (``character varying``, ``timestamp with time zone``;
            ``schema.name`` for a user-defined type).
        modifiers: Its modifiers with PostgreSQL's defaults filled in (``(14, 2)`` for
            ``numeric(14,2)``, ``(6,)`` for a bare ``timestamp``; empty for an unconstrained
            ``numeric`` or ``varchar``).
        array: An array of that type.
    """

    name: str
    modifiers: tuple[int, ...]
    array: bool

    def __str__(self) -> str:
        mods = f"({','.join(str(m) for m in self.modifiers)})" if self.modifiers else ""
        return f"{self.name}{mods}{'[]' if self.array else ''}"


_ALIASES = {
    "int": "integer", "int4": "integer", "int2": "smallint", "int8": "bigint",
    "varchar": "character varying", "char": "character", "bpchar": "character",
    "bool": "boolean", "float8": "double precision", "float4": "real", "decimal": "numeric",
    "timestamptz": "timestamp with time zone", "timestamp": "timestamp without time zone",
    "timetz": "time with time zone", "time": "time without time zone", "varbit": "bit varying",
}  # fmt: skip
_DEFAULT_MODIFIERS = {
    "timestamp with time zone": (6,), "timestamp without time zone": (6,),
    "time with time zone": (6,), "time without time zone": (6,), "character": (1,),
}  # fmt: skip
_SPELLING = re.compile(
    r"^(?P<head>[^(\[]*?)\s*(?:\((?P<mods>[^)]*)\))?\s*(?P<tail>[^(\[]*?)\s*"
    r"(?P<array>(?:\[\d*\])*)$"
)


def normal_type(column: Column) -> NormalType:
    """What ``column``'s type is: aliases resolved, default modifiers filled in, a domain read as
    its base type, a user-defined type by its schema and name.

    Examples:
        >>> from dataclasses import replace
        >>> c = Column("v", "varchar(40)", 0, False, None, False, False, "pg_catalog", "varchar")
        >>> normal_type(c) == normal_type(replace(c, type_sql="character varying(40)"))
        True
        >>> str(normal_type(replace(c, type_sql="timestamptz")))
        'timestamp with time zone(6)'
    """
    if column.base_type_sql is not None:
        return parse_type(column.base_type_sql)
    if column.user_type:
        return NormalType(
            f"{column.type_schema}.{column.type_name}", (), column.type_sql.endswith("]")
        )
    return parse_type(column.type_sql)


def parse_type(spelling: str) -> NormalType:
    """A built-in type's spelling (``format_type`` output or a common alias) as a NormalType."""
    found = _SPELLING.match(spelling.strip().lower())
    parts = [] if found is None else (found["mods"] or "").replace(" ", "").split(",")
    if found is None or not all(p.isdigit() for p in parts if p):  # compared as written
        return NormalType(" ".join(spelling.lower().split()), (), False)
    name = " ".join(f"{found['head']} {found['tail']}".split())
    name = _ALIASES.get(name, name)
    mods = tuple(int(p) for p in parts if p)
    return NormalType(name, mods or _DEFAULT_MODIFIERS.get(name, ()), bool(found["array"]))
