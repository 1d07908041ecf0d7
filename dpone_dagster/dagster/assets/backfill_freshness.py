"""``backfill_freshness_check``: which partitions of a backfill are stale, from the ledger.

Dagster's freshness is asset-level only; a backfill's partitions each have their own age. The
check reads, for every partition, the ledger's run (status, high-water mark, the newest batch's
commit and the newest reconciliation's time) and probes the source's index once for a row of
the partition's range above its mark (the source changed since): nothing is scanned, so it can
run on a schedule of its own.
"""

# No `from __future__ import annotations`: Dagster reads the check's parameter annotations.
from datetime import timedelta

import dagster as dg

from dpone_dagster.backfill import Backfill, ScopeState
from dpone_dagster.dagster.failures import dagster_failures
from dpone_dagster.dagster.metadata.backfill import PARTITIONS_CHECK_NAME, partitions_check
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.partitions import partition_cursor_range
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName


def backfill_freshness_check(
    backfill: dg.AssetsDefinition, *, max_age: timedelta, name: str = PARTITIONS_CHECK_NAME
) -> dg.AssetChecksDefinition:
    """The ``dpone_partitions_fresh`` check of a :func:`~dpone_dagster.backfill_asset`.

    It passes when every partition the ledger has a run of was copied or reconciled within
    ``max_age`` and its source range holds no row above its high-water mark; otherwise it does
    not pass (severity ``WARN``) and names the stale partitions. Its metadata is a table of
    every partition (``dpone/partition_states``) and counts the UI plots
    (``dpone/partitions_stale``, ``dpone/partitions_past_mark``). Rematerialize a stale
    partition to refresh it (a partition at its mark is verified again, and repaired with
    ``on_changed="repair"``).

    Args:
        backfill: The backfill asset.
        max_age: The age beyond which a partition is stale.
        name: The check's name.

    Returns:
        The check definition (resource keys ``source``, ``target``, ``ledger``); add it to the
        ``Definitions``' ``asset_checks`` and run it from the UI or a schedule.

    Raises:
        DponeError: at definition time, for an asset that is not a backfill asset
            (``plan_invalid``).

    Examples:
        .. code-block:: python

            events = backfill_asset("events.page_views", cursor="id", partitions_def=parts)
            stale = backfill_freshness_check(events, max_age=timedelta(days=7))
            defs = dg.Definitions(assets=[events], asset_checks=[stale], resources=...)
    """
    [(key, spec)] = backfill.specs_by_key.items()
    names = CommonMetadataSet.read(spec.metadata, "source_table", "table", "cursor")
    partitions_def = spec.partitions_def
    if None in (names.source_table, names.table, names.cursor) or partitions_def is None:
        raise DponeError(
            "plan_invalid",
            f"Asset {key.to_user_string()} is not a backfill asset.",
            ["Pass the asset backfill_asset(...) returned."],
        )
    table, target_table = TableName.parse(str(names.source_table)), str(names.table)
    cursor = str(names.cursor)

    @dg.asset_check(
        asset=key,
        name=name,
        description=f"Every partition copied or proved within {max_age}, its source unchanged.",
    )
    def _partitions_fresh(
        context: dg.AssetCheckExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: LedgerResource,
    ) -> dg.AssetCheckResult:
        states: list[tuple[str, ScopeState]] = []
        keys = partitions_def.get_partition_keys(dynamic_partitions_store=context.instance)
        with dagster_failures():
            for partition in keys:
                rng = partition_cursor_range(partitions_def, partition)
                with Backfill(
                    source.dsn, target.dsn, table, cursor=cursor, target_table=target_table,
                    ledger=ledger.config(target), lower=rng.lower, upper=rng.upper,
                    connection_options=source.options, target_connection_options=target.options,
                ) as run:  # fmt: skip
                    states.append((partition, run.state()))
        return partitions_check(key, states, max_age, check_name=name)

    return _partitions_fresh
