"""Dagster resources: the PostgreSQL source and target, the ledger, the MySQL/MariaDB, REST and
Kafka sources; the sources' methods are the event iterators the asset factories are thin over."""

from typing import TYPE_CHECKING

from dpone_dagster.lazy_names import lazy_names

if TYPE_CHECKING:
    from .kafka import KafkaSourceResource
    from .ledger import LedgerResource
    from .postgres import PostgresSourceResource, PostgresTargetResource
    from .secrets import LiteralSecretWarning
    from .sources import MySQLSourceResource, RestSourceResource

__all__ = [
    "KafkaSourceResource",
    "LedgerResource",
    "LiteralSecretWarning",
    "MySQLSourceResource",
    "PostgresSourceResource",
    "PostgresTargetResource",
    "RestSourceResource",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "KafkaSourceResource": ".kafka",
        "LedgerResource": ".ledger",
        "LiteralSecretWarning": ".secrets",
        "MySQLSourceResource": ".sources",
        "PostgresSourceResource": ".postgres",
        "PostgresTargetResource": ".postgres",
        "RestSourceResource": ".sources",
    },
)
