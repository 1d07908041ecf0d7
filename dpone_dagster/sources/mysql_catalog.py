"""What a MySQL/MariaDB server says about a table's or a query's columns.

A table is described from ``information_schema`` (exact lengths, and MariaDB's ``JSON``, which
is ``longtext`` with a ``json_valid`` check). A query is described from the result-set metadata
of ``SELECT * FROM (<query>) AS q LIMIT 0``: no row is read, and no privilege beyond the query's
own is needed. String lengths in that metadata are in bytes of the connection's character set,
so a query's character columns are staged as ``text``.
"""

from __future__ import annotations

from typing import Any

import pymysql
from pymysql.constants import FIELD_TYPE, FLAG

from .mysql_types import MySQLColumnType
from .protocol import SourceError


def quote_mysql_identifier(name: str) -> str:
    """Quotes a MySQL identifier with backticks, doubling any backtick inside.

    Raises:
        SourceError: ``identifier_invalid`` for an empty name or one with a NUL byte.

    Examples:
        >>> quote_mysql_identifier("we`ird name")
        '`we``ird name`'
    """
    if not name or "\x00" in name:
        raise SourceError(
            "identifier_invalid",
            f"{name!r} is not a usable MySQL identifier.",
            ["Name the table and columns exactly as the server spells them."],
        )
    return "`" + name.replace("`", "``") + "`"


_COLUMNS = """
SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_MAXIMUM_LENGTH,
       NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
ORDER BY ORDINAL_POSITION
"""

# MariaDB's JSON is LONGTEXT plus a CHECK (json_valid(`col`)) constraint.
_JSON_CHECKS = """
SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s
"""


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def table_columns(
    conn: pymysql.Connection[Any], database: str, table: str
) -> list[tuple[str, MySQLColumnType, bool]]:
    """Returns ``(name, type, nullable)`` for every column of ``database.table`` in order.

    Raises:
        SourceError: ``table_not_found`` when the table does not exist.
    """
    with conn.cursor() as cursor:
        cursor.execute(_COLUMNS, (database, table))
        rows = cursor.fetchall()
        if not rows:
            raise SourceError(
                "table_not_found",
                f"Table {quote_mysql_identifier(database)}.{quote_mysql_identifier(table)} "
                "does not exist (or this user cannot see it).",
                ["Check the database and table names (exact spelling).", "Check grants."],
            )
        json_checks: set[str] = set()
        if any(str(r[1]) == "longtext" for r in rows):
            cursor.execute(_JSON_CHECKS, (database, table))
            json_checks = {str(r[0]) for r in cursor.fetchall()}
    described = []
    for name, data_type, column_type, nullable, char_len, precision, scale, fsp in rows:
        spelling = str(column_type)
        kind = str(data_type).lower()
        if kind == "longtext" and f"json_valid({quote_mysql_identifier(name)})" in json_checks:
            kind, spelling = "json", "json"
        length = _int(precision) if kind == "bit" else _int(char_len)
        mysql = MySQLColumnType(
            data_type=kind,
            spelling=spelling,
            unsigned="unsigned" in spelling.lower(),
            length=length,
            precision=_int(precision),
            scale=_int(scale),
            fsp=_int(fsp),
        )
        described.append((str(name), mysql, str(nullable) == "YES"))
    return described


_BINARY_CHARSET = 63
_FIELD_KINDS = {
    FIELD_TYPE.DECIMAL: "decimal",
    FIELD_TYPE.NEWDECIMAL: "decimal",
    FIELD_TYPE.TINY: "tinyint",
    FIELD_TYPE.SHORT: "smallint",
    FIELD_TYPE.INT24: "mediumint",
    FIELD_TYPE.LONG: "int",
    FIELD_TYPE.LONGLONG: "bigint",
    FIELD_TYPE.FLOAT: "float",
    FIELD_TYPE.DOUBLE: "double",
    FIELD_TYPE.NULL: "null",
    FIELD_TYPE.TIMESTAMP: "timestamp",
    FIELD_TYPE.DATE: "date",
    FIELD_TYPE.NEWDATE: "date",
    FIELD_TYPE.TIME: "time",
    FIELD_TYPE.DATETIME: "datetime",
    FIELD_TYPE.YEAR: "year",
    FIELD_TYPE.BIT: "bit",
    FIELD_TYPE.JSON: "json",
    FIELD_TYPE.ENUM: "enum",
    FIELD_TYPE.SET: "set",
    FIELD_TYPE.GEOMETRY: "geometry",
}
_STRINGS = {
    FIELD_TYPE.VARCHAR,
    FIELD_TYPE.VAR_STRING,
    FIELD_TYPE.STRING,
    FIELD_TYPE.TINY_BLOB,
    FIELD_TYPE.MEDIUM_BLOB,
    FIELD_TYPE.LONG_BLOB,
    FIELD_TYPE.BLOB,
}


def _field_type(field: Any) -> MySQLColumnType:
    """Reads one result-set column definition (a PyMySQL ``FieldDescriptorPacket``)."""
    code, flags, scale = int(field.type_code), int(field.flags), int(field.scale)
    unsigned = bool(flags & FLAG.UNSIGNED)
    if code in _STRINGS:
        if flags & FLAG.ENUM:
            kind = "enum"
        elif flags & FLAG.SET:
            kind = "set"
        else:
            kind = "varbinary" if int(field.charsetnr) == _BINARY_CHARSET else "text"
    else:
        kind = _FIELD_KINDS.get(code, f"type code {code}")
    precision = None
    if kind == "decimal":
        # The length counts the decimal point and the sign, as the server prints them.
        precision = int(field.length) - (1 if scale else 0) - (0 if unsigned else 1)
    temporal = kind in ("datetime", "timestamp", "time")
    return MySQLColumnType(
        data_type=kind,
        spelling=kind + (" unsigned" if unsigned else ""),
        unsigned=unsigned,
        length=int(field.length) if kind == "bit" else None,
        precision=precision,
        scale=scale if kind == "decimal" else None,
        fsp=scale if temporal and scale <= 6 else None,
    )


def query_columns(conn: pymysql.Connection[Any], query: str) -> list[tuple[str, MySQLColumnType]]:
    """Returns ``(name, type)`` for every column a query returns, reading no row.

    Raises:
        SourceError: ``mysql_query_invalid`` when the server rejects the query.
    """
    with conn.cursor() as cursor:
        try:
            # The query is the user's own SQL, run with the user's own grants, by design.
            cursor.execute(f"SELECT * FROM ({query}) AS dpone_q LIMIT 0")  # noqa: S608
        except pymysql.MySQLError as exc:
            raise SourceError(
                "mysql_query_invalid",
                f"The server rejected the source query: {exc}",
                ["Run the query in a MySQL client and fix it; give a single SELECT."],
            ) from None
        # PyMySQL keeps the column definitions (flags, charset, decimals) on the result; the
        # DB-API description drops the unsigned flag and the binary charset this mapping needs.
        fields = cursor._result.fields
        return [(str(f.name), _field_type(f)) for f in fields]
