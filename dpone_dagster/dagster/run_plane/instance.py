"""A Dagster instance whose PostgreSQL storage cannot write events, refused when definitions load.

dagster-postgres sends ``NOTIFY run_events, %(id)s`` with every event it stores. SQLAlchemy 2.1
drives a plain ``postgresql://`` URL with psycopg 3, which binds that parameter server-side, and
PostgreSQL refuses a parameter in ``NOTIFY``: every run, the daemon and the webserver then fail on
their first event write with a bare ``syntax error at or near "$1"``. dpone's asset factories call
:func:`check_instance_storage` when the definitions load, so the code location fails at once with
``instance_storage_psycopg3`` and the lines to change, before any run is launched.

Dagster reads the instance's ``dagster.yaml`` (either storage form, ``{env: NAME}`` values, a
custom instance class) and builds its event log storage, as ``DagsterInstance.get()`` does but
without the table check the storage's constructor makes, so loading definitions opens no
connection; the driver is the one of the engine dagster-postgres builds for that storage.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
import yaml

# Dagster 1.13 has no public name that reads an instance's configuration without building its
# storages: DagsterInstance.get() builds them, and dagster-postgres's storages connect (and
# retry for seconds) to check their tables. InstanceRef is what DagsterInstance.get() reads
# dagster.yaml with, and ConfigurableClassData is the storage entry it holds.
from dagster._core.instance.ref import InstanceRef
from dagster._serdes import ConfigurableClassData

from dpone_dagster.lifecycle import DponeError

if TYPE_CHECKING:
    from dagster_postgres import PostgresEventLogStorage


def _postgres_event_log(dagster_home: str) -> PostgresEventLogStorage | None:
    """The instance's event log storage when dagster-postgres keeps it, built without a
    connection; None for any other storage (or a configuration Dagster itself refuses)."""
    try:
        data = InstanceRef.from_dir(dagster_home).event_storage_data
        # Only dagster-postgres's storages are imported: another storage's module (SQLite's
        # included) is not checked, and loading definitions does not pay for importing it.
        if data is None or data.module_name.partition(".")[0] != "dagster_postgres":
            return None
        from dagster_postgres import PostgresEventLogStorage

        kind = getattr(importlib.import_module(data.module_name), data.class_name, None)
        if not (isinstance(kind, type) and issubclass(kind, PostgresEventLogStorage)):
            return None
        # The storage's own config schema resolves {env: NAME}; with should_autocreate_tables
        # off, its constructor builds the engine without connecting.
        config = {**data.config_dict, "should_autocreate_tables": False}
        quiet = ConfigurableClassData(data.module_name, data.class_name, yaml.safe_dump(config))
        return quiet.rehydrate(as_type=PostgresEventLogStorage)
    except dg.DagsterInvalidConfigError:
        return None  # Dagster reports an invalid instance itself, on its own terms


def storage_driver(dagster_home: str) -> str | None:
    """The DBAPI driver (``psycopg2``, ``psycopg``...) of the instance's PostgreSQL event log
    storage, or None when the events are not stored in PostgreSQL.

    Args:
        dagster_home: The instance's directory (its ``dagster.yaml``).
    """
    storage = _postgres_event_log(dagster_home)
    if storage is None:
        return None
    try:
        return _engine_driver(storage.postgres_url)
    except ImportError:
        return None  # a driver that is not installed: Dagster fails on it by itself


def _engine_driver(postgres_url: str) -> str:
    """The driver of the engine dagster-postgres builds for ``postgres_url``."""
    try:  # imported with the storage
        from dagster_postgres.utils import create_pg_engine
    except ImportError:  # the releases without it (0.28.x, 0.29.0) call SQLAlchemy's own
        from sqlalchemy import create_engine

        return str(create_engine(postgres_url).dialect.driver)
    return str(create_pg_engine(postgres_url).dialect.driver)


@lru_cache(maxsize=8)
def _checked(home: str, mtime: float) -> None:
    path = Path(home) / "dagster.yaml"
    if storage_driver(home) in ("psycopg", "psycopg_async"):
        version = importlib.metadata.version("sqlalchemy")
        raise DponeError(
            "instance_storage_psycopg3",
            f"The Dagster instance in {path} stores events in PostgreSQL through psycopg 3 "
            f"(SQLAlchemy {version} picks it for a plain postgresql:// URL), "
            "and dagster-postgres's NOTIFY statements fail under it: every run, the daemon and "
            "the webserver would fail on their first event.",
            [
                "Under storage.postgres.postgres_db in that file, add: scheme: postgresql+psycopg2 "
                "(as deploy/dagster.yaml does); with postgres_url, start the URL with "
                "postgresql+psycopg2://.",
                "Or install SQLAlchemy<2.1 where the webserver, the daemon and the code location "
                "run (it drives postgresql:// with psycopg2).",
            ],
        )


def check_instance_storage(dagster_home: str | None = None) -> None:
    """Refuses an instance whose PostgreSQL storage would hit the ``NOTIFY`` failure.

    Args:
        dagster_home: The instance's directory; ``$DAGSTER_HOME`` by default. Without one, or
            without a ``dagster.yaml`` in it, there is nothing to check.

    Raises:
        DponeError: ``instance_storage_psycopg3``, naming the file and the line to add.
    """
    home = dagster_home or os.environ.get("DAGSTER_HOME")
    if not home:
        return
    path = Path(home) / "dagster.yaml"
    if path.is_file():
        _checked(str(path.parent.resolve()), path.stat().st_mtime)
