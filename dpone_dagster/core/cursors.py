"""Which columns can be an engine's cursor: the types both the server and the engines order
the same way.

Cursor values are kept as the server's canonical text, in a session pinned to ``TimeZone=UTC``
and ISO dates (:func:`dpone_dagster.core.sessions.prepared_session`), and reach SQL as bind
parameters cast back to the cursor's own type, so they always compare by the column's ordering.
The engines also compare them without a server (the backfill's pure rules): numbers as numbers,
dates and timestamps as instants, which is PostgreSQL's order for exactly these types.
"""

from __future__ import annotations

from typing import Final

from dpone_dagster.postgres.catalog import Column

CURSOR_TYPES: Final = frozenset(
    {"int2", "int4", "int8", "numeric", "date", "timestamp", "timestamptz"}
)
"""The built-in types a cursor may have."""


def is_cursor_type(column: Column) -> bool:
    """True when ``column``'s type is a built-in type of :data:`CURSOR_TYPES`."""
    return column.type_schema == "pg_catalog" and column.type_name in CURSOR_TYPES
