"""Replication from the WAL: keep target tables current by decoding a logical slot. No Dagster.

A replication group (a set of tables, one publication, one ``pgoutput`` slot) is read through
:func:`~.reader.read_changes` (a peek that never consumes, up to an LSN and within a budget),
decoded by :mod:`.pgoutput` into the messages of :mod:`.changes`, applied in commit order, and
the slot is advanced (:mod:`.slot`) only after the target committed. :mod:`.setup` refuses a
source that cannot replicate (``wal_level``, privileges, free slots, ownership, a foreign slot)
with a code, before anything is created. A group's options are one
:class:`~.options.ReplicationOptions`. It stands on the shared core and never imports another
engine.
"""

from .changes import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Lsn,
    Message,
    Relation,
    RelationColumn,
    Row,
    Truncate,
    Unchanged,
    Update,
    Value,
    lsn_text,
    parse_lsn,
)
from .options import ReplicationOptions

__all__ = [
    "UNCHANGED",
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "Lsn",
    "Message",
    "Relation",
    "RelationColumn",
    "ReplicationOptions",
    "Row",
    "Truncate",
    "Unchanged",
    "Update",
    "Value",
    "lsn_text",
    "parse_lsn",
]
