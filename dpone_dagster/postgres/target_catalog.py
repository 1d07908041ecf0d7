"""What the target's catalog says of an existing target table, in one round trip: its kind,
persistence and primary-key name, whether a ``replace`` may swap a staging table in for it, and
its columns, key and index-leading columns (:class:`~.catalog.TableCatalog`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import TableCatalog, catalog_of, columns_query
from .connection import Connection
from .identifiers import TableName

# A replace can swap the staging table in (drop the old table, rename the new one) only when
# the old table carries nothing that a swap would lose: no index but its primary key, no view,
# trigger, foreign key, policy, publication, owned sequence, statistics object, inheritance,
# grant, storage option of its TOAST table, or comment. Anything else is replaced row by row in
# one transaction. The table's own storage parameters are given to the staging table.
_SWAPPABLE = """
       c.relkind = 'r' AND NOT c.relispartition AND c.relacl IS NULL
       AND NOT EXISTS (SELECT 1 FROM pg_class t WHERE t.oid = c.reltoastrelid
                       AND t.reloptions IS NOT NULL)
       AND NOT c.relrowsecurity AND c.reltablespace = 0 AND c.relreplident = 'd'
       AND pg_get_userbyid(c.relowner) = current_user
       AND obj_description(c.oid, 'pg_class') IS NULL
       AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE c.oid IN (i.inhrelid, i.inhparent))
       AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                       AND a.attacl IS NOT NULL)
       AND NOT EXISTS (
         SELECT 1 FROM pg_depend d
         WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid
           AND NOT ((d.classid = 'pg_type'::regclass AND d.objid = c.reltype)
                    OR d.classid = 'pg_attrdef'::regclass
                    OR (d.classid = 'pg_constraint'::regclass
                        AND EXISTS (SELECT 1 FROM pg_constraint k
                                    WHERE k.oid = d.objid AND k.contype IN ('p', 'c', 'n')))
                    OR (d.classid = 'pg_class'::regclass
                        AND (d.objid = c.reltoastrelid
                             OR EXISTS (SELECT 1 FROM pg_index x WHERE x.indexrelid = d.objid
                                        AND x.indisprimary)))))"""

# The target's facts and its columns in one round trip (no row: no such target; one row whose
# column fields are NULL: a table without columns). Without the swap question the statement
# leaves its catalogs out: a new session's first look at each catalog costs milliseconds.
_TARGET = """
SELECT f.relkind, f.persistence, f.pk_name, f.swappable, f.storage, col.*
FROM (SELECT c.oid, c.relkind::text AS relkind, c.relpersistence::text AS persistence,
             (SELECT conname FROM pg_constraint WHERE conrelid = c.oid AND contype = 'p')
               AS pk_name,
             {swappable} AS swappable, {storage} AS storage
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = %(schema)s AND c.relname = %(name)s
        AND c.relkind IN ('r', 'p', 'v', 'm', 'f')) AS f
LEFT JOIN LATERAL ({columns}) AS col ON true
ORDER BY col.attnum
"""
_QUERIES = {
    swap: _TARGET.format(
        swappable=_SWAPPABLE if swap else "false",
        storage="c.reloptions::text[]" if swap else "NULL::text[]",
        columns=columns_query("f.oid"),
    )
    for swap in (True, False)
}


@dataclass(frozen=True)
class TargetCatalog:
    """An existing target as one catalog query describes it.

    Attributes:
        relkind: Its ``pg_class.relkind`` (``r`` a table, ``p`` a partitioned table).
        persistence: Its ``relpersistence`` (``u`` for an ``UNLOGGED`` table).
        pk_name: The name of its primary-key constraint, if it has one.
        swappable: A ``replace`` may swap a staging table in for it (asked for only then).
        table: Its columns, key and index-leading columns.
        storage: Its storage parameters (``name=value``; asked for with ``swappable``).
    """

    relkind: str
    persistence: str
    pk_name: str | None
    swappable: bool
    table: TableCatalog
    storage: tuple[str, ...] = ()


def target_catalog(target: Connection, table: TableName, *, swap: bool) -> TargetCatalog | None:
    """What the target's catalog says of ``table`` (``None``: no such relation), in one round
    trip; ``swap``: whether a ``replace`` could swap it (a question only ``replace`` asks)."""
    rows = target.execute(_QUERIES[swap], {"schema": table.schema, "name": table.name})
    found = rows.fetchall()
    if not found:
        return None
    first = found[0]
    columns = [r[5:] for r in found if r[5] is not None]
    return TargetCatalog(
        relkind=str(first[0]), persistence=str(first[1]),
        pk_name=None if first[2] is None else str(first[2]), swappable=bool(first[3]),
        table=catalog_of(columns), storage=tuple(first[4] or ()),
    )  # fmt: skip
