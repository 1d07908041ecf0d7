"""Runs every entry point that takes a secret, once to success and once to failure, in a
persistent Dagster instance (``DAGSTER_HOME``), with every secret given through ``dg.EnvVar``.

Run as ``python -m tests.helpers.secret_runs`` by ``tests/dagster/test_secrets.py``, which sets
``DAGSTER_HOME`` and the variables below, captures this process's stdout and stderr, then
searches them, every file under ``DAGSTER_HOME`` and the ledger for the password. The last
line printed is a JSON list of ``[run, success, error code]``.

Variables: ``DPONE_SECRET_SOURCE_DSN``, ``DPONE_SECRET_TARGET_DSN`` (good DSNs that hold the
password), ``DPONE_SECRET_DOWN_DSN`` (nothing listens), ``DPONE_SECRET_REFUSED_DSN`` (a role
the server refuses), ``DPONE_SECRET_MYSQL_{HOST,PORT,USER,DATABASE}``,
``DPONE_SECRET_MYSQL_PASSWORD``, ``DPONE_SECRET_MYSQL_WRONG_PASSWORD``,
``DPONE_SECRET_LATE_DSN`` (a DSN with the password and a port that is not one, set only once
the resources are defined), ``DPONE_SECRET_API_URL``
and ``DPONE_SECRET_API_TOKEN``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster.components.testing import create_defs_folder_sandbox
from pydantic import BaseModel

from dpone_dagster import (
    LedgerResource,
    MySQLSourceResource,
    PostgresCopyComponent,
    PostgresSourceResource,
    PostgresTargetResource,
    RestSourceResource,
    backfill_asset,
    cursor_range_partitions,
    incremental_asset,
    mysql_copy_asset,
    rest_copy_asset,
    snapshot_copy_assets,
)
from dpone_dagster.dagster.failures import ERROR_CODE_KEY

ROWS = 200


class Item(BaseModel):
    """A record of the REST source."""

    id: int
    name: str


def _postgres(source: str, target: str) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=dg.EnvVar(source)),
        "target": PostgresTargetResource(dsn=dg.EnvVar(target)),
        "ledger": LedgerResource(),
    }


def _mysql(password: str) -> MySQLSourceResource:
    env = os.environ
    return MySQLSourceResource(
        host=env["DPONE_SECRET_MYSQL_HOST"],
        port=int(env["DPONE_SECRET_MYSQL_PORT"]),
        user=env["DPONE_SECRET_MYSQL_USER"],
        password=dg.EnvVar(password),
        database=env["DPONE_SECRET_MYSQL_DATABASE"],
        connect_timeout=5,
    )


def _rest() -> RestSourceResource:
    return RestSourceResource(
        base_url=os.environ["DPONE_SECRET_API_URL"],
        bearer_token=dg.EnvVar("DPONE_SECRET_API_TOKEN"),
        max_retries=0,
    )


def _runs() -> list[tuple[str, list[Any], Mapping[str, Any], str | None]]:
    """Each run: its name, its assets, its resources and its partition."""
    good = _postgres("DPONE_SECRET_SOURCE_DSN", "DPONE_SECRET_TARGET_DSN")
    target_down = _postgres("DPONE_SECRET_SOURCE_DSN", "DPONE_SECRET_DOWN_DSN")
    source_refused = _postgres("DPONE_SECRET_REFUSED_DSN", "DPONE_SECRET_TARGET_DSN")
    # Unset when the resource is defined, so its DSN is first checked when a run starts.
    late = _postgres("DPONE_SECRET_SOURCE_DSN", "DPONE_SECRET_LATE_DSN")
    copy = snapshot_copy_assets(["shop.orders"])
    missing = snapshot_copy_assets(["shop.missing"], name="missing")
    backfill = backfill_asset(
        "shop.orders", cursor="id", partitions_def=cursor_range_partitions(0, ROWS, ROWS)
    )
    stream = incremental_asset("shop.orders", cursor="updated_at", target_table="shop.stream")
    from_mysql = mysql_copy_asset(key="my_items", target_table="raw.my_items", table="items")
    from_rest = rest_copy_asset(key="items", target_table="raw.items", path="/items", model=Item)
    failing_rest = rest_copy_asset(
        key="broken", target_table="raw.broken", path="/broken", model=Item
    )
    target_only = {"target": good["target"]}
    partition = f"0..{ROWS}"
    return [
        ("copy", [copy], good, None),
        ("copy_target_down", [copy], target_down, None),
        ("copy_table_missing", [missing], good, None),
        ("copy_dsn_refused_at_run_time", [copy], late, None),
        ("backfill", [backfill], good, partition),
        ("backfill_source_refused", [backfill], source_refused, partition),
        ("stream", [stream], good, None),
        ("stream_target_down", [stream], target_down, None),
        (
            "mysql",
            [from_mysql],
            {**target_only, "mysql": _mysql("DPONE_SECRET_MYSQL_PASSWORD")},
            None,
        ),
        (
            "mysql_wrong_password",
            [from_mysql],
            {**target_only, "mysql": _mysql("DPONE_SECRET_MYSQL_WRONG_PASSWORD")},
            None,
        ),
        ("rest", [from_rest], {**target_only, "rest": _rest()}, None),
        ("rest_failing", [failing_rest], {**target_only, "rest": _rest()}, None),
    ]


def _code(result: dg.ExecuteInProcessResult) -> str | None:
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data.user_failure_data
            if data is None:
                return "no code"
            return str(getattr(data.metadata[ERROR_CODE_KEY], "value", None))
    return None


def _component_run(instance: dg.DagsterInstance, name: str, target_env: str) -> list[Any]:
    """Runs a :class:`~dpone_dagster.PostgresCopyComponent` whose YAML names the DSNs as
    ``{{ env.NAME }}``, the way the example ``defs.yaml`` does."""
    contents = {
        "type": "dpone_dagster.PostgresCopyComponent",
        "attributes": {
            "source": {"dsn": "{{ env.DPONE_SECRET_SOURCE_DSN }}"},
            "target": {"dsn": "{{ env." + target_env + " }}"},
            "snapshot_copies": [{"tables": ["shop.orders"], "group_name": "shop"}],
        },
    }
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=PostgresCopyComponent, defs_yaml_contents=contents
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            job = dg.define_asset_job("copy", selection=dg.AssetSelection.groups("shop"))
            runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
            result = runnable.resolve_job_def("copy").execute_in_process(
                instance=instance, raise_on_error=False, tags={"dpone/test_run": name}
            )
    return [name, result.success, _code(result)]


def main() -> None:
    """Runs every run of :func:`_runs`, then the component's, in the instance of
    ``DAGSTER_HOME``."""
    outcomes = []
    late = os.environ.pop("DPONE_SECRET_LATE_DSN")
    runs = _runs()
    os.environ["DPONE_SECRET_LATE_DSN"] = late
    with dg.DagsterInstance.get() as instance:
        for name, assets, resources, partition in runs:
            result = dg.materialize(
                assets,
                resources=resources,
                partition_key=partition,
                instance=instance,
                raise_on_error=False,
                tags={"dpone/test_run": name},
            )
            outcomes.append([name, result.success, _code(result)])
        outcomes.append(_component_run(instance, "component", "DPONE_SECRET_TARGET_DSN"))
        outcomes.append(_component_run(instance, "component_target_down", "DPONE_SECRET_DOWN_DSN"))
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
