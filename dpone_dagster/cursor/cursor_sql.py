"""Cursor values without a server: how they compare (numbers as numbers, timestamps and dates as
instants).

Cursor values are kept as the server's canonical text (the faces' table shapes read them), so
the pure rules compare them without a database, in the order PostgreSQL gives the cursor types it
accepts (:data:`dpone_dagster.cursor.table_check.CURSOR_TYPES`): ``"9"`` sorts before
``"10"``, and ``"2024-01-01 23:00:00+00"`` is not before ``"2024-01-02 00:00:00+01"``.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation


def _cursor_key(value: str) -> Decimal | datetime | None:
    try:
        number = Decimal(value)
    except InvalidOperation:
        number = None
    if number is not None and number.is_finite():
        return number
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def cursor_is_strictly_before(left: str, right: str) -> bool:
    """True when cursor value ``left`` sorts strictly before ``right``.

    Numbers compare as numbers (``"9" < "10"``), ISO timestamps and dates as instants; other
    values (uuids) as strings, which matches PostgreSQL's order for them.
    """
    a, b = _cursor_key(left), _cursor_key(right)
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a < b
    if isinstance(a, datetime) and isinstance(b, datetime):
        try:
            return a < b
        except TypeError:  # naive against aware: not one column's values
            return left < right
    return left < right


def cursor_at_most(left: str, right: str) -> bool:
    """True when cursor value ``left`` sorts before ``right`` or equals it."""
    return not cursor_is_strictly_before(right, left)
