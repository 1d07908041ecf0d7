"""PostgreSQL: sessions and snapshots, extraction strategies, sinks, SQL identifiers.

Imports no Dagster. Names reach SQL only through ``psycopg.sql``.
"""

from .connection import ConnectionOptions, ConnectionSettingsError, check_dsn, connect
from .identifiers import IdentifierError, TableName, check_identifier, quote_identifier
from .session import SourceTransaction
from .staging import PostgresStagingTable, StagingDropError, staging_name_for

__all__ = [
    "ConnectionOptions",
    "ConnectionSettingsError",
    "IdentifierError",
    "PostgresStagingTable",
    "SourceTransaction",
    "StagingDropError",
    "TableName",
    "check_dsn",
    "check_identifier",
    "connect",
    "quote_identifier",
    "staging_name_for",
]
