"""Dagster resources: the PostgreSQL source and target, the ledger, the MySQL/MariaDB, REST and
Kafka sources; the sources' methods are the event iterators the asset factories are thin over."""

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
