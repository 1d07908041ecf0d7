"""The one catalog of database failures: what a psycopg error means, as a stable code.

Every ``psycopg.Error`` that reaches an entry point (a snapshot copy, a backfill, an incremental
stream, a generic source's load) is turned into a :class:`DatabaseError` by
:func:`database_error`, whatever layer catches it. The code says which side failed (``source``,
``target``; the ledger is a target-side database the package writes, so its failures are
``target_`` ones and the message names the ledger's object and database) and what kind of
failure it is, by the error's SQLSTATE:

- ``42501`` (insufficient privilege, or "must be owner"): ``<side>_permission_denied``, naming
  the privilege, the object, the role and the database, with the ``GRANT`` to run;
- ``55P03`` (lock not available): ``<side>_lock_timeout``. The target's strong locks are taken
  by :mod:`.lock_wait`, which raises ``target_lock_timeout`` itself, naming the sessions that
  held the lock;
- ``57014`` (query canceled: ``statement_timeout``, or a cancel request): ``<side>_query_canceled``;
- ``40001``, ``40P01`` (serialization failure, deadlock): ``<side>_conflict``;
- class ``53`` (disk full, out of memory, too many connections): ``<side>_out_of_resources``;
- anything else (a lost connection, a server shut down, an error the package did not foresee):
  the caller's own code for an outage of that side (``source_read_failed``,
  ``target_load_failed``, or an engine's own such as ``backfill_persistence_failed``).

No message repeats a password (:func:`~dpone_dagster.lifecycle.redact`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final, Literal

import psycopg

from dpone_dagster.lifecycle import DponeError, redact

from .connection import SESSION_ERRORS
from .identifiers import TableName, quote_identifier

FailureSide = Literal["source", "target"]
"""The side a database failure is reported on (the ledger's failures are the target's)."""


class DatabaseError(DponeError):
    """A database failure with a stable code from :data:`DATABASE_ERRORS`."""


DATABASE_ERRORS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    **SESSION_ERRORS,  # a session that could not be opened (:func:`.connection.session_error`)
    "source_permission_denied": (
        "The source role lacks a privilege the copy needs.",
        ("Run the GRANT named in the message on the source, then run again.",),
    ),
    "target_permission_denied": (
        "The target role lacks a privilege the load needs.",
        ("Run the GRANT named in the message on the target, then run again.",),
    ),
    "source_lock_timeout": (
        "A lock on the source was not granted within the session's lock_timeout.",
        ("End or wait out the session that holds it, then run again.",),
    ),
    "target_lock_timeout": (
        "A strong lock on a target table users read was not granted before the lock_wait "
        "deadline; nothing was changed.",
        (
            "End or wait out the sessions named in the message (a session idle in transaction "
            "holds its locks until it ends: pg_terminate_backend(pid), or set "
            "idle_in_transaction_session_timeout on the target), then run again.",
            "Or raise lock_wait (seconds; on the target resource, or ConnectionOptions) to wait "
            "longer: the target's readers still never queue behind the copy for longer than "
            "one attempt's lock_timeout.",
        ),
    ),
    "source_query_canceled": (
        "A source statement was canceled (statement_timeout, or a cancel request).",
        (
            "Raise statement_timeout_ms of the source (0: none) or find who canceled it, then "
            "run again.",
        ),
    ),
    "target_query_canceled": (
        "A target statement was canceled (statement_timeout, or a cancel request); nothing of "
        "it was committed.",
        (
            "Raise statement_timeout_ms of the target (0: none) or find who canceled it, then "
            "run again.",
        ),
    ),
    "source_conflict": (
        "The source ended the read with a serialization failure or a deadlock.",
        ("Run again.",),
    ),
    "target_conflict": (
        "The target refused the transaction with a serialization failure or a deadlock; "
        "nothing of it was committed.",
        ("Run again; if it repeats, look for another writer of the same target rows.",),
    ),
    "source_out_of_resources": (
        "The source server ran out of a resource (disk, memory or connections).",
        ("Free the resource named in the message on the source server, then run again.",),
    ),
    "target_out_of_resources": (
        "The target server ran out of a resource (disk, memory or connections); nothing of the "
        "transaction was committed.",
        ("Free the resource named in the message on the target server, then run again.",),
    ),
    "source_read_failed": (
        "Reading the source failed.",
        ("Check the source server and its sessions, then run the copy again.",),
    ),
    "target_load_failed": (
        "Loading the target failed.",
        ("Fix the cause named in the message, then run the copy again.",),
    ),
}
"""Every database-failure code with its default message and next actions: the sessions' own
(``<side>_unreachable``, ``<side>_login_failed``, ``<side>_tls_failed``) and a statement's."""

_KIND_BY_SQLSTATE: Final[dict[str, str]] = {
    "42501": "permission_denied",
    "55P03": "lock_timeout",
    "57014": "query_canceled",
    "40001": "conflict",
    "40P01": "conflict",
}
_KIND_BY_CLASS: Final[dict[str, str]] = {"53": "out_of_resources"}

_DENIED = re.compile(r"permission denied for (?P<kind>[a-z ]+?) (?P<name>.+)$")
_OWNER = re.compile(r"must be owner of (?P<kind>[a-z ]+?) (?P<name>.+)$")
_TEMPORARY = re.compile(
    r'permission denied to create temporary tables in database "?(?P<name>[^"]+)"?'
)

# What each side needs of an object of a kind (docs/production.md, "Privileges"): the source
# only reads.
_SOURCE_NEEDS: Final[dict[str, str]] = {
    "table": "SELECT",
    "view": "SELECT",
    "materialized view": "SELECT",
    "sequence": "SELECT",
    "schema": "USAGE",
    "function": "EXECUTE",
}
_TARGET_NEEDS: Final[dict[str, str]] = {
    "table": "SELECT, INSERT, UPDATE, DELETE",
    "sequence": "USAGE, SELECT, UPDATE",
    "schema": "USAGE, CREATE",
    "database": "CREATE",
    "type": "USAGE",
    "function": "EXECUTE",
}


def failure_kind(exc: psycopg.Error) -> str | None:
    """The kind of failure ``exc`` is (``permission_denied``, ``lock_timeout``,
    ``query_canceled``, ``conflict``, ``out_of_resources``), or None for an outage or an error
    no kind names (the caller's outage code applies)."""
    state = exc.sqlstate or ""
    return _KIND_BY_SQLSTATE.get(state) or _KIND_BY_CLASS.get(state[:2])


def database_error(
    exc: psycopg.Error,
    side: FailureSide,
    *,
    outage: DponeError | None = None,
    conn: psycopg.Connection[object] | None = None,
    known: Sequence[TableName] = (),
) -> DponeError:
    """The stable error of a database failure on ``side``.

    Args:
        exc: What psycopg raised.
        side: The side whose session raised it.
        outage: The caller's error for a failure no kind names (a lost connection, a server
            shut down): ``source_read_failed`` / ``target_load_failed`` when None.
        conn: The session that failed: its role and database are named in a privilege error.
        known: Tables the caller works on: a table a privilege error names without its
            schema is named with it when one of these has its name.

    Returns:
        The error to raise (``raise database_error(exc, side) from exc``).
    """
    kind = failure_kind(exc)
    cause = redact(str(exc)).strip().rstrip(".")
    if kind == "permission_denied":
        return permission_denied(exc, side, conn=conn, known=known)
    if kind is not None:
        return DatabaseError.from_catalog(DATABASE_ERRORS, f"{side}_{kind}", f"({cause}.)")
    if outage is not None:
        return outage
    return DatabaseError.from_catalog(
        DATABASE_ERRORS, "source_read_failed" if side == "source" else "target_load_failed", cause
    )


@contextmanager
def coded_failures(
    side: FailureSide,
    *,
    outage: Callable[[psycopg.Error], DponeError] | None = None,
    known: Sequence[TableName] = (),
) -> Iterator[None]:
    """Raises a ``psycopg.Error`` of the block as :func:`database_error` of ``side`` (the
    block's statements run on that side only); ``outage`` builds the caller's own code."""
    try:
        yield
    except psycopg.Error as exc:
        fallback = None if outage is None else outage(exc)
        raise database_error(exc, side, outage=fallback, known=known) from exc


def permission_denied(
    exc: psycopg.Error,
    side: FailureSide,
    *,
    conn: psycopg.Connection[object] | None = None,
    known: Sequence[TableName] = (),
) -> DatabaseError:
    """``<side>_permission_denied`` for an ``InsufficientPrivilege``: the privilege the side
    needs on the object PostgreSQL named, and the ``GRANT`` (or ``ALTER ... OWNER``) to run."""
    primary = (exc.diag.message_primary or str(exc)).strip()
    role = conn.info.user if conn is not None and not conn.closed else None
    database = conn.info.dbname if conn is not None and not conn.closed else None
    grantee = quote_identifier(role) if role else "<the role of the DSN>"
    where = f" in database {database!r}" if database else ""
    found = _DENIED.search(primary)
    owner = _OWNER.search(primary)
    temporary = _TEMPORARY.search(primary)
    detail = f"PostgreSQL said: {redact(primary)}."
    actions: list[str] = []
    if temporary:  # a reconciliation's or a backfill's temporary table
        name = quote_identifier(temporary["name"])
        detail = f"Role {role or '?'!r} lacks TEMPORARY on database {name} ({redact(primary)})."
        actions.append(
            f"Run, as the database's owner: GRANT TEMPORARY ON DATABASE {name} TO {grantee};"
        )
    elif found or owner:
        match = found or owner
        assert match is not None
        kind, name = match["kind"], _qualified(match["name"], known)
        if owner:
            what = f"lacks ownership of {kind} {name}"
            command = f"ALTER {kind.upper()} {name} OWNER TO {grantee};"
        else:
            needs = (_SOURCE_NEEDS if side == "source" else _TARGET_NEEDS).get(kind, "USAGE")
            # One privilege is exact; several are what the side may need there, one of them
            # missing (PostgreSQL does not say which).
            lacks = "lacks" if "," not in needs else "lacks one of"
            what = f"{lacks} {needs} on {kind} {name}"
            command = f"GRANT {needs} ON {kind.upper()} {name} TO {grantee};"
        detail = f"Role {role or '?'!r} {what}{where} ({redact(primary)})."
        actions.append(f"Run on the {side} database{where}, as its owner: {command}")
    actions.append(
        "The privileges table (docs/production.md, Privileges) lists what each feature needs on "
        "the source, the target and the ledger."
    )
    return DatabaseError.from_catalog(DATABASE_ERRORS, f"{side}_permission_denied", detail, actions)


def denied_object(exc: psycopg.Error) -> str | None:
    """The name of the object a privilege error names (unquoted), or None."""
    if failure_kind(exc) != "permission_denied":
        return None
    primary = (exc.diag.message_primary or str(exc)).strip()
    match = _DENIED.search(primary) or _OWNER.search(primary)
    return None if match is None else match["name"].strip().strip('"')


def _qualified(name: str, known: Sequence[TableName]) -> str:
    """``name`` as PostgreSQL printed it, schema-qualified when a known table has that name."""
    plain = name.strip().strip('"')
    for table in known:
        if plain in (table.name, table.qualified, f"{table.schema}.{table.name}"):
            return table.qualified
    return name.strip()
