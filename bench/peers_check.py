"""Whether a tool's copy of ``public.mixed`` holds the source's values (``bench/peers.py``).

Each server computes, in one scan, the row count and an md5 per column of the values in ``id``
order; a target column is cast back to the source column's type first, or both sides are compared
as JSON where the tool stored the column as JSON (dlt stores an array so). Only when the target's
query fails (a value that does not cast back) is it run column by column, to name the column.
"""

from __future__ import annotations

from psycopg import errors, sql

from tests.helpers import pg


def columns(dsn: str, schema: str = "public", name: str = "mixed") -> dict[str, str]:
    """The table's columns and their types (``format_type``), in order."""
    query = (
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    )
    table = sql.Identifier(schema, name).as_string()
    return {str(c): str(t) for c, t in pg.fetch_all(dsn, query, (table,))}


def _digest(dsn: str, table: tuple[str, str], values: dict[str, sql.Composable]) -> list[object]:
    """The row count and, per column expression, the md5 of every row's value in ``id`` order."""
    parts = [sql.SQL("md5(string_agg(md5(coalesce(({})::text, '\\N')), '' ORDER BY id))").format(v)
             for v in values.values()]  # fmt: skip
    query = sql.SQL("SELECT count(*), {} FROM {}").format(
        sql.SQL(", ").join(parts), sql.Identifier(*table)
    )
    return list(pg.fetch_all(dsn, query)[0])


def _compared(column: str, kind: str, stored: str) -> tuple[sql.Composable, sql.Composable]:
    """How one column is compared: (the source's value, the target's value cast back to the
    source's type; both as JSON where the tool stored a non-JSON column as JSON)."""
    name = sql.Identifier(column)
    if stored in ("json", "jsonb") and kind not in ("json", "jsonb"):
        return sql.SQL("to_jsonb({})").format(name), sql.SQL("{}::jsonb").format(name)
    return name, sql.SQL("{}::{}").format(name, sql.SQL(kind))


def _target_digest(
    target: str, table: tuple[str, str], values: dict[str, sql.Composable]
) -> list[object]:
    """:func:`_digest` of the target; a column whose values do not cast back to the source's
    type is named as such (found column by column, only when the whole query fails)."""
    try:
        return _digest(target, table, values)
    except errors.DataError:
        found: list[object] = [_digest(target, table, {})[0]]
        for column, value in values.items():
            try:
                found += _digest(target, table, {column: value})[1:]
            except errors.DataError as error:
                found.append(f"not castable: {error.diag.message_primary}")
        return found


def verify(source: str, target: str, table: tuple[str, str]) -> str:
    """``equal`` when the target holds the source's rows, value for value, in every source
    column (:func:`_compared`); else what differs."""
    if not pg.table_exists(target, *table):
        return f"differs: no table {'.'.join(table)}"
    kinds, stored = columns(source), columns(target, *table)
    if missing := [c for c in kinds if c not in stored]:
        return f"differs: columns missing: {', '.join(missing)}"
    pairs = {c: _compared(c, k, stored[c]) for c, k in kinds.items()}
    expected = _digest(source, ("public", "mixed"), {c: s for c, (s, _) in pairs.items()})
    got = _target_digest(target, table, {c: t for c, (_, t) in pairs.items()})
    if got[0] != expected[0]:
        return f"differs: {got[0]} rows, not {expected[0]}"
    differ = [c for c, e, g in zip(kinds, expected[1:], got[1:], strict=True) if e != g]
    return "equal" if not differ else f"differs: {', '.join(differ)}"
