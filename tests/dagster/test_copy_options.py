"""The copy jobs' options objects: a snapshot copy, a Kafka copy, a generic source's copy and a
replication group each take one frozen object, validated once with the codes their options
always had; the factories' and the resource methods' old keyword arguments still work for one
release, with a warning that names them, and build the same definition (the runs they make are
the guarantees' tests')."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import dagster as dg
import pytest
from pydantic import BaseModel, ValidationError

from dpone_dagster import (
    KafkaCopyOptions,
    KafkaSourceResource,
    LedgerResource,
    MySQLRead,
    MySQLSourceResource,
    PostgresSourceResource,
    PostgresTargetResource,
    ReplicationOptions,
    RestRead,
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
from dpone_dagster.sources import (
    MySQLSettings,
    MySQLSource,
    PageNumberPagination,
    RestSettings,
    RestSource,
    SourceError,
)

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


def _source_args(asset: dg.AssetsDefinition) -> dict[str, Any]:
    """What a generic source's asset hands its resource's ``copy_table`` (target table, read,
    options), read from the asset body's closure."""
    body = asset.op.compute_fn.decorated_fn  # type: ignore[union-attr]
    return dict(inspect.getclosurevars(body).nonlocals["source_args"])


class Item(BaseModel):
    id: int


def test_the_generic_source_factories_old_keywords_build_the_same_definition_and_warn() -> None:
    options = SourceCopyOptions(sink="merge", primary_key=["id"], schema_changes="freeze")
    my_read = MySQLRead(table="orders", database="shop", columns=["id"])
    rest_read = RestRead(
        path="/items", model=Item, records_path="data", pagination=PageNumberPagination(),
        params={"size": 10}, id_field="id", max_pages=5,
    )  # fmt: skip
    cases: list[tuple[Any, dict[str, Any], Any, dict[str, Any]]] = [
        (mysql_copy_asset, {"key": "orders", "target_table": "raw.orders"}, my_read,
         {"table": "orders", "database": "shop", "columns": ["id"]}),
        (mysql_copy_asset, {"key": "recent", "target_table": "raw.recent"},
         MySQLRead(query="SELECT 1 AS id"), {"query": "SELECT 1 AS id"}),
        (rest_copy_asset, {"key": "items", "target_table": "raw.items"}, rest_read,
         {"path": "/items", "model": Item, "records_path": "data",
          "pagination": PageNumberPagination(), "params": {"size": 10}, "id_field": "id",
          "max_pages": 5}),
    ]  # fmt: skip
    for factory, args, read, read_keywords in cases:
        new = factory(**args, read=read, options=options)
        assert _source_args(new)["read"] == read
        shortcuts = {"table", "path", "model"}
        old_names = sorted({*read_keywords} - shortcuts)
        with _deprecated(", ".join(old_names)) as caught:
            old = factory(**args, **read_keywords, options=options)
        assert "pass read=" in str(caught[0].message)
        assert _specs(old) == _specs(new)
        assert old.descriptions_by_key == new.descriptions_by_key
        assert _source_args(old) == _source_args(new)
        option_names = ["primary_key", "schema_changes"] + (["sink"] * (factory is rest_copy_asset))
        with _deprecated(", ".join(sorted(option_names))) as caught:
            old = factory(
                **args, read=read, sink="merge", primary_key=["id"], schema_changes="freeze"
            )
        assert "pass options=SourceCopyOptions(" in str(caught[0].message)
        assert _source_args(old) == _source_args(new)
        assert "(merge)" in str(new.descriptions_by_key[new.key])
        with pytest.raises(TypeError, match="unexpected keyword argument 'sinks'"):
            factory(**args, read=read, sinks="merge")
        with pytest.raises(DponeError, match="copy_options_invalid"):
            factory(**args, read=read, options=SourceCopyOptions.parse({"sink": "upsert"}))
        with pytest.raises(TypeError, match="takes a SourceCopyOptions"):
            factory(**args, read=read, options=KafkaCopyOptions())
        with pytest.raises(TypeError, match=r"\(read=\.\.\.\) takes a"):
            factory(**args, read=options)


def test_the_generic_source_factories_shortcuts_build_the_read_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shortcuts are not deprecated
        table = mysql_copy_asset(key="o", target_table="raw.o", table="orders", sink="merge")
        rest = rest_copy_asset(key="i", target_table="raw.i", path="/items", model=Item)
        override = rest_copy_asset(
            key="i", target_table="raw.i", read=RestRead(path="/old", model=Item), path="/items"
        )
    assert _source_args(table)["read"] == MySQLRead(table="orders")
    assert _source_args(table)["options"] == SourceCopyOptions(sink="merge")
    assert _source_args(rest)["read"] == RestRead(path="/items", model=Item)
    assert _source_args(override)["read"] == RestRead(path="/items", model=Item)
    with pytest.raises(DponeError, match="mysql_source_invalid"):  # table= and a query
        mysql_copy_asset(key="o", target_table="raw.o", read=MySQLRead(query="SELECT 1"), table="t")
    with pytest.raises(DponeError, match="rest_source_invalid"):  # a path and no model
        rest_copy_asset(key="i", target_table="raw.i", path="/items")


def test_the_generic_source_resources_old_keywords_warn_and_reach_the_events() -> None:
    context, target = dg.build_asset_context(), PostgresTargetResource(dsn=DSN)
    mysql = MySQLSourceResource(host="db.invalid", user="reader", database="shop")
    with _deprecated("primary_key, schema_changes"):
        events = mysql.copy_table(
            context, target=target, target_table="raw.orders", table="orders", sink="merge",
            primary_key=["id"], schema_changes="freeze",
        )  # fmt: skip
    assert events.options == SourceCopyOptions(
        sink="merge", primary_key=["id"], schema_changes="freeze"
    )
    assert events.target_table.qualified == "raw.orders"
    assert events.source.read == MySQLRead(table="orders")  # type: ignore[attr-defined]
    with _deprecated("columns, database"):
        events = mysql.copy_table(
            context, target=target, target_table="raw.orders", table="orders", database="db2",
            columns=["id"],
        )  # fmt: skip
    assert events.source.read == MySQLRead(table="orders", database="db2", columns=["id"])  # type: ignore[attr-defined]
    read = MySQLRead(query="SELECT 1 AS id")
    same = mysql.copy_table(context, target=target, target_table="raw.o", read=read)
    assert same.source.read is read  # type: ignore[attr-defined]
    given = SourceCopyOptions(primary_key=["id"])
    rest = RestSourceResource(base_url="http://api.invalid")
    rest_read = RestRead(path="/items", model=Item)
    same = rest.copy_table(
        context, target=target, target_table="raw.items", read=rest_read, options=given
    )
    assert same.options is given
    assert same.source.read is rest_read  # type: ignore[attr-defined]
    with _deprecated("sink"), _deprecated("max_pages, records_path"):
        old = rest.copy_table(
            context, target=target, target_table="raw.items", path="/items", model=Item,
            options=given, sink="append", records_path="data", max_pages=3,
        )  # fmt: skip
    assert old.options == SourceCopyOptions(sink="append", primary_key=["id"])
    assert old.source.read == RestRead(  # type: ignore[attr-defined]
        path="/items", model=Item, records_path="data", max_pages=3
    )
    with pytest.raises(DponeFailure, match="rest_source_invalid"):
        rest.copy_table(context, target=target, target_table="raw.i", read=rest_read, path="")
    with pytest.raises(DponeFailure, match="copy_options_invalid"):
        mysql.copy_table(context, target=target, target_table="raw.o", table="o", sink="upsert")


def test_the_read_objects_refuse_bad_values_with_their_source_codes() -> None:
    """What a generic source reads is validated once, with the codes the adapters always had
    (``mysql_source_invalid``) or the REST source's own (``rest_source_invalid``)."""

    class Odd(BaseModel):
        either: int | str

    refused_mysql: list[dict[str, Any]] = [
        {},  # neither table nor query
        {"table": "orders", "query": "SELECT 1"},  # both
        {"query": "SELECT 1", "columns": ["id"]},  # a query selects its own columns
        {"table": 5},  # not a name
        {"table": "orders", "limit": 10},  # no such field
    ]
    for values in refused_mysql:
        with pytest.raises(SourceError) as caught:
            MySQLRead.parse(values)
        assert caught.value.code == "mysql_source_invalid", values
    for values in ({"table": ""}, {"table": "t", "database": ""}, {"table": "t", "columns": [""]}):
        with pytest.raises(SourceError, match="identifier_invalid"):
            MySQLRead.parse(values)
    refused_rest: list[dict[str, Any]] = [
        {"path": "/items"},  # no model
        {"path": "", "model": Item},
        {"path": "/items", "model": Item, "id_field": " "},
        {"path": "/items", "model": Item, "max_pages": 0},
        {"path": "/items", "model": Item, "pagination": "page"},  # not a pagination
        {"path": "/items", "model": dict},  # not a pydantic model
        {"path": "/items", "model": Item, "page_size": 10},  # no such field
    ]
    for values in refused_rest:
        with pytest.raises(SourceError) as caught:
            RestRead.parse(values)
        assert caught.value.code == "rest_source_invalid", values
    with pytest.raises(SourceError, match="rest_type_unmappable"):
        RestRead(path="/odd", model=Odd)
    read = MySQLRead(table="orders")
    with pytest.raises(ValidationError):  # frozen
        read.table = "other"  # type: ignore[misc]
    assert read.replace(columns=["id"]) == MySQLRead(table="orders", columns=("id",))
    assert MySQLRead(query=" SELECT 1 ;").query == "SELECT 1"


def test_the_adapters_take_the_read_whole_and_their_old_keywords_for_one_release() -> None:
    settings = MySQLSettings(database="shop")
    read = MySQLRead(table="orders", columns=["id"])
    assert MySQLSource(settings, read).read is read
    with _deprecated("columns, table") as caught:
        old = MySQLSource(settings, table="orders", columns=["id"])
    assert "pass read=MySQLRead(" in str(caught[0].message)
    assert old.read == read and old.label == MySQLSource(settings, read).label
    with pytest.raises(SourceError, match="mysql_source_invalid"), _deprecated("query, table"):
        MySQLSource(settings, table="orders", query="SELECT 1")
    api = RestSettings("https://api.example.com/v1")
    rest_read = RestRead(path="/items", model=Item, max_pages=2)
    assert RestSource(api, rest_read).read is rest_read
    with _deprecated("max_pages, model, path"):
        positional = RestSource(api, "/items", Item, max_pages=2)
    assert positional.read == rest_read
    with _deprecated("model, path"):
        keywords = RestSource(api, path="/items", model=Item)
    assert keywords.read == RestRead(path="/items", model=Item)
    with pytest.raises(TypeError, match="unexpected keyword argument 'pages'"):
        RestSource(api, rest_read, pages=2)
