"""The copy jobs' options objects: a snapshot copy, a Kafka copy, a generic source's copy and a
replication group each take one frozen object, validated once with the codes their options
always had; the factories' and the resource methods' old keyword arguments still work for one
release, with a warning that names them, and build the same definition (the runs they make are
the guarantees' tests')."""

from __future__ import annotations

import warnings
from typing import Any

import dagster as dg
import pytest
from pydantic import BaseModel, ValidationError

from dpone_dagster import (
    KafkaCopyOptions,
    KafkaSourceResource,
    LedgerResource,
    MySQLSourceResource,
    PostgresSourceResource,
    PostgresTargetResource,
    ReplicationOptions,
    RestSourceResource,
    SnapshotCopyOptions,
    SourceCopyOptions,
    build_extraction_job,
    kafka_copy_asset,
    mysql_copy_asset,
    replication_assets,
    rest_copy_asset,
    snapshot_copy_assets,
)
from dpone_dagster.core.sweep import Sweep
from dpone_dagster.dagster.components.postgres_copy.models import SnapshotCopyModel
from dpone_dagster.dagster.failures import DponeFailure
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.snapshot_copy import Strategy, copy_tables

DSN = "postgresql://reader@db.invalid:5432/shop"
"""A DSN nothing is asked of: these tests build definitions and event iterators, never run them."""


class Click(BaseModel):
    user_id: int
    page: str


@pytest.mark.parametrize(
    ("options", "code"),
    [
        (SnapshotCopyOptions, {"strategy": "fastest"}),
        (SnapshotCopyOptions, {"sink": "upsert"}),
        (SnapshotCopyOptions, {"workers": 0}),
        (SnapshotCopyOptions, {"batch_size": 0}),
        (SnapshotCopyOptions, {"schema_changes": "thaw"}),
        (SnapshotCopyOptions, {"colour": "red"}),
        (KafkaCopyOptions, {"sink": "replace"}),
        (KafkaCopyOptions, {"value_format": "avro"}),
        (KafkaCopyOptions, {"model": Click, "value_format": "bytes"}),
        (KafkaCopyOptions, {"max_messages_per_run": 0}),
        (KafkaCopyOptions, {"on_lost_offsets": "skip"}),
        (SourceCopyOptions, {"sink": "upsert"}),
        (SourceCopyOptions, {"schema_changes": "thaw"}),
        (SourceCopyOptions, {"primary_key": "id"}),
        (SourceCopyOptions, {"primary_key": ["id", "id"]}),
        (SourceCopyOptions, {"primary_key": [""]}),
        (SourceCopyOptions, {"columns": ["id"]}),
        (ReplicationOptions, {"deletes": "ignore"}),
        (ReplicationOptions, {"max_changes_per_run": 0}),
        (ReplicationOptions, {"sequences": "no"}),
        (ReplicationOptions, {"failover": "maybe"}),
        (ReplicationOptions, {"sweep": "daily"}),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_a_bad_option_is_its_jobs_code_naming_it(options: Any, code: dict[str, Any]) -> None:
    with pytest.raises(DponeError) as caught:
        options.parse(code)
    assert caught.value.code == options.refusal
    assert next(iter(code)) in str(caught.value)


def test_the_options_keep_the_codes_of_their_own_rules() -> None:
    """A threshold of the slot check stays ``plan_invalid``, a bad soft-delete column
    ``identifier_invalid``, as before the options were one object."""
    with pytest.raises(DponeError) as threshold:
        ReplicationOptions.parse({"retained_wal_warn_bytes": 0})
    assert threshold.value.code == "plan_invalid"
    with pytest.raises(DponeError) as column:
        ReplicationOptions.parse({"soft_delete_column": ""})
    assert column.value.code == "identifier_invalid"


def test_options_are_parsed_once_into_typed_values_and_frozen() -> None:
    copy = SnapshotCopyOptions(strategy="whole_copy", sink="merge", batch_size=None)
    assert (copy.strategy, copy.sink, copy.batch_size) == ("whole_copy", "merge", 250_000)
    assert copy.replace(workers=2) == SnapshotCopyOptions(
        strategy="whole_copy", sink="merge", workers=2
    )
    kafka = KafkaCopyOptions(sink="merge", dead_letter_table='raw."Dead Letters"')
    assert kafka.keyed and kafka.dead_letter_table is not None
    assert kafka.dead_letter_table.name == "Dead Letters"
    load = SourceCopyOptions(sink="merge", primary_key=["id", "region"], schema_changes="freeze")
    assert (load.sink, load.primary_key, load.schema_changes) == (
        "merge",
        ("id", "region"),
        "freeze",
    )
    group = ReplicationOptions(deletes="soft", sweep=Sweep(rows=10))
    assert (group.deletes, group.sweep.rows, group.reconcile) == ("soft", 10, True)
    with pytest.raises(ValidationError, match="frozen"):
        group.reconcile = False  # type: ignore[misc]


def test_the_components_snapshot_copy_resolves_into_the_same_object() -> None:
    model = SnapshotCopyModel(
        tables=["shop.orders"], strategy=Strategy.WHOLE_COPY, workers=2, batch_size=10_000
    )
    assert model.options() == SnapshotCopyOptions(
        strategy="whole_copy", workers=2, batch_size=10_000
    )
    assert SnapshotCopyModel(tables=["shop.orders"]).options() == SnapshotCopyOptions()
    with pytest.raises(DponeError, match="copy_options_invalid"):
        SnapshotCopyModel(tables=["shop.orders"], workers=0).options()


def _specs(asset: dg.AssetsDefinition) -> tuple[Any, ...]:
    """What a definition declares: its op, its specs (keys, metadata, deps) and check specs."""
    specs = sorted(
        (s.key.to_user_string(), repr(sorted(s.metadata.items())), repr(s.deps))
        for s in asset.specs
    )
    checks = sorted(
        (c.name, c.asset_key.to_user_string(), c.description or "") for c in asset.check_specs
    )
    return asset.node_def.name, specs, checks


def _deprecated(names: str) -> Any:
    return pytest.warns(DeprecationWarning, match=rf"\(\.\.\., {names}=\.\.\.\) is deprecated")


def test_snapshot_copy_assets_old_keywords_build_the_same_definition_and_warn() -> None:
    options = SnapshotCopyOptions(strategy="partitioned_copy", workers=2, batch_size=1_000)
    new = snapshot_copy_assets(["shop.orders"], options=options, name="shop")
    with _deprecated("batch_size, workers"):
        old = snapshot_copy_assets(
            ["shop.orders"], strategy="partitioned_copy", workers=2, batch_size=1_000, name="shop"
        )
    assert _specs(old) == _specs(new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shortcuts are not deprecated
        shortcut = snapshot_copy_assets(["shop.orders"], strategy="partitioned_copy", name="shop")
    assert _specs(shortcut) == _specs(new)
    with _deprecated("workers"), pytest.raises(DponeError, match="copy_options_invalid"):
        snapshot_copy_assets(["shop.orders"], workers=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'strategies'"):
        snapshot_copy_assets(["shop.orders"], strategies="whole_copy")
    with _deprecated("schema_changes, workers"):
        job = build_extraction_job("shop.orders", workers=2, schema_changes="freeze")
    assert job.name == build_extraction_job("shop.orders", options=options).name


def test_copy_tables_old_keywords_warn_and_reach_the_events() -> None:
    source, target = PostgresSourceResource(dsn=DSN), PostgresTargetResource(dsn=DSN)
    context = dg.build_asset_context()
    with _deprecated("batch_size, schema_changes"):
        events = source.copy_tables(
            context, target=target, sink="merge", batch_size=500, schema_changes="freeze"
        )
    assert events.options == SnapshotCopyOptions(
        sink="merge", batch_size=500, schema_changes="freeze"
    )
    given = SnapshotCopyOptions(strategy="whole_copy")
    assert source.copy_tables(context, target=target, options=given).options is given
    with pytest.raises(DponeFailure, match="copy_options_invalid"):
        source.copy_tables(context, target=target, strategy="fastest")
    with _deprecated("workers"), pytest.raises(DponeError, match="copy_options_invalid"):
        copy_tables(DSN, DSN, ["shop.orders"], workers=0)  # refused before any session opens


def test_kafka_copy_asset_old_keywords_build_the_same_definition_and_warn() -> None:
    options = KafkaCopyOptions(
        value_format="bytes", sink="merge", max_messages_per_run=100,
        dead_letter_table="raw.dead", on_lost_offsets="earliest", consumer_group="g",
    )  # fmt: skip
    new = kafka_copy_asset(key="k", topic="t", target_table="raw.k", options=options)
    with _deprecated(
        "consumer_group, dead_letter_table, max_messages_per_run, on_lost_offsets, value_format"
    ):
        old = kafka_copy_asset(
            key="k", topic="t", target_table="raw.k", value_format="bytes", sink="merge",
            max_messages_per_run=100, dead_letter_table="raw.dead", on_lost_offsets="earliest",
            consumer_group="g",
        )  # fmt: skip
    assert _specs(old) == _specs(new)
    assert new.specs_by_key[dg.AssetKey("k")].metadata["dpone/dead_letter_table"] == "raw.dead"
    kafka = KafkaSourceResource(bootstrap_servers="broker.invalid:9092")
    context, target = dg.build_asset_context(), PostgresTargetResource(dsn=DSN)
    with _deprecated("max_messages_per_run"):
        events = kafka.copy_topic(
            context, target=target, ledger=LedgerResource(), topic="t", target_table="raw.k",
            model=Click, max_messages_per_run=5,
        )  # fmt: skip
    assert events.source.options == KafkaCopyOptions(model=Click, max_messages_per_run=5)
    assert events.source.consumer_group == "dpone-raw.k"


def test_replication_assets_old_keywords_build_the_same_definition_and_warn() -> None:
    options = ReplicationOptions(
        deletes="soft", schema_changes="freeze", retained_wal_warn_bytes=4096, reconcile=False,
        sweep=Sweep(rows=10), sequences=False, failover=False,
    )  # fmt: skip
    new = replication_assets(["shop.orders"], slot="dpone_opts", options=options)
    names = "failover, reconcile, retained_wal_warn_bytes, schema_changes, sequences, sweep"
    with _deprecated(names):
        old = replication_assets(
            ["shop.orders"], slot="dpone_opts", deletes="soft", schema_changes="freeze",
            retained_wal_warn_bytes=4096, reconcile=False, sweep=Sweep(rows=10), sequences=False,
            failover=False,
        )  # fmt: skip
    assert _specs(old) == _specs(new)
    checks = {c.name: c.description for c in new.check_specs}
    assert set(checks) == {"dpone_slot_healthy"} and "4096 bytes" in str(
        checks["dpone_slot_healthy"]
    )
    source, target = PostgresSourceResource(dsn=DSN), PostgresTargetResource(dsn=DSN)
    with _deprecated("sequences"):
        events = source.replicate(
            dg.build_asset_context(), target=target, deletes="soft", sequences=False, resync=True
        )
    assert events.options == ReplicationOptions(deletes="soft", sequences=False)
    assert events.resync and not events.adopt
    with pytest.raises(DponeFailure, match="replication_options_invalid"):
        source.replicate(dg.build_asset_context(), target=target, deletes="ignore")


def test_the_generic_source_factories_old_keywords_build_the_same_definition_and_warn() -> None:
    class Item(BaseModel):
        id: int

    options = SourceCopyOptions(sink="merge", primary_key=["id"], schema_changes="freeze")
    read = {"key": "orders", "table": "orders", "target_table": "raw.orders"}
    rest = {"key": "items", "target_table": "raw.items", "path": "/items", "model": Item}
    for factory, args in ((mysql_copy_asset, read), (rest_copy_asset, rest)):
        new = factory(**args, options=options)
        with _deprecated("schema_changes"):
            old = factory(**args, sink="merge", primary_key=["id"], schema_changes="freeze")
        assert _specs(old) == _specs(new)
        assert old.descriptions_by_key == new.descriptions_by_key
        assert "(merge)" in str(new.descriptions_by_key[new.key])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the shortcuts are not deprecated
            shortcut = factory(**args, sink="merge", primary_key=["id"])
        assert _specs(shortcut) == _specs(new)
        with pytest.raises(TypeError, match="unexpected keyword argument 'sinks'"):
            factory(**args, sinks="merge")
        with pytest.raises(DponeError, match="copy_options_invalid"):
            factory(**args, primary_key=["id", "id"])  # refused when the definitions load
        with pytest.raises(TypeError, match="takes a SourceCopyOptions"):
            factory(**args, options=KafkaCopyOptions())


def test_the_generic_source_resources_old_keywords_warn_and_reach_the_events() -> None:
    class Item(BaseModel):
        id: int

    context, target = dg.build_asset_context(), PostgresTargetResource(dsn=DSN)
    mysql = MySQLSourceResource(host="db.invalid", user="reader", database="shop")
    with _deprecated("schema_changes"):
        events = mysql.copy_table(
            context, target=target, target_table="raw.orders", table="orders", sink="merge",
            schema_changes="freeze",
        )  # fmt: skip
    assert events.options == SourceCopyOptions(sink="merge", schema_changes="freeze")
    assert events.target_table.qualified == "raw.orders"
    given = SourceCopyOptions(primary_key=["id"])
    rest = RestSourceResource(base_url="http://api.invalid")
    same = rest.copy_table(
        context, target=target, target_table="raw.items", path="/items", model=Item, options=given
    )
    assert same.options is given
    shortcut = rest.copy_table(
        context, target=target, target_table="raw.items", path="/items", model=Item,
        options=given, sink="append",
    )  # fmt: skip
    assert shortcut.options == SourceCopyOptions(sink="append", primary_key=["id"])
    with pytest.raises(DponeFailure, match="copy_options_invalid"):
        mysql.copy_table(context, target=target, target_table="raw.o", table="o", sink="upsert")
