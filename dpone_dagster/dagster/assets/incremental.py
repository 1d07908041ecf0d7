"""``incremental_asset``: a non-partitioned asset that keeps a target table current.

A thin factory over :meth:`~dpone_dagster.PostgresSourceResource.incremental`: it checks the
table, cursor and options when the definitions load, builds the spec (naming the table, the
target and the cursor) and the ``dpone_reconciled`` check spec, and an op whose body is
``yield from source.incremental(context, target=target, ledger=ledger, ...)``. Schedule it every few
minutes; a run that finds nothing to do is an index probe.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import dagster as dg

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import engine_error
from dpone_dagster.dagster.events import IncrementalEvent
from dpone_dagster.dagster.metadata.freshness import (
    freshness_check_spec,
    stream_freshness_policy,
)
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.metadata.sets import DponeMetadataSet, DponeRunTags
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator
from dpone_dagster.incremental import (
    DEFAULT_FILLFACTOR,
    DEFAULT_SOFT_DELETE_COLUMN,
    CheckScope,
    Sweep,
    check_options,
)
from dpone_dagster.postgres import (
    INCREMENTAL_BATCH_SIZE,
    BatchSize,
    SchemaChanges,
    check_identifier,
)


def incremental_asset(
    table: str,
    *,
    cursor: str,
    deletes: Deletes | str = Deletes.IGNORE,
    batch_size: int = INCREMENTAL_BATCH_SIZE,
    target_table: str | None = None,
    soft_delete_column: str = DEFAULT_SOFT_DELETE_COLUMN,
    lookback: timedelta | None = None,
    continue_from_backfill: bool = False,
    settle_timeout: float = 30.0,
    translator: DponeTranslator | None = None,
    name: str | None = None,
    group_name: str | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    reconcile: bool = True,
    schema_changes: SchemaChanges | str = SchemaChanges.EVOLVE,
    fillfactor: int = DEFAULT_FILLFACTOR,
    check: CheckScope | str = CheckScope.RUN,
    sweep: Sweep | None = None,
    cron_schedule: str | None = None,
    freshness_policy: dg.FreshnessPolicy | None = None,
    repair: bool = False,
) -> dg.AssetsDefinition:
    """An asset that copies, on each materialization, what changed in ``table`` since the last.

    Args:
        table: The source table (``schema.table``; quote names that need it).
        cursor: The column that grows when a row is inserted or updated (``updated_at`` set by
            the server, or a sequence id): integer, numeric, date or timestamp, indexed, never
            NULL.
        deletes: ``ignore`` (default), ``hard`` (delete target rows whose key the source lost)
            or ``soft`` (set ``soft_delete_column`` on them instead).
        batch_size: Rows per batch (each commits with its receipt and the stream's state).
        target_table: The target table; the source's name by default; created on the first run.
        soft_delete_column: The ``timestamptz`` column ``soft`` sets (added if missing).
        lookback: For a cursor set from a client clock that may run behind the server's: each
            run reads this much below the mark again.
        continue_from_backfill: The first run starts from the mark of a complete
            ``backfill_asset`` of the same table and cursor instead of copying the table.
        settle_timeout: Seconds a run waits for transactions open at its mark.
        translator: Maps the table to its asset spec (key ``[schema, table]`` by default).
        name: The op's name; derived from the key by default.
        group_name: The asset group.
        pool: Dagster concurrency pool limiting runs that read the source.
        op_tags: Tags of the op.
        reconcile: Verify each run in its final snapshot and report the ``dpone_reconciled``
            check (what it compares: ``check``).
        check: ``run`` (default: every key the run copied, exactly, and a rolling slice of the
            key so that every range is verified within ``sweep``'s bound; the cost follows the
            run) or ``full`` (both whole tables, every run). The check run alone (the asset not
            selected) always compares both whole tables.
        schema_changes: ``evolve`` (a column added, widened or dropped in the source changes
            the target in a batch's transaction, listed under ``dpone/schema_changes``) or
            ``freeze`` (any difference fails the run with ``schema_change_incompatible``).
        fillfactor: The ``fillfactor`` of a target the first run creates (the room left on each
            page keeps an updated row on its page); 100 packs pages full. An existing target
            keeps its own.
        sweep: The rolling slice's per-run budget
            (:class:`~dpone_dagster.incremental.Sweep`: ``runs``, default a full sweep in 288
            runs, once a day at a five-minute schedule; or ``rows`` or ``seconds`` per run).
        cron_schedule: The schedule the stream runs on (the same string as its
            ``ScheduleDefinition``'s): the asset's freshness policy is derived from it (warn
            when the data is 1.5 intervals old, fail at 2) unless ``freshness_policy`` is given.
        freshness_policy: The asset's Dagster freshness policy. With either option the asset
            also carries the ``dpone_fresh`` check, which judges the policy by the lag each run
            reports (``dpone/lag_seconds``), where Dagster judges it by materialization times.
        repair: When the check finds rows that differ for no reason the stream knows (the
            target changed behind its back), rewrite exactly those keys from the final batch's
            source snapshot through the stream's own merge and delete path, in its transaction;
            the check then passes, saying what it repaired (``dpone/repaired_keys``,
            ``dpone/repaired_ranges``). Off (default): the check fails naming the keys and the
            sweep's key ranges (``dpone/examples``, ``dpone/differing_ranges``). Needs
            ``reconcile``.

    Returns:
        The asset definition (resource keys ``source``, ``target``, ``ledger``).
        It depends on its source table's external asset (see
        :func:`~dpone_dagster.source_asset_specs`); each materialization carries
        ``dagster/table_name``, ``dagster/column_schema`` (read from the target's catalog after
        the commit) and ``dagster/column_lineage``. The definition carries no column schema:
        reading a catalog when definitions load would make loading need a reachable database.

    Raises:
        DponeError: at definition time, for a bad table name (``identifier_invalid``), cursor
            or option (``incremental_options_invalid``, a bad ``cron_schedule`` too).

    Examples:
        .. code-block:: python

            every_5_min = "*/5 * * * *"
            orders = incremental_asset(
                "shop.orders", cursor="updated_at", deletes="hard", cron_schedule=every_5_min
            )
            defs = dg.Definitions(
                assets=[orders],
                schedules=[dg.ScheduleDefinition(name="orders_every_5_min",
                           target=orders, cron_schedule=every_5_min)],
                resources={"source": ..., "target": ..., "ledger": LedgerResource()},
            )
    """
    spec_in = CopyTableSpec(source=table, target=target_table)
    check_identifier(cursor, what="cursor column")
    how = (
        Deletes.parse(deletes),
        BatchSize.parse(batch_size, refusal="incremental_options_invalid"),
        SchemaChanges.parse(schema_changes),
    )
    check_options(lookback, settle_timeout, fillfactor)
    scope = CheckScope.parse(check)
    if repair and not reconcile:
        raise engine_error(
            "incremental_options_invalid",
            "repair=True with reconcile=False: only the check finds what to repair.",
            ["Leave reconcile on with repair=True (or leave repair off)."],
        )
    check_identifier(soft_delete_column, what="soft-delete column")
    check_instance_storage()
    spec = (translator or DponeTranslator()).get_asset_spec(spec_in)
    check_spec = dg.AssetCheckSpec(
        CHECK_NAME, asset=spec.key, description="Target equals source at or below the mark."
    )
    policy = stream_freshness_policy(
        cron_schedule, freshness_policy, refusal="incremental_options_invalid"
    )
    checks = ([check_spec] if reconcile else []) + (
        [freshness_check_spec(spec.key)] if policy is not None else []
    )

    @dg.multi_asset(
        name=name or f"incremental_{spec.key.to_python_identifier()}",
        specs=[
            spec.replace_attributes(
                metadata={**spec.metadata, **DponeMetadataSet(cursor=cursor)},
                freshness_policy=policy,
            )
        ],
        check_specs=checks,
        can_subset=True,  # the check alone verifies the target without running the stream
        pool=pool,
        op_tags={**(op_tags or {}), **DponeRunTags(source_table=spec_in.source_table.qualified)},
        group_name=group_name,
    )
    def _incremental(
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: LedgerResource,
    ) -> Iterator[IncrementalEvent]:
        yield from source.incremental(
            context, target=target, ledger=ledger, deletes=how[0],
            soft_delete_column=soft_delete_column, batch_size=how[1], lookback=lookback,
            continue_from_backfill=continue_from_backfill, settle_timeout=settle_timeout,
            reconcile=reconcile, schema_changes=how[2], fillfactor=fillfactor, check=scope,
            sweep=sweep, repair=repair,
        )  # fmt: skip

    return _incremental
