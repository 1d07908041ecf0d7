"""Every ``dpone/`` key is declared once, in ``DponeMetadataSet`` or ``DponeRunTags``: no module
spells one, every key a real run of each asset kind writes is a declared field whose declared
type its value has, every declared field is written by one of those runs, and the docs'
reference is generated from the sets."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import BaseModel

from dpone_dagster import (
    CopyTableSpec,
    KafkaCopyOptions,
    KafkaSourceResource,
    backfill_asset,
    build_extraction_job,
    drop_replication_job,
    incremental_asset,
    kafka_copy_asset,
    mysql_copy_asset,
    replication_assets,
    rest_copy_asset,
    snapshot_copy_assets,
)
from dpone_dagster.dagster.assets import backfill_freshness_check
from dpone_dagster.dagster.metadata.sets import (
    DponeMetadataSet,
    DponeRunTags,
    markdown_reference,
)
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.dagster.resources import (
    LedgerResource,
    MySQLSourceResource,
    PostgresSourceResource,
    PostgresTargetResource,
    RestSourceResource,
)
from dpone_dagster.embedded_kafka import KafkaBroker
from dpone_dagster.sources import MySQLSettings
from tests.helpers import kafka, mysql, pg
from tests.helpers.http_api import ApiServer, Reply, Request
from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
    logical_server,
    logical_source_dsn,
    make_logical_database,
)
from tests.incremental.conftest import ORDERS, insert_orders

ROOT = Path(__file__).resolve().parents[2]
SETS = ROOT / "dpone_dagster" / "dagster" / "metadata" / "sets.py"
KEY = re.compile(r"^dpone/[a-z_]+$")

METADATA_KEYS = {f"dpone/{name}" for name in DponeMetadataSet.model_fields}
TAG_KEYS = {f"dpone/{name}" for name in DponeRunTags.model_fields}

ONLY_WHEN = {
    "dpone/old_mark": "a stream's run after its first (the first has no mark to start from, and "
    "an empty value is left out: tests/dagster/test_readable.py)",
    "dpone/description": "the source table has a COMMENT ON TABLE (tests/dagster/test_readable.py)",
    "dpone/notices": "a transaction open at the stream's mark did not settle",
    "dpone/virtual_as_stored": "a PostgreSQL 18 VIRTUAL column went into an older target "
    "(tests/postgres/test_generated_columns.py)",
    "dpone/group_commit_error": "publishing a Kafka run's offsets to the consumer group failed "
    "after the target's commit (monitoring only)",
    "dpone/safe_wal_size": "the source's max_slot_wal_keep_size is set (unlimited on the test "
    "servers; tests/dagster/test_replication_assets.py sets it)",
    "dpone/sweep_started_at": "a stream's sweep is in progress after its check (a small table's "
    "check completes its sweep in one run; tests/incremental/test_stream_check.py)",
    "dpone/differing_ranges": "a stream's check found rows that differ (tests/dagster/"
    "test_incremental_asset.py::test_a_check_names_the_ranges_and_keys_that_differ_and_repair_"
    "rewrites_only_them)",
    "dpone/repaired_keys": "a stream with repair=True rewrote keys its check found different "
    "(the same test)",
    "dpone/repaired_rows": "the same",
    "dpone/repaired_ranges": "the same",
    "dpone/slot_held_by": "an open transaction on the source holds the slot's WAL back (tests/"
    "dagster/test_replication_platform.py::test_an_open_transaction_holding_the_slot_is_named_"
    "by_the_run_and_its_check)",
    "dpone/cron_schedule": "a replication group is built with cron_schedule= (tests/dagster/"
    "test_replication_platform.py::test_one_cron_string_drives_the_schedule_and_the_freshness)",
    "dpone/standby_holds_slot": "the source resource names its standby (standby_dsn: tests/"
    "dagster/test_replication_failover.py::test_the_slot_check_says_whether_the_standby_holds_"
    "the_slot)",
    "dpone/standby_slot_lag_bytes": "the same, once the standby holds a copy of the slot",
}
"""Declared keys that the runs below do not write, and when they are written."""


def test_no_module_spells_a_dpone_key() -> None:
    """A key spelled as a literal (or an f-string starting with ``dpone/``) outside the sets
    would bypass them: every key is built through a set's field."""
    spelled = []
    for path in sorted((ROOT / "dpone_dagster").rglob("*.py")):
        if path == SETS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                first = node.values[0] if node.values else None
                text = first.value if isinstance(first, ast.Constant) else ""
                if isinstance(text, str) and text.startswith("dpone/"):
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} f{text!r}...")
            elif isinstance(node, ast.Constant) and KEY.match(str(node.value)):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not spelled, spelled


def test_the_docs_metadata_reference_is_the_sets() -> None:
    """The docs' key table (docs/metadata.md) is generated from the sets' docstrings
    (``docs/metadata_reference.py`` rewrites it)."""
    assert markdown_reference() in (ROOT / "docs" / "metadata.md").read_text()


class Seen:
    """The ``dpone/`` keys of the events, specs and tags checked so far."""

    def __init__(self) -> None:
        self.metadata: set[str] = set()
        self.tags: set[str] = set()
        self.kinds: set[str] = set()

    def metadata_of(self, kind: str, metadata: Mapping[str, Any]) -> None:
        """Each ``dpone/`` key is a declared field, and its value has the declared type (the
        set is strict: ``extract`` fails on a value of another type)."""
        keys = {k for k in metadata if k.startswith("dpone/")}
        assert keys <= METADATA_KEYS, (kind, keys - METADATA_KEYS)
        extracted = DponeMetadataSet.extract(metadata)
        assert set(extracted.keys()) == keys, kind
        self.metadata |= keys
        self.kinds.add(kind)

    def tags_of(self, kind: str, tags: Mapping[str, str]) -> None:
        """Each ``dpone/`` tag is a declared run tag."""
        keys = {k for k in tags if k.startswith("dpone/")}
        assert keys <= TAG_KEYS, (kind, keys - TAG_KEYS)
        self.tags |= keys
        self.kinds.add(kind)

    def run(
        self,
        result: dg.ExecuteInProcessResult,
        instance: dg.DagsterInstance,
        assets: list[dg.AssetsDefinition],
    ) -> None:
        """Every event of the run, its ops' and its own tags, and its assets' specs."""
        for event in result.all_events:
            data: Any = event.event_specific_data
            if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
                self.metadata_of("materialization", data.materialization.metadata)
            elif event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
                self.metadata_of("observation", data.asset_observation.metadata)
            elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                self.metadata_of("check", data.metadata)
            elif event.is_step_failure and data.user_failure_data is not None:
                self.metadata_of("failure", data.user_failure_data.metadata)
        run = instance.get_run_by_id(result.run_id)
        assert run is not None
        self.tags_of("run tags", run.tags)
        for node in result.job_def.nodes:
            self.tags_of("op tags", node.definition.tags)
        for spec in (spec for a in assets for spec in a.specs):
            self.metadata_of("spec", spec.metadata)


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test(temp_dir=str(tmp_path)) as test_instance:
        yield test_instance


@pytest.fixture
def mariadb() -> Iterator[MySQLSettings]:
    problem = mysql.server_problem()
    if problem is not None:
        pytest.exit(problem, returncode=3)
    settings = mysql.create_database()
    yield settings
    mysql.drop_database(settings)


def postgres_resources(source_dsn: str, target_dsn: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }


def materialize(
    seen: Seen, instance: dg.DagsterInstance, assets: list[dg.AssetsDefinition],
    resources: dict[str, Any], **kwargs: Any,
) -> dg.ExecuteInProcessResult:  # fmt: skip
    result = dg.materialize(
        assets, resources=resources, instance=instance, raise_on_error=False, **kwargs
    )
    seen.run(result, instance, assets)
    return result


MOODS = """
CREATE EXTENSION hstore;
CREATE TYPE shop.mood AS ENUM ('ok');
CREATE TABLE shop.moods (id int PRIMARY KEY, m shop.mood, h hstore);
INSERT INTO shop.moods VALUES (1, 'ok', 'a=>1');
"""


def snapshot_copies(
    seen: Seen, instance: dg.DagsterInstance, source_dsn: str, target_dsn: str
) -> None:
    """A snapshot copy and its check (a table whose enum and extension the target gets), again
    after a column and an enum label were added (schema changes), the extraction job, and a copy
    that fails."""
    pg.create_mixed_table(source_dsn, "shop", "customers", rows=50)
    pg.execute(source_dsn, MOODS)
    resources = postgres_resources(source_dsn, target_dsn)
    resources["target"] = PostgresTargetResource(dsn=target_dsn, create_extensions=["hstore"])
    copy = snapshot_copy_assets(["shop.customers", "shop.moods"])
    assert materialize(seen, instance, [copy], resources).success
    pg.execute(source_dsn, "ALTER TABLE shop.customers ADD note text DEFAULT 'new'")
    pg.execute(source_dsn, "ALTER TYPE shop.mood ADD VALUE 'meh'")
    assert materialize(seen, instance, [copy], resources).success
    job = build_extraction_job(CopyTableSpec(source="shop.customers", target="shop.customers_job"))
    defs = dg.Definitions(jobs=[job], resources=resources)
    result = defs.resolve_job_def(job.name).execute_in_process(instance=instance)
    assert result.success
    seen.run(result, instance, [])
    missing = snapshot_copy_assets(["shop.missing"])
    assert not materialize(seen, instance, [missing], resources).success


def backfill(seen: Seen, instance: dg.DagsterInstance, source_dsn: str, target_dsn: str) -> None:
    """A backfill partition in two batches (observations, run tags), reconciled, with its
    check, and the check of its partitions' freshness."""
    pg.create_mixed_table(source_dsn, "events", "views", rows=400)
    asset = backfill_asset(
        "events.views", cursor="id", partitions_def=cursor_range_partitions(0, 400, 400),
        batch_size=200,
    )  # fmt: skip
    resources = postgres_resources(source_dsn, target_dsn)
    assert materialize(seen, instance, [asset], resources, partition_key="0..400").success
    stale = backfill_freshness_check(asset, max_age=timedelta(days=1))
    selection = dg.AssetSelection.checks(stale)
    assert materialize(seen, instance, [asset, stale], resources, selection=selection).success


def incremental(seen: Seen, instance: dg.DagsterInstance, source_dsn: str, target_dsn: str) -> None:
    """An incremental run in two batches (observations) with its checks (reconciled, fresh)."""
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 300)
    asset = incremental_asset(
        "shop.orders", cursor="updated_at", deletes="hard", batch_size=200,
        cron_schedule="*/5 * * * *",
    )  # fmt: skip
    assert materialize(seen, instance, [asset], postgres_resources(source_dsn, target_dsn)).success


class Item(BaseModel):
    id: int
    name: str


def generic(
    seen: Seen, instance: dg.DagsterInstance, settings: MySQLSettings, target_dsn: str
) -> None:
    """A MySQL copy and a REST copy."""
    mysql.execute(
        settings,
        "CREATE TABLE orders (id int PRIMARY KEY, total decimal(10,2) NOT NULL)",
        "INSERT INTO orders VALUES (1, 9.99), (2, 20.00)",
    )
    orders = mysql_copy_asset(key=["my", "orders"], table="orders", target_table="raw.orders")
    items = rest_copy_asset(key="items", target_table="raw.items", path="/items", model=Item)
    mysql_source = MySQLSourceResource(
        host=settings.host, port=settings.port, user=settings.user,
        password=settings.password, database=settings.database,
    )  # fmt: skip

    def respond(request: Request) -> Reply:
        return Reply([{"id": 1, "name": "one"}])

    with ApiServer(respond) as server:
        resources = {
            "mysql": mysql_source,
            "rest": RestSourceResource(base_url=server.url),
            "target": PostgresTargetResource(dsn=target_dsn),
        }
        assert materialize(seen, instance, [orders, items], resources).success


def kafka_copies(
    seen: Seen, instance: dg.DagsterInstance, broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    """A Kafka copy with a dead letter, and one whose ledger offset the broker lost (restarted
    at the earliest offset)."""
    bootstrap = broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, [*kafka.json_messages(0, 3), (b"bad", b"{oops")])
    clicks = kafka_copy_asset(
        key="clicks", topic=topic, target_table="raw.clicks",
        options=KafkaCopyOptions(dead_letter_table="raw.dead"),
    )  # fmt: skip
    keyed = kafka_copy_asset(
        key="keyed", topic=topic, target_table="raw.keyed", sink="merge",
        options=KafkaCopyOptions(value_format="bytes", on_lost_offsets="earliest"),
    )  # fmt: skip
    resources = {
        "kafka": KafkaSourceResource(bootstrap_servers=bootstrap, timeout=10.0),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }
    assert materialize(seen, instance, [clicks, keyed], resources).success
    kafka.delete_topic(bootstrap, topic)
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, [(b"k0", None)])
    assert materialize(seen, instance, [keyed], resources).success


def replication(
    seen: Seen, instance: dg.DagsterInstance, logical_source: str, target_dsn: str
) -> None:
    """A replication group's first run (its initial copy, a ``serial`` column's sequence), a
    run applying changes while a table leaves and a partitioned one joins, one merging a new
    partition, its slot check, and the job that drops the group."""
    pg.execute(
        logical_source,
        "CREATE SCHEMA repl; CREATE TABLE repl.t (id serial PRIMARY KEY, v text);"
        "CREATE TABLE repl.u (id int PRIMARY KEY); CREATE TABLE repl.p (id int PRIMARY KEY)"
        " PARTITION BY RANGE (id); CREATE TABLE repl.p1 PARTITION OF repl.p FOR VALUES FROM (0)"
        " TO (10)",
    )
    pg.execute(logical_source, "INSERT INTO repl.t (v) SELECT 'v' FROM generate_series(1, 5)")
    group = replication_assets(["repl.t", "repl.u"], slot="dpone_metadata_sets")
    resources = postgres_resources(logical_source, target_dsn)
    assert materialize(seen, instance, [group], resources).success
    pg.execute(logical_source, "UPDATE repl.t SET v = 'w' WHERE id = 1")
    group = replication_assets(["repl.t", "repl.p"], slot="dpone_metadata_sets")
    assert materialize(seen, instance, [group], resources).success
    pg.execute(
        logical_source, "CREATE TABLE repl.p2 PARTITION OF repl.p FOR VALUES FROM (10) TO (20)"
    )
    assert materialize(seen, instance, [group], resources).success
    drop = drop_replication_job(group)
    result = drop.execute_in_process(resources=resources, instance=instance)
    seen.run(result, instance, [])


def test_every_key_of_every_asset_kind_is_declared_with_its_type_and_every_field_is_written(
    source_dsn: str, target_dsn: str, mariadb: MySQLSettings, instance: dg.DagsterInstance,
    kafka_broker: KafkaBroker, topic: str,
    logical_source_dsn: str,  # noqa: F811 (the fixture imported above)
) -> None:  # fmt: skip
    seen = Seen()
    replication(seen, instance, logical_source_dsn, target_dsn)
    snapshot_copies(seen, instance, source_dsn, target_dsn)
    backfill(seen, instance, source_dsn, target_dsn)
    incremental(seen, instance, source_dsn, target_dsn)
    generic(seen, instance, mariadb, target_dsn)
    kafka_copies(seen, instance, kafka_broker, topic, target_dsn)
    assert seen.kinds == {
        "materialization", "observation", "check", "failure", "spec", "run tags", "op tags",
    }  # fmt: skip
    assert seen.metadata == METADATA_KEYS - set(ONLY_WHEN)
    assert seen.tags == TAG_KEYS
