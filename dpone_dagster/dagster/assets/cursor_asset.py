"""What ``backfill_asset`` and ``incremental_asset`` share: the cursor engine's asset shape.

Both are one table copied by the cursor engine under a policy. When the definitions load, the
table and the cursor are checked and the spec is built by the translator (:func:`cursor_spec`);
the factory adds what its policy declares (partitions; a freshness policy) and the
``dpone_reconciled`` check when its options reconcile (:func:`reconciled_check`); the op
(:func:`cursor_asset`) reads the three resources and its body is the source resource's method
for the policy, which takes the options object whole (``source.backfill``,
``source.incremental``).
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dagster as dg

from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.parts import CHECK_NAME
from dpone_dagster.dagster.metadata.tags import DponeRunTags
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator
from dpone_dagster.postgres import check_identifier

CursorEvent = dg.AssetCheckResult | dg.MaterializeResult[Any]
"""What a cursor job's op yields."""
CursorJob = Callable[
    [PostgresSourceResource, dg.AssetExecutionContext, PostgresTargetResource, LedgerResource],
    Iterator[CursorEvent],
]
"""A cursor job's body: the source resource's method for the policy, called with the step's
context and the target and ledger resources."""


def cursor_spec(
    table: str, cursor: str, target_table: str | None, translator: DponeTranslator | None
) -> tuple[CopyTableSpec, dg.AssetSpec]:
    """The table's spec, once the names and the instance's storage are checked; its metadata
    names the cursor.

    Raises:
        DponeError: ``identifier_invalid`` for a bad table or cursor name.
    """
    spec_in = CopyTableSpec(source=table, target=target_table)
    check_identifier(cursor, what="cursor column")
    check_instance_storage()
    spec = (translator or DponeTranslator()).get_asset_spec(spec_in)
    return spec_in, spec.replace_attributes(
        metadata={**spec.metadata, **CommonMetadataSet(cursor=cursor)}
    )


def reconciled_check(key: dg.AssetKey, description: str) -> dg.AssetCheckSpec:
    """The ``dpone_reconciled`` check of ``key``, as the policy describes it."""
    return dg.AssetCheckSpec(CHECK_NAME, asset=key, description=description)


def cursor_asset(
    job: str,
    spec_in: CopyTableSpec,
    spec: dg.AssetSpec,
    run: CursorJob,
    *,
    check_specs: list[dg.AssetCheckSpec],
    name: str | None,
    group_name: str | None,
    pool: str | None,
    op_tags: Mapping[str, Any] | None,
    **decorator: Any,
) -> dg.AssetsDefinition:
    """The asset whose op runs ``run`` (resource keys ``source``, ``target``, ``ledger``).

    Args:
        job: The op name's prefix (``backfill``, ``incremental``).
        spec_in: The copied tables.
        spec: The asset's spec, with what the policy declares.
        run: The op's body.
        check_specs: The checks the asset declares.
        name: The op's name (``<job>_<key>`` by default).
        group_name: The asset group.
        pool: Dagster concurrency pool limiting runs that read the source.
        op_tags: Tags of the op (the source table's run tag is added).
        **decorator: The policy's other ``multi_asset`` arguments (partitions, backfill
            policy).
    """

    # The check alone may run: it verifies the target without running the job.
    @dg.multi_asset(
        name=name or f"{job}_{spec.key.to_python_identifier()}",
        specs=[spec],
        check_specs=check_specs,
        can_subset=True,
        pool=pool,
        op_tags={**(op_tags or {}), **DponeRunTags(source_table=spec_in.source_table.qualified)},
        group_name=group_name,
        **decorator,
    )
    def _cursor_job(
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: LedgerResource,
    ) -> Iterator[CursorEvent]:
        yield from run(source, context, target, ledger)

    return _cursor_job
