"""``BackfillOptions`` through the Dagster layer: the factory's shortcuts and its old keyword
arguments, the resource method's, and the component's YAML all build the same object."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from dpone_dagster import BackfillOptions, backfill_asset, cursor_range_partitions
from dpone_dagster.dagster.components.postgres_copy.models import BackfillModel
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, DponeFailure
from dpone_dagster.dagster.resources import PostgresSourceResource, PostgresTargetResource
from dpone_dagster.lifecycle import DponeError

PARTS = cursor_range_partitions(0, 3000, 1000)
DSN = "postgresql://nobody@127.0.0.1:1/never_dialled"


def definition(asset: dg.AssetsDefinition) -> dict[str, Any]:
    """What a definition shows Dagster: its specs, checks, op, tags, partitions and policy."""
    return {
        "specs": [(s.key, dict(s.metadata), s.partitions_def) for s in asset.specs],
        "checks": sorted(str(key) for key in asset.check_keys),
        "op": (asset.op.name, dict(asset.op.tags), asset.op.pool),
        "policy": asset.backfill_policy,
    }


def test_the_factorys_shortcuts_build_the_object_they_override() -> None:
    given = BackfillOptions(batch_size=300, on_changed="fail", reconcile=False)
    asset = backfill_asset(
        "public.mixed", cursor="id", partitions_def=PARTS, options=given, on_changed="repair"
    )
    shown = definition(asset)
    assert shown["checks"] == []  # reconcile=False: no dpone_reconciled check
    [(_, metadata, _)] = shown["specs"]
    assert metadata["dpone/on_changed"] == "repair"


def test_the_factorys_old_keyword_arguments_build_the_same_definition_and_warn() -> None:
    new = backfill_asset(
        "public.mixed", cursor="id", partitions_def=PARTS, batch_size=300,
        options=BackfillOptions(reconcile=False, settle_timeout=5),
    )  # fmt: skip
    with pytest.warns(
        DeprecationWarning, match=r"backfill_asset\(\.\.\., reconcile, settle_timeout=\.\.\.\)"
    ):
        old = backfill_asset(
            "public.mixed", cursor="id", partitions_def=PARTS, batch_size=300,
            reconcile=False, settle_timeout=5,
        )  # fmt: skip
    assert definition(old) == definition(new)
    assert definition(old)["checks"] == []
    with pytest.raises(TypeError, match="unexpected keyword argument 'reconciled'"):
        backfill_asset("public.mixed", cursor="id", partitions_def=PARTS, reconciled=False)


def test_the_resource_methods_old_keyword_arguments_build_the_same_options_and_warn() -> None:
    source, target = PostgresSourceResource(dsn=DSN), PostgresTargetResource(dsn=DSN)
    context = dg.build_asset_context()
    options = BackfillOptions(batch_size=500, on_changed="repair")
    assert source.backfill(context, target=target, options=options).options == options
    assert source.backfill(context, target=target).options == BackfillOptions()
    name = r"PostgresSourceResource\.backfill\(\.\.\., batch_size, on_changed=\.\.\.\)"
    with pytest.warns(DeprecationWarning, match=name):
        old = source.backfill(context, target=target, batch_size=500, on_changed="repair")
    assert old.options == options
    with pytest.raises(DponeFailure) as err, pytest.warns(DeprecationWarning, match="on_changed"):
        source.backfill(context, target=target, on_changed="merge")
    assert err.value.metadata[ERROR_CODE_KEY].value == "plan_invalid"
    with pytest.raises(TypeError, match="unexpected keyword argument 'batches'"):
        source.backfill(context, target=target, batches=500)


def test_a_backfills_yaml_keys_resolve_into_the_same_options() -> None:
    entry = """
table: public.mixed
cursor: id
range_partitions: {start: 0, stop: 3000, step: 1000}
batch_size: 500
on_changed: repair
"""
    model = BackfillModel.resolve_from_yaml(entry)
    assert model.options() == BackfillOptions(batch_size=500, on_changed="repair")
    defaults = BackfillModel.resolve_from_yaml("table: public.mixed\ncursor: id\n")
    assert defaults.options() == BackfillOptions()
    zero = BackfillModel.resolve_from_yaml(entry.replace("batch_size: 500", "batch_size: 0"))
    with pytest.raises(DponeError) as err:
        zero.options()
    assert err.value.code == "plan_invalid"
