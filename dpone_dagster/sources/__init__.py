"""Generic source adapters (MySQL/MariaDB, REST, Kafka): honest receipts, no snapshot claims.

Imports no Dagster. Every adapter implements :class:`SourceAdapter`: ``describe()`` maps its types
before any row moves, ``extract()`` returns a lazy :class:`RowStreamArtifact` whose receipt opens
at the first read and completes only when the source is exhausted.
"""

from .copy_options import SourceCopyOptions
from .kafka import (
    KafkaCopyReport,
    KafkaSource,
    PartitionRead,
    copy_topic,
    stream_id_of,
)
from .kafka_client import KafkaSettings
from .kafka_messages import ValueFormat
from .kafka_options import KafkaCopyOptions, LostOffsets
from .load import SourceLoadError, SourceLoadReport, StagedRows, load_source, stage_rows
from .mysql import MySQLSettings, MySQLSource, MySQLStream
from .mysql_catalog import quote_mysql_identifier
from .mysql_read import MySQLRead
from .protocol import (
    ByteMeter,
    Row,
    RowStreamArtifact,
    SourceAdapter,
    SourceColumn,
    SourceError,
    extract_stream,
)
from .rest import HttpSession, RestSettings, RestSource
from .rest_pagination import (
    CursorPagination,
    NextLinkPagination,
    PageNumberPagination,
    PageRequest,
    Pagination,
)
from .rest_read import RestRead
from .rest_schema import model_columns

__all__ = [
    "ByteMeter",
    "CursorPagination",
    "HttpSession",
    "KafkaCopyOptions",
    "KafkaCopyReport",
    "KafkaSettings",
    "KafkaSource",
    "LostOffsets",
    "MySQLRead",
    "MySQLSettings",
    "MySQLSource",
    "MySQLStream",
    "NextLinkPagination",
    "PageNumberPagination",
    "PageRequest",
    "Pagination",
    "PartitionRead",
    "RestRead",
    "RestSettings",
    "RestSource",
    "Row",
    "RowStreamArtifact",
    "SourceAdapter",
    "SourceColumn",
    "SourceCopyOptions",
    "SourceError",
    "SourceLoadError",
    "SourceLoadReport",
    "StagedRows",
    "ValueFormat",
    "copy_topic",
    "extract_stream",
    "load_source",
    "model_columns",
    "quote_mysql_identifier",
    "stage_rows",
    "stream_id_of",
]
