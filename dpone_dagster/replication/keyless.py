"""The apply path of a table without a primary key, under ``REPLICA IDENTITY FULL``.

Such a table may hold equal rows, and nothing but a row's values names it: the slot sends the
old row's full image with every update and delete (``REPLICA IDENTITY FULL``), and that image
is what the change applies to. The changes are staged as :mod:`.apply` stages them (the same
staging table, ``COPY`` of the values as the server sent them, in bounded memory), each as a
signed image: an insert adds its new row's image (``I``), a delete removes its old row's image
(``D``), an update removes the old image and adds the new one. A value the update left as an
unchanged TOASTed value (``pgoutput`` still sends ``u`` in the new row under ``FULL``) takes
the old image's value, which the server always sends whole.

Two rows are the same image when every column's text form is the same (``ROW(...)::text`` in
the target session, of both the staged and the target's typed values): NULL is never equal to
a value and equal to NULL (``IS NOT DISTINCT FROM``), and every type compares, ``json`` and
``point`` included. The rows of one image cannot be told apart, so a batch's changes, in
whatever order they came, leave the target holding, per image, its count plus the batch's
added minus its removed copies (the source applied each change to a row that existed, so the
sum is exact; no netting by key, none across images). :meth:`KeylessApply.apply` applies that,
before the commit:

1. per image the batch removes more of than it adds, that many of the target's rows of the
   image are deleted, one ``ctid`` each (equal rows: any of them); a target holding fewer
   fails the run with ``replication_row_missing`` (the target was changed outside the
   replication), nothing committed;
2. per image the batch adds more of than it removes, that many of its staged rows are inserted
   through the one ``append`` sink (:func:`~dpone_dagster.postgres.sinks.apply_sink`).

A batch that removes nothing skips step 1 (no scan of the target); one that removes rows reads
the target once. ``TRUNCATE`` and schema changes split the batch as for a keyed table
(:class:`~.apply.TableApply`). ``deletes="soft"`` is refused for a keyless table at plan time
(:func:`~.group_plan.refuse_keyless_table`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.sinks import apply_sink
from dpone_dagster.postgres.staging import staging_name_for
from dpone_dagster.postgres.target_plan import Sink, TablePlan

from .apply import TableApply
from .changes import UNCHANGED, Value
from .net import NetHook
from .staging_copy import StagingCopy


def table_apply(
    conn: Connection,
    plan: TablePlan,
    soft_column: str | None,
    dsn: str,
    encoding: str,
    on_net: NetHook | None = None,
    copy: StagingCopy | None = None,
) -> TableApply:
    """The apply of one table's changes: by key (:class:`~.apply.TableApply`) for a table with
    a primary key, by the old rows' images (:class:`KeylessApply`) for one without (its plan
    has no source key: :func:`~.group_plan.relation_plan` refused it unless ``REPLICA IDENTITY
    FULL``). ``on_net``: the check's record of the keys applied (a keyed table's only);
    ``copy``: the session's staging ``COPY`` the target transaction's tables share."""
    if not plan.key:
        return KeylessApply(conn, plan, soft_column, dsn, encoding, copy=copy)
    return TableApply(conn, plan, soft_column, dsn, encoding, on_net=on_net, copy=copy)


@dataclass
class KeylessApply(TableApply):
    """One keyless table's changes in the target transaction in progress (see the module).

    Attributes:
        removals: Images staged as removed since the last apply (none: the target is not
            read).
    """

    removals: int = 0

    def update(self, new: Sequence[Value], old: Sequence[Value] | None, at: datetime) -> None:
        """Stages an update: the old row's image removed, the new one added (an unchanged
        TOASTed value taken from the old image)."""
        whole = self._whole(old, "update")
        self.counts.updated += 1
        self.removals += 1
        self._row(b"D", whole)
        self._row(b"I", tuple(o if v is UNCHANGED else v for v, o in zip(new, whole, strict=True)))

    def delete(self, old: Sequence[Value], at: datetime) -> None:
        """Stages a delete: the old row's image removed."""
        whole = self._whole(old, "delete")
        self.counts.deleted += 1
        self.removals += 1
        self._row(b"D", whole)

    def _whole(self, old: Sequence[Value] | None, kind: str) -> Sequence[Value]:
        """The old row's full image, which ``REPLICA IDENTITY FULL`` always sends."""
        if old is None or len(old) != self.width or any(v is UNCHANGED for v in old):
            raise engine_error(
                "replica_identity_missing",
                f"An {kind} of {self.plan.source} came without the old row's full image "
                "(its REPLICA IDENTITY is no longer FULL?).",
            )
        return old

    def apply(self) -> None:
        """Applies the staged images (the module's steps 1 and 2); the staging table is
        emptied."""
        if self._staging is None and not self._buffer:
            return
        self.flush()
        staging = self.staging
        if self.removals:
            self._remove(staging)
        added = staging_name_for(self.plan.target)
        rows = self.conn.execute(_added(self.plan, staging, added, self.removals > 0)).rowcount
        apply_sink(self.conn, self.plan, added, Sink.APPEND, rows)
        self.conn.execute(sql.SQL("TRUNCATE {}").format(staging.ident))
        self.removals = 0

    def _remove(self, staging: TableName) -> None:
        """Deletes, per image the batch removes more of than it adds, that many target rows.

        Raises:
            EngineError: ``replication_row_missing`` when the target holds fewer.
        """
        plan = self.plan
        names = plan.column_names
        statement = sql.SQL(
            "WITH net AS MATERIALIZED ("
            "SELECT {image_s} AS image, sum({sign}) AS d FROM {s} AS s GROUP BY 1),"
            # The target's rows of those images (one scan, hashed), then that many of each.
            " matched AS MATERIALIZED (SELECT t.tableoid, t.ctid, n.image, -n.d AS n"
            " FROM {t} AS t JOIN net AS n ON {image_t} = n.image AND n.d < 0),"
            " gone AS MATERIALIZED (SELECT x.tableoid, x.ctid FROM (SELECT m.*,"
            " row_number() OVER (PARTITION BY m.image) AS rn FROM matched AS m) AS x"
            " WHERE x.rn <= x.n),"
            # Found again by ctid (a TID scan); the tableoid tells partitions apart.
            " deleted AS (DELETE FROM {t} AS t WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM gone))"
            " AND EXISTS (SELECT 1 FROM gone AS g WHERE g.tableoid = t.tableoid"
            " AND g.ctid = t.ctid) RETURNING 1)"
            " SELECT (SELECT coalesce(sum(-d), 0) FROM net WHERE d < 0)::int8,"
            " (SELECT count(*) FROM deleted)::int8"
        ).format(image_s=_image("s", names), sign=_SIGN, s=staging.ident,
                 t=plan.target.ident, image_t=_image("t", names))  # fmt: skip
        row = self.conn.execute(statement).fetchone()
        assert row is not None
        expected, deleted = int(row[0]), int(row[1])
        if deleted != expected:
            raise engine_error(
                "replication_row_missing",
                f"{expected - deleted} of the {expected} row(s) the source's updates and deletes "
                f"of {plan.source} name are not in target {plan.target}.",
            )


_SIGN = sql.SQL("CASE WHEN s._dpone_op = 'I' THEN 1 ELSE -1 END")


def _image(alias: str, names: Sequence[str]) -> sql.Composed:
    """A row's image: the text of the row of its ``names`` columns (NULL-safe, total)."""
    a = sql.Identifier(alias)
    columns = sql.SQL(", ").join(sql.SQL("{}.{}").format(a, sql.Identifier(n)) for n in names)
    return sql.SQL("ROW({})::text").format(columns)


def _added(plan: TablePlan, staging: TableName, added: TableName, removals: bool) -> sql.Composed:
    """``CREATE TABLE added AS`` the staged rows to insert: every added image when nothing was
    removed, else per image the excess of its added over its removed copies."""
    names = plan.column_names
    columns = column_list(names)
    if not removals:
        return sql.SQL("CREATE UNLOGGED TABLE {n} AS SELECT {c} FROM {s} AS s").format(
            n=added.ident, c=columns, s=staging.ident
        )
    of_s = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(n)) for n in names)
    return sql.SQL(
        "CREATE UNLOGGED TABLE {n} AS SELECT {c} FROM ("
        "SELECT {of_s}, s._dpone_op AS _dpone_op, sum({sign}) OVER w AS _dpone_d,"
        " count(*) FILTER (WHERE s._dpone_op = 'I') OVER (w ORDER BY s._dpone_seq) AS _dpone_rn"
        " FROM {s} AS s WINDOW w AS (PARTITION BY {image})) AS x"
        " WHERE x._dpone_op = 'I' AND x._dpone_rn <= x._dpone_d"
    ).format(n=added.ident, c=columns, of_s=of_s, sign=_SIGN, s=staging.ident,
             image=_image("s", names))  # fmt: skip
