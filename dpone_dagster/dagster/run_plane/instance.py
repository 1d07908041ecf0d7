"""A Dagster instance whose PostgreSQL storage cannot write events, refused when definitions load.

dagster-postgres sends ``NOTIFY run_events, %(id)s`` with every event it stores. SQLAlchemy 2.1
drives a plain ``postgresql://`` URL with psycopg 3, which binds that parameter server-side, and
PostgreSQL refuses a parameter in ``NOTIFY``: every run, the daemon and the webserver then fail on
their first event write with a bare ``syntax error at or near "$1"``. dpone's asset factories call
:func:`check_instance_storage` when the definitions load, so the code location fails at once with
``instance_storage_psycopg3`` and the lines to change, before any run is launched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import sqlalchemy.engine
import yaml

from dpone_dagster.lifecycle import DponeError

_EVENT_LOG_CLASS = "PostgresEventLogStorage"


def _resolve(value: Any) -> str | None:
    """A config value, reading ``{env: NAME}`` as Dagster does."""
    if isinstance(value, Mapping) and "env" in value:
        return os.environ.get(str(value["env"]))
    return None if value is None else str(value)


def _postgres_config(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The dagster-postgres config of the instance's event log storage, if it has one."""
    storage = config.get("storage")
    if isinstance(storage, Mapping) and isinstance(storage.get("postgres"), Mapping):
        return dict(storage["postgres"])
    legacy = config.get("event_log_storage")
    if isinstance(legacy, Mapping) and legacy.get("class") == _EVENT_LOG_CLASS:
        inner = legacy.get("config")
        return dict(inner) if isinstance(inner, Mapping) else {}
    return None


def _scheme(postgres: Mapping[str, Any]) -> str:
    """The URL scheme dagster-postgres builds its SQLAlchemy engine with."""
    url = _resolve(postgres.get("postgres_url"))
    if url:
        return url.split("://", 1)[0]
    database = postgres.get("postgres_db")
    scheme = _resolve(database.get("scheme")) if isinstance(database, Mapping) else None
    return scheme or "postgresql"


def storage_driver(config: Mapping[str, Any]) -> str | None:
    """The DBAPI driver SQLAlchemy picks for the instance's PostgreSQL event log storage
    (``psycopg2``, ``psycopg``...), or None when the events are not stored in PostgreSQL."""
    postgres = _postgres_config(config)
    if postgres is None:
        return None
    url = sqlalchemy.engine.make_url(f"{_scheme(postgres)}://dpone@localhost/dpone")
    return str(url.get_dialect().driver)


@lru_cache(maxsize=8)
def _checked(path: str, mtime: float) -> None:
    config = yaml.safe_load(Path(path).read_text()) or {}
    driver = storage_driver(config) if isinstance(config, Mapping) else None
    if driver in ("psycopg", "psycopg_async"):
        raise DponeError(
            "instance_storage_psycopg3",
            f"The Dagster instance in {path} stores events in PostgreSQL through psycopg 3 "
            f"(SQLAlchemy {sqlalchemy.__version__} picks it for a plain postgresql:// URL), "
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
        _checked(str(path.resolve()), path.stat().st_mtime)
