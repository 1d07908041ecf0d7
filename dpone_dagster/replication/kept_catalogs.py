"""The catalogs a table of the group was last planned from, kept in the ledger between runs.

A run that applies a table's changes plans them from both catalogs
(:func:`~.group_plan.relation_plan`). Every run opens new server processes, and a new process's
first look at the catalogs costs milliseconds on each side: planning a table was the largest
part of a run that applies a few changes. The ledger keeps, per table, what its last plan read:
the source's columns as the slot's Relation message described them, the target's catalog, and a
fingerprint of each side's catalog rows for the table (:data:`FINGERPRINT`). A run whose
Relation message and fingerprints are the same plans from the kept catalogs; any other reads both
catalogs again and keeps what it read.

The fingerprint lists the transaction id (``xmin``) of every catalog row a plan reads of the
table: its ``pg_class`` row, each column's ``pg_attribute`` row and its type's ``pg_type`` row,
its defaults, its indexes and its constraints; and each column's type as ``regtype`` spells it
(a schema renamed under the type) with a domain's base type. A DDL statement that changes what
the catalogs say of the table writes a new version of one of those rows, in its own
transaction; ``VACUUM`` (a ``FREEZE`` too), ``ANALYZE`` and ``COMMENT`` write none of them
(``tests/replication/test_kept_catalogs.py`` proves both, statement by statement). The
fingerprints are read before the catalogs they vouch for: a change that commits between the two
reads leaves the kept fingerprint older than the kept catalogs, and the next run reads them
again. Only the catalogs are kept: what a plan decides from them (the schema-change policy,
the types a target lacks, the role's privileges) is decided again by every run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from dpone_dagster.postgres.catalog import Column, TableCatalog
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_catalog import TargetCatalog
from dpone_dagster.postgres.target_plan import TablePlan
from dpone_dagster.postgres.threads import at_once

from .changes import Relation
from .group_plan import ReplicationGroup, relation_catalogs, relation_plan

FORMAT = 1
"""The kept document's format: a document of another one is read again from the catalogs."""

FINGERPRINT = """
SELECT concat_ws(';', c.oid, c.xmin,
  (SELECT string_agg(concat_ws(':', a.attnum, a.xmin, t.xmin, a.atttypid::regtype,
                               CASE WHEN t.typtype = 'd'
                                    THEN format_type(t.typbasetype, t.typtypmod) END),
                     ',' ORDER BY a.attnum)
   FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
   WHERE a.attrelid = c.oid AND a.attnum > 0),
  (SELECT string_agg(d.xmin::text, ',' ORDER BY d.oid) FROM pg_catalog.pg_attrdef d
   WHERE d.adrelid = c.oid),
  (SELECT string_agg(i.xmin::text, ',' ORDER BY i.indexrelid) FROM pg_catalog.pg_index i
   WHERE i.indrelid = c.oid),
  (SELECT string_agg(k.xmin::text, ',' ORDER BY k.oid) FROM pg_catalog.pg_constraint k
   WHERE k.conrelid = c.oid))
FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass(%s)
"""
"""One table's fingerprint (see the module); no row: no such table."""


def fingerprint(conn: Connection, table: TableName) -> str | None:
    """``table``'s catalog fingerprint on ``conn``'s server (see the module); None when it
    does not exist."""
    row = conn.execute(FINGERPRINT, (table.qualified,)).fetchone()
    return None if row is None else str(row[0])


def relation_key(relation: Relation) -> str:
    """What a plan reads of a Relation message, as text: its table's OID, replica identity and
    columns."""
    columns = [[c.name, c.type_oid, c.type_modifier, c.is_key] for c in relation.columns]
    return json.dumps([relation.oid, relation.replica_identity, columns], separators=(",", ":"))


@dataclass(frozen=True)
class KeptCatalogs:
    """What a table's last plan read (see the module).

    Attributes:
        relation: The Relation message it was planned from (:func:`relation_key`).
        fingerprints: The source's and the target's fingerprints, read before the catalogs.
        source: The source's columns as :func:`~.group_plan.relation_columns` made them.
        target: The target's catalog.
    """

    relation: str
    fingerprints: tuple[str, str]
    source: TableCatalog
    target: TargetCatalog

    def document(self) -> dict[str, Any]:
        """The ledger's document (JSON types only)."""
        return {
            "format": FORMAT, "relation": self.relation, "fingerprints": list(self.fingerprints),
            "source": _catalog_document(self.source),
            "target": {**asdict(self.target), "table": _catalog_document(self.target.table),
                       "storage": list(self.target.storage)},
        }  # fmt: skip

    @classmethod
    def parse(cls, document: object) -> KeptCatalogs | None:
        """The kept catalogs of a ledger's document; None for none, or one this release does
        not read (the table is planned from its catalogs again)."""
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return None
        try:
            target = dict(document["target"])
            target.update(table=_catalog(target["table"]), storage=tuple(target["storage"]))
            source_print, target_print = document["fingerprints"]
            return cls(
                relation=str(document["relation"]),
                fingerprints=(str(source_print), str(target_print)),
                source=_catalog(document["source"]),
                target=TargetCatalog(**target),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _catalog_document(catalog: TableCatalog) -> dict[str, Any]:
    return {
        "columns": [asdict(c) for c in catalog.columns],
        "key": list(catalog.key),
        "index_leads": sorted(catalog.index_leads),
    }


def _catalog(document: dict[str, Any]) -> TableCatalog:
    return TableCatalog(
        columns=tuple(Column(**c) for c in document["columns"]),
        key=tuple(str(k) for k in document["key"]),
        index_leads=frozenset(str(c) for c in document["index_leads"]),
    )


def kept_plan(
    src: Connection,
    tgt: Connection,
    table: TableName,
    relation: Relation,
    group: ReplicationGroup,
    kept: KeptCatalogs | None,
) -> tuple[TablePlan, KeptCatalogs | None]:
    """``table``'s plan (:func:`~.group_plan.relation_plan`), from ``kept`` when both
    fingerprints and the Relation message are the ones it was read with, else from both
    catalogs.

    Returns:
        The plan, and the catalogs to keep in the ledger (None: the kept ones still hold, or the
        target does not exist).

    Raises:
        The errors of :func:`~.group_plan.relation_plan`.
    """
    prints = at_once(partial(fingerprint, src, table), partial(fingerprint, tgt, table))
    key = relation_key(relation)
    if kept is not None and kept.relation == key and kept.fingerprints == prints:
        return relation_plan(src, tgt, table, relation, group,
                             catalogs=(kept.source, kept.target)), None  # fmt: skip
    catalogs = relation_catalogs(src, tgt, table, relation)
    plan = relation_plan(src, tgt, table, relation, group, catalogs=catalogs)
    source_print, target_print = prints
    source, target = catalogs
    if source_print is None or target_print is None or target is None:
        return plan, None
    return plan, KeptCatalogs(key, (source_print, target_print), source, target)
