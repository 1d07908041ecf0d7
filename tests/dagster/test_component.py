"""PostgresCopyComponent: the example defs.yaml loads, and its assets materialize."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

# What the webserver is sent: no public name (the test reads what the UI would show).
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value
from dagster.components.testing import create_defs_folder_sandbox
from psycopg.conninfo import make_conninfo

from dpone_dagster import PostgresCopyComponent, PostgresTargetResource
from dpone_dagster.dagster.translator import key_part
from tests.helpers import pg

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "postgres_copy" / "defs.yaml"


def seed(dsn: str) -> None:
    pg.create_mixed_table(dsn, "shop", "customers", rows=50)
    pg.create_mixed_table(dsn, "shop", "orders", rows=200)
    pg.create_mixed_table(dsn, "shop", "Order Items", rows=300)
    pg.create_mixed_table(dsn, "events", "page_views", rows=1200)


def test_the_example_defs_yaml_declares_copies_and_backfills_that_run(
    source_dsn: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(source_dsn)
    monkeypatch.setenv("DPONE_SOURCE_DSN", source_dsn)
    monkeypatch.setenv("DPONE_TARGET_DSN", target_dsn)
    contents = yaml.safe_load(EXAMPLE.read_text())
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=PostgresCopyComponent,
                                          defs_yaml_contents=contents)  # fmt: skip
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, PostgresCopyComponent)
            keys = {spec.key for spec in defs.resolve_all_asset_specs()}
            assert dg.AssetKey(["shop", key_part("Order Items")]) in keys
            assert dg.AssetKey(["events", "page_views"]) in keys
            copy_job = dg.define_asset_job("copy", selection=dg.AssetSelection.groups("shop"))
            events_job = dg.define_asset_job("events", selection=dg.AssetSelection.groups("events"))
            specs = {spec.key: spec for spec in defs.resolve_all_asset_specs()}
            orders = specs[dg.AssetKey(["shop", "orders"])]
            assert orders.tags["tier"] == "gold" and orders.tags["layer"] == "raw"
            assert orders.kinds == {"postgres", "sales"}
            assert set(orders.owners) == {"team:data", "team:sales"}
            assert specs[dg.AssetKey(["events", "page_views"])].owners == [
                "team:data",
                "team:events",
            ]
            assert specs[dg.AssetKey(["source", "shop", "orders"])].kinds == {"postgres"}
            # Dagster's post-processing of the defs.yaml: the events group's assets only.
            assert specs[dg.AssetKey(["events", "page_views"])].tags["retention"] == "long"
            assert "retention" not in orders.tags
            target = defs.resources["target"]
            assert isinstance(target, PostgresTargetResource)
            assert target.application_name == "dpone-example"
            assert target.lock_wait == 120 and target.options.lock_wait == 120
            runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[copy_job, events_job]))
            assert runnable.resolve_job_def("copy").execute_in_process().success
            # A column added to a source between two runs: the next run evolves the target.
            pg.execute(source_dsn, "ALTER TABLE shop.customers ADD note text DEFAULT 'new'")
            again = runnable.resolve_job_def("copy").execute_in_process()
            [customers] = [
                m.materialization
                for m in again.get_asset_materialization_events()
                if m.materialization.asset_key == dg.AssetKey(["shop", "customers"])
            ]
            [change] = customers.metadata["dpone/schema_changes"].value  # type: ignore[misc]
            assert (change["column"], change["kind"]) == ("note", "added")
            assert (
                runnable.resolve_job_def("events")
                .execute_in_process(partition_key="0..50000")
                .success
            )
            live = defs.resolve_schedule_def("shop__orders_live_schedule").job.name
            assert defs.resolve_job_def(live).execute_in_process().success
    assert pg.table_fingerprint(source_dsn, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders_live"
    )
    for name in ("customers", "orders", "Order Items"):
        assert pg.table_fingerprint(source_dsn, "shop", name) == pg.table_fingerprint(
            target_dsn, "shop", name
        )
    assert pg.table_fingerprint(source_dsn, "events", "page_views") == pg.table_fingerprint(
        target_dsn, "events", "page_views"
    )


def chain(exc: BaseException | None) -> str:
    text = ""
    while exc is not None:
        text += f"{exc}\n"
        exc = exc.__cause__ or exc.__context__
    return text


def load_defs(attributes: dict[str, Any]) -> dg.Definitions:
    """The definitions a ``PostgresCopyComponent`` with ``attributes`` builds."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=PostgresCopyComponent,
            defs_yaml_contents={"type": "dpone_dagster.PostgresCopyComponent",
                                "attributes": attributes},
        )  # fmt: skip
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            return defs


def test_a_backfill_needs_exactly_one_kind_of_partitions() -> None:
    attributes = {"backfills": [{"table": "events.page_views", "cursor": "id"}]}
    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dagster wraps the cause
        load_defs(attributes)
    assert "exactly one of range_partitions or daily_partitions" in chain(raised.value)


UNUSED_DSN = "postgresql://nobody@127.0.0.1:5432/never_connected"


UNUSED = {"dsn": "{{ env.DPONE_UNUSED_DSN }}"}


def build(attributes: dict[str, Any]) -> dict[dg.AssetKey, dg.AssetSpec]:
    """The asset specs a defs.yaml with ``attributes`` builds (no database is reached)."""
    os.environ.setdefault("DPONE_UNUSED_DSN", UNUSED_DSN)
    attributes = {"source": UNUSED, "target": UNUSED, **attributes}
    return {spec.key: spec for spec in load_defs(attributes).resolve_all_asset_specs()}


ATTRIBUTES = {
    "asset_attributes": {"group_name": "raw", "owners": ["team:data"],
                         "tags": {"a": "{{ env.DPONE_T_TAG }}"}},
    "source_key_prefix": ["pg"],
    "snapshot_copies": [
        {
            "tables": [
                "shop.customers",
                {"source": "shop.orders", "target": "sales.orders",
                 "attributes": {"key": "warehouse/orders", "group_name": "sales",
                                "description": "Orders.", "tags": {"b": "two"},
                                "kinds": ["sales"], "owners": ["me@example.com"]}},
            ],
            "strategy": "whole_copy",
            "sink": "merge",
        }
    ],
    "backfills": [
        {"table": "events.views", "cursor": "id",
         "range_partitions": {"start": 0, "stop": 10, "step": 5},
         "attributes": {"key": "events/all_views", "kinds": ["events"]}},
    ],
}  # fmt: skip
"""Asset attributes of the component, of a table and of a backfill (``{{ env.DPONE_T_TAG }}``
is ``x``)."""


def test_yaml_sets_asset_attributes_per_table_over_the_components(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPONE_T_TAG", "x")
    specs = build(ATTRIBUTES)
    orders = specs[dg.AssetKey(["warehouse", "orders"])]
    assert orders.group_name == "sales" and orders.description == "Orders."
    assert orders.tags["a"] == "x" and orders.tags["b"] == "two"
    assert orders.kinds == {"postgres", "sales"}
    assert orders.owners == ["team:data", "me@example.com"]
    assert orders.metadata["dpone/table"] == "sales.orders"
    assert orders.metadata["dpone/sink"] == "merge"
    assert [d.asset_key for d in orders.deps] == [dg.AssetKey(["pg", "shop", "orders"])]
    customers = specs[dg.AssetKey(["shop", "customers"])]
    assert customers.group_name == "raw" and customers.owners == ["team:data"]
    views = specs[dg.AssetKey(["events", "all_views"])]
    assert views.kinds == {"postgres", "events"} and views.partitions_def is not None
    assert [d.asset_key for d in views.deps] == [dg.AssetKey(["pg", "events", "views"])]
    for source in (
        ["pg", "shop", "orders"],
        ["pg", "shop", "customers"],
        ["pg", "events", "views"],
    ):
        assert specs[dg.AssetKey(source)].kinds == {"postgres"}
    assert len(specs) == 6


def test_dagsters_templating_and_key_prefix_reach_a_tables_attributes() -> None:
    tables = [
        {
            "source": "shop.items",
            "attributes": {
                "key_prefix": "lake",
                "automation_condition": "{{ dg.AutomationCondition.eager() }}",
            },
        }
    ]
    specs = build({"snapshot_copies": [{"tables": tables}]})  # fmt: skip
    items = specs[dg.AssetKey(["lake", "shop", "items"])]
    assert items.automation_condition == dg.AutomationCondition.eager()
    assert items.metadata["dpone/source_table"] == "shop.items"


def test_the_yaml_of_earlier_versions_loads_with_a_warning_naming_the_new_spelling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``source_dsn_env``/``target_dsn_env`` and attributes written on an entry itself build
    the same assets and resources as ``source``/``target`` and ``attributes``."""
    monkeypatch.setenv("DPONE_T_TAG", "x")
    os.environ.setdefault("DPONE_UNUSED_DSN", UNUSED_DSN)
    [copy] = ATTRIBUTES["snapshot_copies"]  # type: ignore[misc]
    [backfill] = ATTRIBUTES["backfills"]  # type: ignore[misc]
    [name, orders] = copy["tables"]
    old = {
        **ATTRIBUTES,
        "source_dsn_env": "DPONE_UNUSED_DSN",
        "target_dsn_env": "DPONE_UNUSED_DSN",
        "snapshot_copies": [{**copy, "tables": [name, {
            "source": orders["source"], "target": orders["target"], **orders["attributes"]}]}],
        "backfills": [{**{k: v for k, v in backfill.items() if k != "attributes"},
                       **backfill["attributes"]}],
    }  # fmt: skip
    with pytest.warns(FutureWarning) as warned:
        old_defs = load_defs(old)
    said = " ".join(str(w.message) for w in warned)
    assert 'source: {dsn: "{{ env.DPONE_UNUSED_DSN }}"}' in said
    assert 'target: {dsn: "{{ env.DPONE_UNUSED_DSN }}"}' in said
    assert "key, description, tags, kinds, owners, group_name written on table shop.orders" in said
    assert "key, kinds written on backfill events.views" in said
    new = {**ATTRIBUTES, "source": UNUSED, "target": UNUSED}
    new_defs = load_defs(new)

    def shown(defs: dg.Definitions) -> list[tuple[Any, ...]]:
        # Not the code references: each load's defs.yaml is another file.
        return sorted(
            (s.key, s.group_name, s.description, dict(s.tags), s.kinds, s.owners,
             {k: v for k, v in s.metadata.items() if k.startswith("dpone/")})
            for s in defs.resolve_all_asset_specs()
        )  # fmt: skip

    assert shown(old_defs) == shown(new_defs)
    assert set(old_defs.resources or {}) == set(new_defs.resources or {}) == {
        "source", "target", "ledger",
    }  # fmt: skip
    with pytest.raises(Exception) as both:  # noqa: PT011 - Dagster wraps the cause
        load_defs({**new, "source_dsn_env": "DPONE_UNUSED_DSN"})
    assert "give source or source_dsn_env, not both" in chain(both.value)


def test_yaml_can_switch_the_source_assets_off_and_refuses_an_unknown_strategy() -> None:
    specs = build({"source_assets": False, "snapshot_copies": [{"tables": ["shop.orders"]}]})
    assert list(specs) == [dg.AssetKey(["shop", "orders"])]
    assert not specs[dg.AssetKey(["shop", "orders"])].deps
    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dagster wraps the cause
        build({"snapshot_copies": [{"tables": ["shop.orders"], "strategy": "bulk"}]})
    assert "whole_copy" in chain(raised.value) and "bulk" in chain(raised.value)


def shown_in_the_ui(defs: dg.Definitions) -> str:
    """The repository snapshot a code location sends the webserver (resources' configuration
    included)."""
    return serialize_value(RepositorySnap.from_def(defs.get_repository_def()))


def test_a_dsn_from_the_environment_stays_an_env_var_out_of_the_definitions_and_the_ui(
    source_dsn: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dsn of exactly ``{{ env.NAME }}`` is ``EnvVar("NAME")``: the UI shows the variable's
    name, never its value, and a run reads it when it starts. Dagster's templating renders any
    other template into the definitions: a password templated into a DSN would show."""
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=100)
    secret = "never-shown-4711"
    monkeypatch.setenv("DPONE_T_SOURCE", make_conninfo(source_dsn, password=secret))
    monkeypatch.setenv("DPONE_T_TARGET", make_conninfo(target_dsn, password=secret))
    copies = [{"tables": ["shop.orders"]}]
    defs = load_defs({"source": {"dsn": "{{ env.DPONE_T_SOURCE }}"},
                      "target": {"dsn": "{{ env('DPONE_T_TARGET') }}"},
                      "snapshot_copies": copies})  # fmt: skip
    ui = shown_in_the_ui(defs)
    assert secret not in ui and "DPONE_T_SOURCE" in ui and "DPONE_T_TARGET" in ui
    job = dg.define_asset_job("copy", selection=[dg.AssetKey(["shop", "orders"])])
    runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    assert runnable.resolve_job_def("copy").execute_in_process().success
    assert pg.table_fingerprint(source_dsn, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders"
    )
    monkeypatch.setenv("DPONE_T_PASSWORD", secret)
    parts = make_conninfo(source_dsn, password="{{ env.DPONE_T_PASSWORD }}")
    rendered = load_defs({"source": {"dsn": parts}, "target": {"dsn": "{{ env.DPONE_T_TARGET }}"},
                          "snapshot_copies": copies})  # fmt: skip
    assert secret in shown_in_the_ui(rendered)


def test_the_yaml_target_names_the_extensions_a_copy_may_create(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, "CREATE EXTENSION hstore; CREATE SCHEMA shop")
    pg.execute(source_dsn, "CREATE TABLE shop.tags (id int PRIMARY KEY, h hstore)")
    pg.execute(source_dsn, "INSERT INTO shop.tags VALUES (1, 'a=>1')")
    defs = load_defs({"source": {"dsn": source_dsn},
                      "target": {"dsn": target_dsn, "create_extensions": ["hstore"]},
                      "snapshot_copies": [{"tables": ["shop.tags"]}]})  # fmt: skip
    job = dg.define_asset_job("copy", selection=[dg.AssetKey(["shop", "tags"])])
    runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    assert runnable.resolve_job_def("copy").execute_in_process().success
    installed = "SELECT count(*) FROM pg_extension WHERE extname = 'hstore'"
    assert pg.fetch_one(target_dsn, installed) == 1
    assert pg.table_fingerprint(source_dsn, "shop", "tags") == pg.table_fingerprint(
        target_dsn, "shop", "tags"
    )
    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dagster wraps the cause
        load_defs({"source": {"dsn": source_dsn, "create_extensions": ["hstore"]},
                   "snapshot_copies": [{"tables": ["shop.tags"]}]})  # fmt: skip
    assert "create_extensions" in chain(raised.value), "a source creates nothing"


def dg_cli(project: Path, env: dict[str, str], *args: str, ok: bool = True) -> str:
    """``dg ARGS`` (or ``create-dagster ARGS``) of the venv, run in ``project``: its standard
    output when it must exit 0 (``ok``), both outputs when it must fail."""
    tool = args[0] if args[0] == "create-dagster" else "dg"
    argv = [str(Path(sys.executable).parent / tool), *args[tool == "create-dagster" :]]
    done = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip
    assert (done.returncode == 0) == ok, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout if ok else done.stdout + done.stderr


def test_a_fresh_create_dagster_project_lists_scaffolds_checks_and_runs_the_component(
    source_dsn: str, target_dsn: str, tmp_path: Path
) -> None:
    """Dagster's documented path on a new project, with pip: ``create-dagster project``, the
    package added, ``dg list components`` (listed with its docstring), ``dg scaffold defs``
    (a commented defs.yaml), ``dg check defs`` on the filled file, ``dg launch`` of its asset."""
    pg.create_mixed_table(source_dsn, "shop", "orders", rows=300)
    (tmp_path / "home").mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"),
           "DPONE_SOURCE_DSN": source_dsn, "DPONE_TARGET_DSN": target_dsn,
           # create-dagster asks the package index for a newer create-dagster otherwise.
           "DAGSTER_DG_UPDATE_CHECK_ENABLED": "0"}  # fmt: skip
    # `--no-uv-sync`: the pip way; the project's code is found as `pip install -e .` would.
    dg_cli(tmp_path, env, "create-dagster", "project", "--no-uv-sync", "copies")
    project = tmp_path / "copies"
    env["PYTHONPATH"] = str(project / "src")
    # The package added to the project, as `uv add dpone-dagster` writes it (it is installed in
    # this venv, which plays the project's).
    pyproject = (project / "pyproject.toml").read_text()
    assert '"dagster==' in pyproject, pyproject
    (project / "pyproject.toml").write_text(
        pyproject.replace('"dagster==', '"dpone-dagster",\n    "dagster==', 1)
    )
    listed = json.loads(dg_cli(project, env, "list", "components", "--json"))
    if isinstance(listed, dict):  # dg 1.12.22 and later wrap the list
        listed = listed["items"]
    summary = {c["key"]: c["summary"] for c in listed}
    doc = (PostgresCopyComponent.__doc__ or "").split("\n\n")[0]
    assert summary["dpone_dagster.PostgresCopyComponent"].split() == doc.split()
    dg_cli(project, env, "scaffold", "defs", "dpone_dagster.PostgresCopyComponent", "shop")
    defs_yaml = project / "src" / "copies" / "defs" / "shop" / "defs.yaml"
    scaffolded = defs_yaml.read_text()
    comments = [line for line in scaffolded.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) >= 10 and "# schema.table: your table here" in scaffolded
    assert yaml.safe_load(scaffolded)["attributes"] == {
        "source": {"dsn": "{{ env.DPONE_SOURCE_DSN }}"},
        "target": {"dsn": "{{ env.DPONE_TARGET_DSN }}"},
        "snapshot_copies": [{"tables": ["public.my_table"], "strategy": "batched_copy"}],
    }
    # Filled in as a user would: the table, and a typo first, which `dg check defs` refuses.
    filled = scaffolded.replace('"public.my_table"', "shop.orders")
    defs_yaml.write_text(filled.replace("strategy: batched_copy", "strategy: batched"))
    refused = dg_cli(project, env, "check", "defs", ok=False)
    assert "Unknown strategy 'batched' (one of whole_copy, " in refused, refused[-3000:]
    defs_yaml.write_text(filled)
    dg_cli(project, env, "check", "defs")
    defs = json.loads(dg_cli(project, env, "list", "defs", "--json"))
    keys = {a.get("asset_key") or a["key"] for a in defs["assets"]}  # "key" before dg 1.12.22
    assert {"shop/orders", "source/shop/orders"} <= keys
    dg_cli(project, env, "launch", "--assets", "shop/orders")
    assert pg.table_fingerprint(source_dsn, "shop", "orders") == pg.table_fingerprint(
        target_dsn, "shop", "orders"
    )


def test_a_backfill_declares_on_changed_in_yaml_and_an_unknown_value_fails_at_load() -> None:
    def load(on_changed: str) -> dict[dg.AssetKey, dg.AssetSpec]:
        backfill = {
            "table": "events.page_views",
            "cursor": "id",
            "range_partitions": {"start": 0, "stop": 100, "step": 50},
            "on_changed": on_changed,
        }
        return build({"backfills": [backfill]})

    spec = load("repair")[dg.AssetKey(["events", "page_views"])]
    assert spec.metadata["dpone/on_changed"] == "repair"
    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dagster wraps the cause
        load("overwrite")
    assert "on_changed" in chain(raised.value)


def test_an_incremental_stream_declared_in_yaml_keeps_the_target_current_on_its_schedule(
    source_dsn: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg.execute(
        source_dsn,
        "CREATE SCHEMA shop; CREATE TABLE shop.stock (sku int PRIMARY KEY, units int NOT NULL,"
        " updated_at timestamptz NOT NULL DEFAULT now()); CREATE INDEX ON shop.stock (updated_at);"
        " INSERT INTO shop.stock (sku, units) SELECT g, g FROM generate_series(1, 300) g",
    )
    monkeypatch.setenv("DPONE_SOURCE_DSN", source_dsn)
    monkeypatch.setenv("DPONE_TARGET_DSN", target_dsn)
    stream = {"table": "shop.stock", "cursor": "updated_at", "deletes": "hard", "batch_size": 100,
              "cron_schedule": "*/5 * * * *", "attributes": {"owners": ["team:stock"]},
              "sweep_rows": 100}  # fmt: skip
    defs = load_defs({"source": {"dsn": "{{ env.DPONE_SOURCE_DSN }}"},
                      "target": {"dsn": "{{ env.DPONE_TARGET_DSN }}"},
                      "incremental_streams": [stream]})  # fmt: skip
    key = dg.AssetKey(["shop", "stock"])
    spec = {s.key: s for s in defs.resolve_all_asset_specs()}[key]
    assert spec.owners == ["team:stock"] and spec.metadata["dpone/cursor"] == "updated_at"
    schedule = defs.resolve_schedule_def("shop__stock_schedule")
    assert schedule.cron_schedule == "*/5 * * * *"
    job = schedule.job
    first = defs.resolve_job_def(job.name).execute_in_process()
    [materialized] = first.asset_materializations_for_node(first.job_def.nodes[0].name)
    assert materialized.metadata["dpone/rows_inserted"].value == 300
    pg.execute(source_dsn, "UPDATE shop.stock SET units = 0, updated_at = now() WHERE sku = 7;"
                           " DELETE FROM shop.stock WHERE sku = 9")  # fmt: skip
    second = defs.resolve_job_def(job.name).execute_in_process()
    [materialized] = second.asset_materializations_for_node(second.job_def.nodes[0].name)
    figures = {k: materialized.metadata[f"dpone/rows_{k}"].value for k in ("updated", "deleted")}
    assert figures == {"updated": 1, "deleted": 1}
    checks = {c.check_name: c for c in second.get_asset_check_evaluations()}
    assert set(checks) == {"dpone_reconciled", "dpone_fresh"}  # the schedule implies a policy
    assert spec.freshness_policy is not None and checks["dpone_fresh"].passed
    check = checks["dpone_reconciled"]
    assert check.passed
    md = {k: v.value for k, v in check.metadata.items()}
    assert (md["dpone/check_scope"], md["dpone/keys_checked"], md["dpone/rows_swept"]) == (
        "run", 1, 100,
    )  # fmt: skip  # the run's key, and one slice of 100 rows: the YAML's budget
    rows = "SELECT sku, units, updated_at FROM shop.stock ORDER BY sku"
    assert pg.fetch_all(target_dsn, rows) == pg.fetch_all(source_dsn, rows)
