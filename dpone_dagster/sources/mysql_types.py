"""MySQL/MariaDB column types, their PostgreSQL counterparts, and value conversion.

The mapping keeps every value the source can hold:

=============================  ===========================  ==================================
MySQL/MariaDB                  PostgreSQL                   why
=============================  ===========================  ==================================
tinyint, smallint [unsigned]   smallint / integer           unsigned widens one step
mediumint, int [unsigned]      integer / bigint
bigint unsigned                numeric(20,0)                up to 18446744073709551615
decimal(p,s)                   numeric(p,s)
float / double                 real / double precision
bit(1) / bit(n)                boolean / bit(n)
year                           smallint
date / datetime(p)             date / timestamp(p)
timestamp(p)                   timestamptz(p)               the session reads it in UTC
time(p)                        interval                     MySQL TIME spans -838:59:59..838:59:59
char(n), varchar(n)            varchar(n)
*text                          text
binary, varbinary, *blob       bytea
json (MariaDB: json_valid)     jsonb
enum, set                      text
uuid / inet4, inet6            uuid / inet                  MariaDB 10.7+
=============================  ===========================  ==================================

Anything else (spatial types, vectors) is refused with ``mysql_type_unmappable`` before any row
moves. ``tinyint(1)`` (``BOOL``) stays ``smallint``: MySQL stores any value from -128 to 127 in
it. A zero date (``0000-00-00``) has no PostgreSQL value: it stops the load with
``mysql_value_unmappable``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from .protocol import SourceColumn, SourceError

Converter = Callable[[Any], object]


@dataclass(frozen=True)
class MySQLColumnType:
    """A MySQL/MariaDB column type, read from ``information_schema`` or result metadata.

    Attributes:
        data_type: The lower-case type name (``bigint``, ``varchar``, ``json``).
        spelling: The type as the server spells it, for messages (``bigint(20) unsigned``).
        unsigned: An unsigned integer or decimal.
        length: Characters of a ``char``/``varchar`` (None when unknown), bits of a ``bit``.
        precision: Digits of a ``decimal``.
        scale: Fraction digits of a ``decimal``.
        fsp: Fractional-second precision of a ``datetime``/``timestamp``/``time``.
    """

    data_type: str
    spelling: str
    unsigned: bool = False
    length: int | None = None
    precision: int | None = None
    scale: int | None = None
    fsp: int | None = None


_SIGNED = {"tinyint": "smallint", "smallint": "smallint", "mediumint": "integer",
           "int": "integer", "integer": "integer", "bigint": "bigint"}  # fmt: skip
_UNSIGNED = {"tinyint": "smallint", "smallint": "integer", "mediumint": "integer",
             "int": "bigint", "integer": "bigint", "bigint": "numeric(20,0)"}  # fmt: skip
_PLAIN = {
    "float": "real",
    "double": "double precision",
    "double precision": "double precision",
    "real": "double precision",
    "year": "smallint",
    "date": "date",
    "time": "interval",
    "tinytext": "text",
    "text": "text",
    "mediumtext": "text",
    "longtext": "text",
    "binary": "bytea",
    "varbinary": "bytea",
    "tinyblob": "bytea",
    "blob": "bytea",
    "mediumblob": "bytea",
    "longblob": "bytea",
    "json": "jsonb",
    "enum": "text",
    "set": "text",
    "uuid": "uuid",
    "inet4": "inet",
    "inet6": "inet",
    "null": "text",
}


def pg_type_for(column: str, mysql: MySQLColumnType) -> str:
    """Returns the PostgreSQL type that holds every value of ``mysql``.

    Args:
        column: The column's name, for the error message.
        mysql: The source type.

    Raises:
        SourceError: ``mysql_type_unmappable`` for a type without a faithful PostgreSQL type.

    Examples:
        >>> pg_type_for("n", MySQLColumnType("bigint", "bigint(20) unsigned", unsigned=True))
        'numeric(20,0)'
        >>> pg_type_for("d", MySQLColumnType("decimal", "decimal(14,2)", precision=14, scale=2))
        'numeric(14,2)'
    """
    kind = mysql.data_type
    if kind in _SIGNED:
        return (_UNSIGNED if mysql.unsigned else _SIGNED)[kind]
    if kind in ("decimal", "numeric"):
        if mysql.precision is None:
            return "numeric"
        return f"numeric({mysql.precision},{mysql.scale or 0})"
    if kind == "bit":
        return "boolean" if (mysql.length or 1) == 1 else f"bit({mysql.length})"
    if kind in ("datetime", "timestamp"):
        name = "timestamp" if kind == "datetime" else "timestamptz"
        return name if mysql.fsp is None else f"{name}({mysql.fsp})"
    if kind in ("char", "varchar"):
        return "text" if mysql.length is None else f"varchar({mysql.length})"
    if kind in _PLAIN:
        return _PLAIN[kind]
    raise SourceError(
        "mysql_type_unmappable",
        f"Column {column!r} has type {mysql.spelling!r}, which has no faithful PostgreSQL "
        "type; no row was copied.",
        [
            "Leave the column out (columns=[...]) or select it converted in a query "
            "(for a spatial type: ST_AsText(col) AS col).",
        ],
    )


def _zero_date(column: str, value: str) -> SourceError:
    return SourceError(
        "mysql_value_unmappable",
        f"Column {column!r} holds {value!r}, a MySQL zero date that PostgreSQL cannot store.",
        [
            "Select the column with NULLIF(col, '0000-00-00') in a query, or fix the source rows.",
        ],
    )


def converter_for(column: str, mysql: MySQLColumnType) -> Converter | None:
    """Returns the function that turns a driver value into what COPY stages, or None.

    PyMySQL already returns ints, Decimals, dates, timedeltas, bytes and JSON text that COPY
    takes as they are; conversion is needed for bits, UTC timestamps and zero dates.
    """
    kind = mysql.data_type
    if kind == "bit":
        width = mysql.length or 1
        if width == 1:
            return lambda v: None if v is None else int.from_bytes(v, "big") != 0
        return lambda v: None if v is None else format(int.from_bytes(v, "big"), f"0{width}b")
    if kind in ("date", "datetime", "timestamp"):
        aware = kind == "timestamp"

        def temporal(value: object) -> object:
            if value is None or isinstance(value, date):
                if aware and isinstance(value, datetime):
                    return value.replace(tzinfo=UTC)
                return value
            raise _zero_date(column, str(value))

        return temporal
    return None


def source_column(name: str, mysql: MySQLColumnType, *, nullable: bool) -> SourceColumn:
    """The :class:`SourceColumn` for a MySQL column (raises before any row moves)."""
    return SourceColumn(name, pg_type_for(name, mysql), mysql.spelling, nullable)


def row_converter(columns: list[tuple[str, MySQLColumnType]]) -> Callable[[tuple[Any, ...]], Any]:
    """Returns a function converting one driver row (a tuple) into a staged row."""
    converters = [converter_for(name, mysql) for name, mysql in columns]
    active = [(i, c) for i, c in enumerate(converters) if c is not None]
    if not active:
        return lambda row: row

    def convert(row: tuple[Any, ...]) -> tuple[Any, ...]:
        values = list(row)
        for index, conv in active:
            values[index] = conv(values[index])
        return tuple(values)

    return convert
