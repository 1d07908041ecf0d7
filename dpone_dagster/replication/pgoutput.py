"""The decoder of ``pgoutput`` messages (logical replication protocol version 1).

:func:`decode` turns one message (the ``data`` of a row of
``pg_logical_slot_peek_binary_changes(..., 'proto_version', '1', ...)``) into a message of
:mod:`.changes`: ``B`` (begin), ``C`` (commit), ``R`` (relation), ``I`` (insert), ``U`` (update,
with the old key ``K`` or the old row ``O``), ``D`` (delete), ``T`` (truncate). ``Y`` (a type's
name) and ``O`` (a transaction's origin) carry nothing the engine uses: they decode to None. A
row's values are kept as the server sent them (the text representation as ``bytes``; ``n`` is
None, ``u`` an unchanged TOASTed value, :data:`~.changes.UNCHANGED`).

This is the replication's hot path: every change passes here once. The fields are read with
precompiled :class:`struct.Struct` readers at offsets into the message (no per-byte loop, no
copy but the values themselves). The engine takes a row change's parts from
:func:`row_change` (no message object per change); :func:`decode` builds the message from the
same parts, its frozen messages made without their generated ``__init__`` (which sets each
field through ``object.__setattr__``), by the slots' own setters.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeAlias, TypeVar

from dpone_dagster.core.errors import engine_error

from .changes import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    RelationColumn,
    Truncate,
    Update,
    Value,
)

_U8: Final = struct.Struct(">B").unpack_from
_U16: Final = struct.Struct(">H").unpack_from
_I32: Final = struct.Struct(">i").unpack_from
_U32: Final = struct.Struct(">I").unpack_from
_BEGIN: Final = struct.Struct(">xQqI").unpack_from  # final LSN, commit time, xid
_COMMIT: Final = struct.Struct(">xxQQq").unpack_from  # flags, commit LSN, end LSN, commit time
_ROW: Final = struct.Struct(">xIBH").unpack_from  # relation OID, tuple kind (N, K, O), count
_TRUNCATE: Final = struct.Struct(">xIB").unpack_from  # relation count, options
_ATTR: Final = struct.Struct(">Ii").unpack_from  # a column's type OID and type modifier
_VALUE: Final = struct.Struct(">BI").unpack_from  # a tuple value's kind and its text's length

_POSTGRES_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
"""Where the protocol's timestamps (microseconds) count from."""

_T = TypeVar("_T")

RowChange: TypeAlias = tuple[int, int, list[Value] | None, list[Value] | None]
"""A row change's parts (:func:`row_change`): its kind byte, table OID, new row and old row."""


def _builder(cls: type[_T]) -> Callable[..., _T]:
    """A fast constructor of the frozen, slotted dataclass ``cls`` (fields in order): the
    instance is made with ``object.__new__`` and each slot set by its descriptor, which a frozen
    class's ``__setattr__`` does not guard. Equal to ``cls(*fields)``, at half the cost."""
    setters = tuple(cls.__dict__[name].__set__ for name in cls.__slots__)  # type: ignore[attr-defined]
    new = object.__new__
    if len(setters) == 2:
        first, second = setters

        def build2(a: Any, b: Any) -> _T:
            obj = new(cls)
            first(obj, a)
            second(obj, b)
            return obj

        return build2
    if len(setters) == 3:
        first, second, third = setters

        def build3(a: Any, b: Any, c: Any) -> _T:
            obj = new(cls)
            first(obj, a)
            second(obj, b)
            third(obj, c)
            return obj

        return build3
    return cls


_insert: Final = _builder(Insert)
_update: Final = _builder(Update)
_delete: Final = _builder(Delete)


def _timestamp(micros: int) -> datetime:
    return _POSTGRES_EPOCH + timedelta(microseconds=micros)


def _invalid(data: bytes, reason: str) -> Exception:
    head = bytes(data[:16]).hex()
    return engine_error(
        "replication_message_invalid",
        f"A pgoutput message could not be decoded ({reason}; first bytes {head}).",
    )


def _tuple(data: bytes, pos: int, count: int) -> tuple[list[Value], int]:
    """The row (TupleData) of ``count`` values starting at ``pos``, and the offset after it."""
    values: list[Value] = []
    append = values.append
    for _ in range(count):
        if data[pos] == 116:  # 't': text
            start = pos + 5
            pos = start + _U32(data, pos + 1)[0]
            append(data[start:pos])
        else:
            kind = data[pos]
            pos += 1
            if kind == 110:  # 'n': NULL
                append(None)
            elif kind == 117:  # 'u': unchanged TOASTed value
                append(UNCHANGED)
            else:
                raise _invalid(data, f"tuple value of kind {chr(kind)!r}")
    return values, pos


COPY_SPECIAL: Final = b"\t\\\n\r"
"""The bytes ``COPY ... (FORMAT text)`` escapes inside a field (the tab, the backslash, the
newline and the carriage return)."""


def copy_ready(body: bytes, width: int) -> bool:
    """Whether ``body``, ``width`` fields joined by tabs, is ``COPY`` text as it stands: its
    only special bytes are the ``width - 1`` tabs that join them (one pass in C, no pattern)."""
    return len(body) - len(body.translate(None, COPY_SPECIAL)) == width - 1


def new_tuple_text(data: bytes, width: int) -> bytes | None:
    """The new row of an insert, or of an update that sends no old key, as ``COPY`` text
    fields joined by tabs, straight from the message's bytes (the apply's fast path: no value
    is built on its own); ``None`` when the message is anything else, or a value is NULL, an
    unchanged TOASTed value, or text that ``COPY`` escapes, or the message is malformed
    (:func:`row_change` then decodes it, or says why it cannot)."""
    # Hot: the readers bound once; a count other than ``width`` ends off the message's end.
    try:
        if data[5] != 78:  # 'N': no old key or row before the new tuple
            return None
        pos, value = 8, _VALUE
        parts: list[bytes] = []
        for _ in range(width):
            kind, length = value(data, pos)
            if kind != 116:  # 't'
                return None
            pos += 5
            parts.append(data[pos : pos + length])
            pos += length
    except (struct.error, IndexError):
        return None
    if pos != len(data):
        return None
    body = b"\t".join(parts)
    return body if copy_ready(body, width) else None


def _string(data: bytes, pos: int) -> tuple[str, int]:
    """The NUL-terminated string at ``pos``, and the offset after it."""
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


def _relation(data: bytes) -> Relation:
    (oid,) = _U32(data, 1)
    schema, pos = _string(data, 5)
    name, pos = _string(data, pos)
    identity = chr(data[pos])
    (count,) = _U16(data, pos + 1)
    pos += 3
    columns = []
    for _ in range(count):
        flags = data[pos]
        column, pos = _string(data, pos + 1)
        type_oid, modifier = _ATTR(data, pos)
        pos += 8
        columns.append(RelationColumn(column, type_oid, modifier, bool(flags & 1)))
    # An empty namespace is pg_catalog's (the protocol leaves it out).
    return Relation(oid, schema or "pg_catalog", name, identity, tuple(columns))


def _row_change(data: bytes) -> RowChange:
    kind = data[0]
    oid, tag, count = _ROW(data, 0)
    old: list[Value] | None = None
    if kind == 73:  # 'I'
        if tag != 78:  # 'N'
            raise _invalid(data, f"insert tuple kind {chr(tag)!r}")
        new, end = _tuple(data, 8, count)
    elif kind == 68:  # 'D'
        if tag != 75 and tag != 79:  # 'K', 'O'
            raise _invalid(data, f"delete tuple kind {chr(tag)!r}")
        old, end = _tuple(data, 8, count)
        new = None
    elif kind == 85:  # 'U'
        pos = 8
        if tag != 78:  # 'N'
            if tag != 75 and tag != 79:  # 'K', 'O'
                raise _invalid(data, f"update tuple kind {chr(tag)!r}")
            old, pos = _tuple(data, pos, count)
            if data[pos] != 78:  # 'N'
                raise _invalid(data, "update without its new tuple")
            (count,) = _U16(data, pos + 1)
            pos += 3
        new, end = _tuple(data, pos, count)
    else:
        raise _invalid(data, f"not a row change: kind {chr(kind)!r}")
    if end != len(data):
        raise _invalid(data, "its tuples do not end at its end")
    return kind, oid, new, old


def row_change(data: bytes) -> RowChange:
    """The parts of one row change message (``I``, ``U`` or ``D``), without a message object:
    the engine's hot path (:func:`decode` builds its :class:`~.changes.Insert`,
    :class:`~.changes.Update` and :class:`~.changes.Delete` from the same parts).

    Returns:
        ``(kind, relation, new, old)``: the message's first byte (``ord("I")``, ``ord("U")`` or
        ``ord("D")``), the table's OID, the new row (None for a delete) and the old key or row
        (None when the message has none), each a list of :data:`~.changes.Value`.

    Raises:
        EngineError: ``replication_message_invalid``: not a row change of protocol version 1.
    """
    try:
        return _row_change(data)
    except (struct.error, IndexError, ValueError) as exc:
        raise _invalid(data, f"truncated or malformed: {exc}") from None


def _truncate(data: bytes) -> Truncate:
    count, options = _TRUNCATE(data, 0)
    oids = struct.unpack_from(f">{count}I", data, 6)
    return Truncate(tuple(oids), bool(options & 1), bool(options & 2))


def decode(data: bytes) -> Message | None:
    """The message of one ``pgoutput`` (protocol version 1) message.

    Args:
        data: The message's bytes (a ``pg_logical_slot_*_binary_changes`` row's ``data``).

    Returns:
        The decoded message; None for a type (``Y``) or origin (``O``) message.

    Raises:
        EngineError: ``replication_message_invalid``: not a message of protocol version 1
            (an unknown kind, a binary value, a truncated message).
    """
    try:
        kind = data[0]
        if kind == 73 or kind == 85 or kind == 68:  # 'I', 'U', 'D'
            _, oid, new, old = _row_change(data)
            if kind == 73:
                return _insert(oid, tuple(new))  # type: ignore[arg-type]
            if kind == 85:
                return _update(oid, tuple(new), None if old is None else tuple(old))  # type: ignore[arg-type]
            return _delete(oid, tuple(old))  # type: ignore[arg-type]
        if kind == 66:  # 'B'
            final_lsn, micros, xid = _BEGIN(data, 0)
            return Begin(final_lsn, _timestamp(micros), xid)
        if kind == 67:  # 'C'
            commit_lsn, end_lsn, micros = _COMMIT(data, 0)
            return Commit(commit_lsn, end_lsn, _timestamp(micros))
        if kind == 82:  # 'R'
            return _relation(data)
        if kind == 84:  # 'T'
            return _truncate(data)
        if kind in (89, 79):  # 'Y' (a type's name), 'O' (the origin)
            return None
    except (struct.error, IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _invalid(data, f"truncated or malformed: {exc}") from None
    raise _invalid(data, f"unknown message kind {chr(kind)!r}")
