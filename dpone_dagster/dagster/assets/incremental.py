"""``incremental_asset``: a non-partitioned asset that keeps a target table current.

A thin factory over :meth:`~dpone_dagster.PostgresSourceResource.incremental`, in the cursor
engine's asset shape (:mod:`.cursor_asset`): it checks the table, cursor and options when the
definitions load, builds the spec (naming the table, the target and the cursor, with the
freshness policy the schedule implies) and the ``dpone_reconciled`` and ``dpone_fresh`` check
specs, and an op whose body is
``yield from source.incremental(context, target=target, ledger=ledger, options=options)``.
Schedule it every few minutes; a run that finds nothing to do is an index probe.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events import IncrementalEvent
from dpone_dagster.dagster.metadata.freshness import (
    freshness_check_spec,
    stream_freshness_policy,
)
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.translator import DponeTranslator
from dpone_dagster.incremental import IncrementalOptions

from .cursor_asset import cursor_asset, cursor_spec, reconciled_check


def incremental_asset(
    table: str,
    *,
    cursor: str,
    deletes: Deletes | str | None = None,
    batch_size: int | None = None,
    options: IncrementalOptions | None = None,
    target_table: str | None = None,
    translator: DponeTranslator | None = None,
    name: str | None = None,
    group_name: str | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    cron_schedule: str | None = None,
    freshness_policy: dg.FreshnessPolicy | None = None,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """An asset that copies, on each materialization, what changed in ``table`` since the last.

    Args:
        table: The source table (``schema.table``; quote names that need it).
        cursor: The column that grows when a row is inserted or updated (``updated_at`` set by
            the server, or a sequence id): integer, numeric, date or timestamp, indexed, never
            NULL.
        deletes: A shortcut for ``options.deletes``: ``ignore`` (default), ``hard``, ``soft``
            or ``sweep``.
        batch_size: A shortcut for ``options.batch_size``: rows per batch.
        options: How the stream runs
            (:class:`~dpone_dagster.incremental.IncrementalOptions`: deletes, batch size,
            look-back, continuing a backfill, the ``dpone_reconciled`` check and its sweep,
            repair, schema changes, fillfactor...); the defaults when ``None``. The shortcuts
            given override its fields.
        target_table: The target table; the source's name by default; created on the first run.
        translator: Maps the table to its asset spec (key ``[schema, table]`` by default).
        name: The op's name; derived from the key by default.
        group_name: The asset group.
        pool: Dagster concurrency pool limiting runs that read the source.
        op_tags: Tags of the op.
        cron_schedule: The schedule the stream runs on (the same string as its
            ``ScheduleDefinition``'s): the asset's freshness policy is derived from it (warn
            when the data is 1.5 intervals old, fail at 2) unless ``freshness_policy`` is given.
        freshness_policy: The asset's Dagster freshness policy. With either option the asset
            also carries the ``dpone_fresh`` check, which judges the policy by the lag each run
            reports (``dpone/lag_seconds``), where Dagster judges it by materialization times.
        **legacy: The other options as keyword arguments (``reconcile=False``, ``sweep=...``),
            as this factory took them before
            :class:`~dpone_dagster.incremental.IncrementalOptions`: accepted for one release,
            with a ``DeprecationWarning``.

    Returns:
        The asset definition (resource keys ``source``, ``target``, ``ledger``).
        It depends on its source table's external asset (see
        :func:`~dpone_dagster.source_asset_specs`); each materialization carries
        ``dagster/table_name``, ``dagster/column_schema`` (read from the target's catalog after
        the commit) and ``dagster/column_lineage``. With ``options.reconcile`` (the default) it
        declares the ``dpone_reconciled`` check. The definition carries no column schema:
        reading a catalog when definitions load would make loading need a reachable database.

    Raises:
        DponeError: at definition time, for a bad table name (``identifier_invalid``), cursor
            or option (``incremental_options_invalid``, a bad ``cron_schedule`` too).
        TypeError: for a keyword argument that is no option.

    Examples:
        .. code-block:: python

            every_5_min = "*/5 * * * *"
            orders = incremental_asset(
                "shop.orders", cursor="updated_at", deletes="hard", cron_schedule=every_5_min
            )
            audited = incremental_asset(
                "shop.payments", cursor="updated_at",
                options=IncrementalOptions(check="full", lookback=timedelta(seconds=30)),
            )
            defs = dg.Definitions(
                assets=[orders, audited],
                schedules=[dg.ScheduleDefinition(name="orders_every_5_min",
                           target=orders, cron_schedule=every_5_min)],
                resources={"source": ..., "target": ..., "ledger": LedgerResource()},
            )
    """
    chosen = build_options(
        IncrementalOptions, options, caller="incremental_asset",
        shortcuts={"deletes": deletes, "batch_size": batch_size}, legacy=legacy,
    )  # fmt: skip
    spec_in, spec = cursor_spec(table, cursor, target_table, translator)
    policy = stream_freshness_policy(
        cron_schedule, freshness_policy, refusal="incremental_options_invalid"
    )
    reconciled = reconciled_check(spec.key, "Target equals source at or below the mark.")
    checks = ([reconciled] if chosen.reconcile else []) + (
        [freshness_check_spec(spec.key)] if policy is not None else []
    )

    def run(
        source: PostgresSourceResource, context: dg.AssetExecutionContext,
        target: PostgresTargetResource, ledger: LedgerResource,
    ) -> Iterator[IncrementalEvent]:  # fmt: skip
        yield from source.incremental(context, target=target, ledger=ledger, options=chosen)

    return cursor_asset(
        "incremental", spec_in, spec.replace_attributes(freshness_policy=policy), run,
        check_specs=checks, name=name, group_name=group_name, pool=pool, op_tags=op_tags,
    )  # fmt: skip
