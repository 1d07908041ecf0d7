"""``replication_assets``: one multi-asset that keeps a group of tables current from the WAL.

A thin factory over :meth:`~dpone_dagster.PostgresSourceResource.replicate`: it checks the
tables, the slot and the options when the definitions load, builds one spec per table (keys by
the translator, each naming its tables, slot, publication and schedule) and its
``dpone_slot_healthy`` and ``dpone_reconciled`` check specs, and an op whose body is
``yield from source.replicate(context, ...)``. The asset is not subsettable: one slot feeds every
table, and a source transaction that touched several tables is applied whole. Its op's pool is
the slot's name by default, so that an instance whose pools are enforced per run keeps a
group's runs one at a time in its queue. :func:`replication_schedule` is the group's schedule,
from the one ``cron_schedule`` the group was built with (which also sets its freshness).
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.assets.snapshot_copy import copy_specs
from dpone_dagster.dagster.events.replication import ReplicationEvent
from dpone_dagster.dagster.metadata.freshness import freshness_check_spec, stream_freshness_policy
from dpone_dagster.dagster.metadata.keys.replication import ReplicationMetadataSet
from dpone_dagster.dagster.metadata.parts import CHECK_NAME
from dpone_dagster.dagster.metadata.replication import SLOT_CHECK_NAME
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator, coerce_tables
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.replication import ReplicationOptions
from dpone_dagster.replication.group_plan import ReplicationGroup


class ReplicationRunConfig(dg.Config):
    """The run config of a replication group's op (the Launchpad's ``config`` of the op)."""

    resync: bool = Field(
        default=False,
        description=(
            "Start the group over: drop its slot, create it again and copy the tables under "
            "its snapshot. The way back from a lost slot (replication_slot_lost)."
        ),
    )
    adopt: bool = Field(
        default=False,
        description=(
            "On the first run, or for a table that joins the group, take over targets another "
            "dpone asset filled (backfill_asset, incremental_asset) after checking them, "
            "instead of refusing them."
        ),
    )


def default_slot(keys: Sequence[dg.AssetKey]) -> str:
    """The slot of a group whose slot is not named: ``dpone_`` and a digest of its asset keys
    (a valid slot name: lower-case letters, digits and ``_``, at most 63 bytes).

    Examples:
        >>> default_slot([dg.AssetKey(["shop", "orders"])])
        'dpone_644f7b8cf5ac'
    """
    names = "\n".join(sorted(k.to_user_string() for k in keys))
    return f"dpone_{hashlib.sha256(names.encode()).hexdigest()[:12]}"


def _coerced(tables: Sequence[str | CopyTableSpec | Mapping[str, Any]]) -> list[CopyTableSpec]:
    """The group's tables, each replicated into the target table of its own name.

    Raises:
        DponeError: ``plan_invalid`` for a renamed target; the translator's codes for bad
            names.
    """
    coerced = coerce_tables(tables)
    renamed = [s.source for s in coerced if s.target_table != s.source_table]
    if renamed:
        raise DponeError(
            "plan_invalid",
            f"A replication group writes each table into the target table of its own name; "
            f"{', '.join(renamed)} name another target.",
            ["Drop target= from those tables, or copy them with another asset factory."],
        )
    return coerced


def _check_specs(
    specs: Sequence[dg.AssetSpec], slot: str, options: ReplicationOptions,
    policy: dg.FreshnessPolicy | None,
) -> list[dg.AssetCheckSpec]:  # fmt: skip
    """Every table's checks: ``dpone_slot_healthy``, ``dpone_fresh`` with a policy and
    ``dpone_reconciled`` with ``options.reconcile``."""
    healthy = [
        dg.AssetCheckSpec(
            SLOT_CHECK_NAME, asset=s.key,
            description=f"Slot {slot} is not lost or unreserved, and retains at most "
            f"{options.retained_wal_warn_bytes} bytes of WAL.",
        )
        for s in specs
    ]  # fmt: skip
    fresh = [] if policy is None else [freshness_check_spec(s.key) for s in specs]
    reconciled = [
        dg.AssetCheckSpec(
            CHECK_NAME, asset=s.key,
            description="Target equals source at the applied position: the run's keys, and a "
            "rolling slice of the table's key.",
        )
        for s in specs
        if options.reconcile
    ]  # fmt: skip
    return healthy + fresh + reconciled


def replication_assets(
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]],
    *,
    slot: str | None = None,
    publication: str | None = None,
    options: ReplicationOptions | None = None,
    deletes: Deletes | str | None = None,
    max_changes_per_run: int | None = None,
    translator: DponeTranslator | None = None,
    name: str | None = None,
    group_name: str | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    cron_schedule: str | None = None,
    freshness_policy: dg.FreshnessPolicy | None = None,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """One multi-asset that replicates ``tables`` through one logical slot and publication.

    Each materialization drains the slot up to the source's LSN at its start (within
    ``max_changes_per_run``), applies the changes in commit order to every table (a source
    transaction in one target transaction, the applied position in the ledger in the same
    transaction), advances the slot after the commit, and ends: schedule it (every minute), or
    run it from a sensor on the slot's lag. The first run creates the publication and the slot
    and copies the tables under the slot's snapshot.

    Args:
        tables: ``"schema.table"`` strings (or :class:`~dpone_dagster.CopyTableSpec`); the
            targets are named as the sources.
        slot: The logical replication slot (lower-case letters, digits and ``_``);
            :func:`default_slot` of the asset keys by default.
        publication: The publication; the slot's name by default.
        options: The group's options
            (:class:`~dpone_dagster.replication.ReplicationOptions`): ``deletes`` (``hard`` by
            default, or ``soft``), ``schema_changes``, ``max_changes_per_run`` (the per-run
            budget: a run stops at the first transaction boundary past it, the next run goes
            on), ``sequences``, ``failover`` (see docs/replication.md, Failover), ``reconcile``
            (each run's check: every key the run inserted, updated or deleted, exactly, and a
            rolling slice of the table's key within ``sweep``'s bound, against the source as of
            the applied position; a key a change committed after it is still in the slot, left
            to the next run and counted, ``dpone/changed_after_applied``; the cost follows the
            run; any other difference fails the check naming its keys and ranges; the check
            run alone, on whole tables, is
            :func:`~dpone_dagster.dagster.jobs.replication_check_job`), ``sweep`` and
            ``retained_wal_warn_bytes`` (``dpone_slot_healthy`` warns above this much WAL
            retained by the slot, 1 GiB by default).
        deletes: Shortcut for ``options.deletes``.
        max_changes_per_run: Shortcut for ``options.max_changes_per_run``.
        translator: Maps each table to its asset spec (key ``[schema, table]`` by default).
        name: The op's name (``replication_<slot>`` by default).
        group_name: The asset group of every table.
        pool: The op's Dagster concurrency pool; the slot's name by default, so that runs of
            the group wait for each other in Dagster's queue (shown there as queued) once the
            instance enforces pools per run (``concurrency: pools: granularity: run`` in its
            ``dagster.yaml``) and the pool has a limit of 1 (``dagster instance concurrency
            set <slot> 1``). Another pool (one capping the source's readers) leaves the
            group's runs to wait for the slot inside the run, logged.
        op_tags: Tags of the op.
        cron_schedule: The schedule the group runs on, written once:
            :func:`replication_schedule` builds the group's ``ScheduleDefinition`` from it, and
            every table's freshness policy is derived from it (warn when the data is 1.5
            intervals old, fail at 2) unless ``freshness_policy`` is given.
        freshness_policy: Every table's Dagster freshness policy. With either option each table
            also carries the ``dpone_fresh`` check, which judges the policy by the lag the run
            reports for it (``dpone/lag_seconds``), where Dagster judges it by materialization
            times.
        **legacy: The other options as keywords (``schema_changes``, ``reconcile``, ``sweep``,
            ``sequences``, ``failover``, ``retained_wal_warn_bytes``): deprecated
            (``options=ReplicationOptions(...)``), for one release.

    Returns:
        A multi-asset that is not subsettable (resource keys ``source``, ``target``,
        ``ledger``; run config :class:`ReplicationRunConfig`: ``resync``, ``adopt``), with a
        ``dpone_slot_healthy`` check on every table (and ``dpone_fresh`` with a policy, and
        ``dpone_reconciled`` with ``options.reconcile``).
        Selecting some of its tables alone fails when the job is built, naming the op.

    Raises:
        DponeError: at definition time, for a bad table name (``identifier_invalid``), two
            tables under one target or key (``plan_invalid``), a bad slot, publication or
            option (the engine's codes; ``replication_options_invalid`` for a bad
            ``cron_schedule``).

    Examples:
        .. code-block:: python

            shop = replication_assets(
                ["shop.orders", "shop.order_lines", "shop.customers"], slot="dpone_shop",
                cron_schedule="* * * * *",
            )
            defs = dg.Definitions(
                assets=[shop],
                schedules=[replication_schedule(shop)],
                jobs=[drop_replication_job(shop)],
                resources={"source": ..., "target": ..., "ledger": LedgerResource()},
            )
    """
    chosen = build_options(
        ReplicationOptions, options, caller="replication_assets", legacy=legacy,
        shortcuts={"deletes": deletes, "max_changes_per_run": max_changes_per_run},
    )  # fmt: skip
    tr = translator or DponeTranslator()
    coerced = _coerced(tables)
    slot_name = slot or default_slot([tr.get_asset_key(s) for s in coerced])
    group = ReplicationGroup(  # the engine's own checks of the names, at load
        tables=tuple(s.source_table for s in coerced), slot=slot_name,
        publication=publication or slot_name, options=chosen,
    )  # fmt: skip
    policy = stream_freshness_policy(
        cron_schedule, freshness_policy, refusal="replication_options_invalid"
    )
    check_instance_storage()
    names = ReplicationMetadataSet(
        slot=group.slot, publication=group.publication, cron_schedule=cron_schedule
    )
    specs = copy_specs(coerced, tr, dict(names))
    op_name = name or f"replication_{group.slot}"

    @dg.multi_asset(
        name=op_name,
        specs=[
            s.replace_attributes(
                description=f"{s.description} Replicated through slot {group.slot} with the "
                "other tables of the group, materialized together.",
                freshness_policy=policy,
            )
            for s in specs
        ],
        check_specs=_check_specs(specs, group.slot, chosen, policy),
        can_subset=False,  # one slot feeds every table: a subset would split transactions
        pool=group.slot if pool is None else pool,
        op_tags=op_tags,
        group_name=group_name,
    )
    def _replication(
        context: dg.AssetExecutionContext,
        config: ReplicationRunConfig,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: LedgerResource,
    ) -> Iterator[ReplicationEvent]:
        yield from source.replicate(
            context, target=target, ledger=ledger, options=chosen, resync=config.resync,
            adopt=config.adopt,
        )  # fmt: skip

    return _replication


def replication_schedule(
    replication: dg.AssetsDefinition,
    *,
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
    tags: Mapping[str, str] | None = None,
) -> dg.ScheduleDefinition:
    """The schedule of a replication group, on the ``cron_schedule`` the group was built with:
    the one place the cron is written, for both the schedule and the tables' freshness policy.

    A ``ScheduleDefinition`` (a schedule, not an automation condition: the group is one unit,
    materialized whole on its cadence whatever its source tables' assets do) that materializes
    every table of the group with its checks.

    Args:
        replication: The multi-asset :func:`replication_assets` built, with ``cron_schedule``.
        name: The schedule's name (``<op name>_schedule`` by default).
        default_status: Whether it runs as soon as it is loaded (``RUNNING``) or once turned on
            in the UI (``STOPPED``, Dagster's default).
        tags: Tags of the runs it launches.

    Returns:
        The schedule.

    Raises:
        DponeError: ``replication_options_invalid`` at definition time for a group built
            without ``cron_schedule``, or an asset that is not a replication group.

    Examples:
        .. code-block:: python

            shop = replication_assets(["shop.orders"], slot="dpone_shop",
                                      cron_schedule="*/5 * * * *")
            defs = dg.Definitions(assets=[shop], schedules=[replication_schedule(shop)], ...)
    """
    specs = replication.specs_by_key.values()
    crons = {ReplicationMetadataSet.read(s.metadata, "cron_schedule").cron_schedule for s in specs}
    op_name = replication.node_def.name
    if len(crons) != 1 or None in crons:
        raise DponeError(
            "replication_options_invalid",
            f"Asset {op_name} has no cron_schedule: a replication group's schedule is the one "
            "it was built with.",
            ["Build the group with replication_assets(..., cron_schedule=\"*/5 * * * *\"), "
             "which also derives its freshness policy."],
        )  # fmt: skip
    [cron] = crons
    return dg.ScheduleDefinition(
        name=name or f"{op_name}_schedule", cron_schedule=str(cron), target=replication,
        default_status=default_status, tags=tags,
        description=f"Materializes the replication group {op_name} (every table and its "
        "checks) on the schedule its freshness policy is derived from.",
    )  # fmt: skip
