"""The extensions a table's types come from: never created in a target unless the caller says so.

A type an extension owns (``hstore``, ``citext``, pgvector's ``vector``, PostGIS' ``geometry``)
is brought by its extension, never created on its own. :func:`plan_extensions` reads what the
target server offers (``pg_available_extensions``, the requirements of each version) and what
the target database has installed, and refuses before anything is written:

- ``target_extension_unavailable``: the target server cannot install the extension at all (its
  files are not in the server's extension directory);
- ``target_extension_missing``: the target database does not have it, and the caller did not
  name it (and each extension it requires) in ``create_extensions``, or runs under
  ``freeze``; the message names its version on the source and the ``CREATE EXTENSION`` to run.

Named ones are created by :func:`create_extension` in the load's transaction
(``target_extension_not_permitted`` when the target's role may not).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import DponeError

from .catalog import ensure_schema
from .connection import Connection
from .schema_change import SchemaChanges
from .user_types import TargetTypeError


@dataclass(frozen=True)
class Extension:
    """An extension the target gets.

    Attributes:
        name: Its name.
        schema: The schema it is created in (the source's; None: the target's default).
        version: The version the target creates (its server's default version).
        source_version: Its version on the source (None for one only required by another).
    """

    name: str
    schema: str | None
    version: str
    source_version: str | None = None

    def command(self) -> str:
        """The ``CREATE EXTENSION`` statement, as a person would type it."""
        schema = "" if self.schema is None else f" WITH SCHEMA {_quoted(self.schema)}"
        return f"CREATE EXTENSION IF NOT EXISTS {_quoted(self.name)}{schema};"


def extension_names(value: Collection[str], *, refusal: str) -> tuple[str, ...]:
    """``create_extensions`` as the names it holds, parsed once where a caller's value enters.

    Raises:
        DponeError: ``refusal`` for a bare string (a list of names is expected) or a name that
            is not a non-empty string.
    """
    if isinstance(value, str) or not all(isinstance(n, str) and n for n in value):
        raise DponeError(
            refusal,
            f"create_extensions must be a list of extension names, not {value!r}.",
            ['Name the extensions the copy may create, such as create_extensions=["hstore"].'],
        )
    return tuple(dict.fromkeys(value))


_EXTENSIONS = """
WITH RECURSIVE want(name) AS (
    SELECT unnest(%(names)s::name[])
  UNION
    SELECT r.name FROM want
    JOIN pg_available_extensions a ON a.name = want.name AND a.installed_version IS NULL
    JOIN pg_available_extension_versions v ON v.name = a.name AND v.version = a.default_version
    CROSS JOIN LATERAL unnest(v.requires) AS r(name)
)
SELECT w.name::text, a.default_version, x.extversion,
       (SELECT v.requires::text[] FROM pg_available_extension_versions v
        WHERE v.name = a.name AND v.version = a.default_version)
FROM want w
LEFT JOIN pg_available_extensions a ON a.name = w.name
LEFT JOIN pg_extension x ON x.extname = w.name
"""


def plan_extensions(
    target: Connection,
    needed: Mapping[str, tuple[str, str]],
    mode: SchemaChanges,
    *,
    allowed: Collection[str],
    table: str,
) -> tuple[tuple[Extension, ...], frozenset[str]]:
    """The extensions the target must get for ``needed`` (name -> its version and schema on the
    source), required ones first, and those the target database has already.

    Raises:
        TargetTypeError: ``target_extension_unavailable``, ``target_extension_missing``.
    """
    if not needed:
        return (), frozenset()
    rows = target.execute(_EXTENSIONS, {"names": sorted(needed)}).fetchall()
    known = {str(r[0]): r for r in rows}
    unavailable = sorted(name for name, r in known.items() if r[1] is None and r[2] is None)
    if unavailable:
        _refuse_unavailable(target, unavailable, needed, table)
    installed = frozenset(name for name, r in known.items() if r[2] is not None)
    order: list[str] = []

    def visit(name: str) -> None:  # what an extension requires comes first
        for required in known[name][3] or ():
            if required in known and required not in installed:
                visit(required)
        if name not in order:
            order.append(name)

    for name in sorted(set(needed) - installed):
        visit(name)
    planned = tuple(
        Extension(name, needed[name][1], str(known[name][1]), needed[name][0])
        if name in needed else Extension(name, None, str(known[name][1]))
        for name in order
    )  # fmt: skip
    if any(mode is SchemaChanges.FREEZE or e.name not in allowed for e in planned):
        _refuse_missing(target, planned, allowed, table, mode)
    return planned, installed


def _refuse_unavailable(
    target: Connection, names: Sequence[str], needed: Mapping[str, tuple[str, str]], table: str
) -> None:
    versions = ", ".join(
        f"{n} ({needed[n][0]} on the source)" if n in needed else f"{n} (required by another)"
        for n in names
    )
    raise TargetTypeError(
        "target_extension_unavailable",
        f"Target table {table} needs extension(s) {versions}, which the target server "
        f"(PostgreSQL {target.info.server_version // 10000}) does not have at all: "
        "pg_available_extensions does not list them. Nothing was written.",
        [
            "Install the extension on the target server (its package, which puts its files "
            "in the server's extension directory), then run again.",
            "Or copy into a target server that has the extension, or copy the other tables "
            "without this one.",
        ],
    )


def _refuse_missing(
    target: Connection,
    planned: Sequence[Extension],
    allowed: Collection[str],
    table: str,
    mode: SchemaChanges,
) -> None:
    listed = ", ".join(
        f"{e.name} ({e.source_version} on the source; the target server offers {e.version})"
        if e.source_version else f"{e.name} (which another requires; {e.version})"
        for e in planned
    )  # fmt: skip
    commands = " ".join(e.command() for e in planned)
    frozen = mode is SchemaChanges.FREEZE
    names = ", ".join(repr(e.name) for e in planned)
    actions = [f"Run, as a role allowed to: {commands}"]
    if not frozen:
        actions.append(
            f"Or let the copy run it: create_extensions=[{names}] (its target role must be "
            "allowed to create them)."
        )
    why = (
        "schema_changes='freeze' creates nothing"
        if frozen
        else f"create_extensions names {sorted(allowed) or 'none'}: the copy never creates "
        "an extension it was not told to"
    )
    raise TargetTypeError(
        "target_extension_missing",
        f"Target table {table} needs extension(s) {listed}, which database "
        f"{target.info.dbname!r} does not have ({why}). Nothing was written.",
        actions,
    )


def create_extension(conn: Connection, extension: Extension) -> None:
    """Runs ``CREATE EXTENSION`` (in its schema, created if missing) in ``conn``'s transaction.

    Raises:
        TargetTypeError: ``target_extension_not_permitted`` when the role may not.
    """
    statement = sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(sql.Identifier(extension.name))
    if extension.schema is not None:
        schema = sql.Identifier(extension.schema)
        ensure_schema(conn, extension.schema)
        statement = sql.SQL("{} WITH SCHEMA {}").format(statement, schema)
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise TargetTypeError(
            "target_extension_not_permitted",
            f"create_extensions names {extension.name}, but role {conn.info.user!r} may not "
            f"create it in database {conn.info.dbname!r} ({str(exc).strip()}). Nothing was "
            "written.",
            [
                f"Run, as a role allowed to (a superuser, for an extension that is not "
                f"trusted): {extension.command()}",
                "Or give the copy a target role that may create it.",
            ],
        ) from None


def _quoted(name: str) -> str:
    """``name`` as SQL text spells it, for a command shown to a person."""
    plain = name.isidentifier() and name.islower() and name.isascii()
    return name if plain else '"' + name.replace('"', '""') + '"'
