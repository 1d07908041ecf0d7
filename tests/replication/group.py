"""A replication group under test: a source on the logical server, a target on the main one,
the run, and whole-table comparisons of both sides (the one digest)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from dpone_dagster.postgres.connection import ConnectionOptions
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.reconcile.digest import pin_settings
from dpone_dagster.replication import ReplicationOptions
from dpone_dagster.replication.engine import Replication
from dpone_dagster.replication.group_plan import ReplicationGroup
from dpone_dagster.replication.replication_report import ReplicationProgress, ReplicationReport
from tests.helpers import pg


def ledger_state(target: str) -> tuple[str | None, int]:
    """The phase of the target's one replication group and the source transactions its ledger
    counts as applied (``(None, 0)`` before its ledger row exists)."""
    if not pg.table_exists(target, "dpone_ledger", "replication_groups"):
        return None, 0
    rows = pg.fetch_all(target, "SELECT phase, transactions FROM dpone_ledger.replication_groups")
    return (str(rows[0][0]), int(rows[0][1])) if rows else (None, 0)  # type: ignore[call-overload]


@dataclass(frozen=True)
class Group:
    """The group ``tables`` of ``source`` into ``target`` (slot ``slot``)."""

    source: str
    target: str
    tables: tuple[str, ...]
    slot: str = "dpone_test"
    publication: str | None = None

    def group(self, **options: Any) -> ReplicationGroup:
        """The group, with ``options`` (:class:`ReplicationOptions`'s fields; runs unchecked
        unless ``reconcile=True``)."""
        return ReplicationGroup(
            tuple(TableName.parse(t) for t in self.tables),
            slot=self.slot,
            publication=self.publication or self.slot + "_pub",
            options=ReplicationOptions(**{"reconcile": False, **options}),
        )

    def replication(
        self,
        *,
        adopt: bool = False,
        resync: bool = False,
        batch_changes: int | None = None,
        connection_options: ConnectionOptions | None = None,
        on_progress: Callable[[ReplicationProgress], None] | None = None,
        standby: str | None = None,
        **kwargs: Any,
    ) -> Replication:
        """The engine of the group (``standby``: the DSN of a standby of the source, whose copy
        of the slot the run reports)."""
        extra: dict[str, Any] = {} if batch_changes is None else {"batch_changes": batch_changes}
        if standby is not None:
            extra["standby"] = standby
        return Replication(
            self.group(**kwargs),
            source=self.source,
            target=self.target,
            adopt=adopt,
            resync=resync,
            connection_options=connection_options,
            on_progress=on_progress,
            **extra,
        )

    def run(self, **kwargs: Any) -> ReplicationReport:
        """One run."""
        return self.replication(**kwargs).run()

    def rows(self, dsn: str, table: str, columns: str = "*") -> list[str]:
        """Every row of ``table`` as its text (digest settings pinned), sorted."""
        name = TableName.parse(table)
        with psycopg.connect(dsn, autocommit=True) as conn:
            pin_settings(conn, local=False)
            query = sql.SQL("SELECT t::text FROM (SELECT {} FROM {}) AS t").format(
                sql.SQL(columns), name.ident
            )
            return sorted(str(r[0]) for r in conn.execute(query).fetchall())

    def assert_equal(self, table: str | None = None, columns: str = "*") -> None:
        """The target holds exactly the source's rows of ``table`` (every table by default)."""
        for name in [table] if table else self.tables:
            source, target = (
                self.rows(self.source, name, columns),
                self.rows(self.target, name, columns),
            )
            if target != source:  # the rows each side has more of, for the failure's message
                extra = Counter(target) - Counter(source)
                missing = Counter(source) - Counter(target)
                raise AssertionError(
                    f"{name}: {len(target)} target rows, {len(source)} source rows; in the target "
                    f"only: {sorted(extra.elements())[:10]}; missing from the target: "
                    f"{sorted(missing.elements())[:10]}"
                )

    def target_oid(self, table: str) -> int:
        """The target table's OID: a table copied again (``replace``) gets a new one."""
        return int(str(pg.fetch_one(self.target, "SELECT %s::regclass::oid::int8", (table,))))

    def digests_equal(self, table: str) -> bool:
        """Both sides' fingerprints of ``table`` are equal."""
        schema, name = table.split(".")
        return pg.table_fingerprint(self.source, schema, name) == pg.table_fingerprint(
            self.target, schema, name
        )


DDL_LOG = """
CREATE TABLE public.ddl_log (tag text NOT NULL);
CREATE FUNCTION public.log_ddl() RETURNS event_trigger LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO public.ddl_log (tag) VALUES (tg_tag); END $$;
CREATE EVENT TRIGGER dpone_test_log_ddl ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS') EXECUTE FUNCTION public.log_ddl();
"""
"""An event trigger that logs every table the target creates (a staging or netting table)."""


def tables_created(target: str) -> int:
    """The ``CREATE TABLE`` statements the target logged, then forgets them."""
    with psycopg.connect(target, autocommit=True) as conn:
        row = conn.execute("WITH gone AS (DELETE FROM public.ddl_log RETURNING 1) "
                           "SELECT count(*) FROM gone").fetchone()  # fmt: skip
    assert row is not None
    return int(row[0])
