"""The replication tests' fixtures: a source server with ``wal_level = logical`` and fresh
databases on it, and a PostgreSQL 15 one for the tests whose behaviour depends on the source's
version (:mod:`tests.helpers.logical`); the targets are the run's normal server's."""

from tests.helpers.logical import (  # noqa: F401 (pytest finds fixtures by name)
    logical_server,
    logical_source_dsn,
    make_logical_database,
    pg15_logical_server,
    versioned_source_dsn,
)
