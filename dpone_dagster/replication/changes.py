"""The decoded messages of a logical replication slot (``pgoutput``, protocol version 1).

One value per message the engine acts on: a transaction's :class:`Begin` and :class:`Commit`,
a table's :class:`Relation` (its columns, sent before the first change of the table in each
session and again after its schema changed), and the row changes :class:`Insert`,
:class:`Update`, :class:`Delete` and :class:`Truncate`. A row is a tuple of :data:`Value`: the
column's text representation as the server sent it (bytes, not decoded: the load path copies it
as it is), ``None`` for SQL NULL, or :data:`UNCHANGED` for a TOASTed value the update did not
change (the server does not send it: the target keeps its own).

LSNs are integers (:data:`Lsn`); :func:`lsn_text` and :func:`parse_lsn` convert them from and to
PostgreSQL's ``X/Y`` notation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeAlias

Lsn: TypeAlias = int
"""A 64-bit WAL position (``pg_lsn``) as an integer."""


def lsn_text(lsn: Lsn) -> str:
    """PostgreSQL's notation of ``lsn`` (two hexadecimal halves).

    Examples:
        >>> lsn_text(0x16B3748)
        '0/16B3748'
        >>> lsn_text((1 << 32) + 255)
        '1/FF'
    """
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> Lsn:
    """The integer of an LSN written ``X/Y``.

    Raises:
        ValueError: ``text`` is not an LSN.

    Examples:
        >>> parse_lsn("0/16B3748")
        23803720
        >>> parse_lsn(lsn_text(2**40 + 7)) == 2**40 + 7
        True
    """
    high, sep, low = text.strip().partition("/")
    try:
        if sep and 0 < len(high) <= 8 and 0 < len(low) <= 8:
            return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        pass
    raise ValueError(f"not an LSN: {text!r}")


class Unchanged:
    """An unchanged TOASTed value (``u`` in ``pgoutput``): the server did not send it, and the
    target keeps its own. One instance, :data:`UNCHANGED`."""

    __slots__ = ()
    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged()
"""The one :class:`Unchanged` value."""

Value: TypeAlias = bytes | Unchanged | None
"""A column's value in a change: its text representation, None (NULL) or :data:`UNCHANGED`."""

Row: TypeAlias = tuple[Value, ...]
"""A row of a change, one :data:`Value` per column of its :class:`Relation`, in column order."""


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """A column of a published table.

    Attributes:
        name: The column's name.
        type_oid: Its data type's OID (``pg_type.oid``).
        type_modifier: Its type modifier (``atttypmod``; -1 when none).
        is_key: Whether it is part of the table's replica identity (its key).
    """

    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """A published table's description, sent before its first change in a session and after
    its schema changed.

    Attributes:
        oid: The table's OID, by which the row changes name it.
        schema: Its schema (``public`` for the default one).
        name: Its name.
        replica_identity: ``d`` (default: the primary key), ``n`` (nothing), ``f`` (full: every
            column) or ``i`` (an index).
        columns: Its columns in order (the generated and dropped ones are not sent).
    """

    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Begin:
    """A source transaction starts.

    Attributes:
        final_lsn: The LSN of its commit record.
        commit_time: When it committed (UTC).
        xid: Its transaction id.
    """

    final_lsn: Lsn
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """A source transaction ends.

    Attributes:
        commit_lsn: The LSN of its commit record (the position a consumer confirms).
        end_lsn: The end of the commit record.
        commit_time: When it committed (UTC).
    """

    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Insert:
    """A row inserted.

    Attributes:
        relation: The table's OID (its :class:`Relation`).
        new: The new row.
    """

    relation: int
    new: Row


@dataclass(frozen=True, slots=True)
class Update:
    """A row updated.

    Attributes:
        relation: The table's OID (its :class:`Relation`).
        new: The new row (an unchanged TOASTed value is :data:`UNCHANGED`).
        old: The old key (``K``: the key columns, the others None) when the key changed, or the
            whole old row (``O``) under ``REPLICA IDENTITY FULL``; None otherwise (the key is
            the new row's).
    """

    relation: int
    new: Row
    old: Row | None


@dataclass(frozen=True, slots=True)
class Delete:
    """A row deleted.

    Attributes:
        relation: The table's OID (its :class:`Relation`).
        old: Its key (``K``: the key columns, the others None) or, under ``REPLICA IDENTITY
            FULL``, the whole old row (``O``).
    """

    relation: int
    old: Row


@dataclass(frozen=True, slots=True)
class Truncate:
    """Tables truncated in one statement.

    Attributes:
        relations: The tables' OIDs.
        cascade: ``TRUNCATE ... CASCADE``.
        restart_identity: ``TRUNCATE ... RESTART IDENTITY``.
    """

    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


Message: TypeAlias = Begin | Commit | Relation | Insert | Update | Delete | Truncate
"""A decoded message the engine acts on (type and origin messages are consumed by the
decoder)."""
