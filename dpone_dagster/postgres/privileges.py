"""The privileges a copy needs, checked when it is planned: a role that lacks one is refused
with ``<side>_permission_denied`` naming the privilege, the object and the ``GRANT`` to run,
before anything is read or written.

The catalog (``has_table_privilege``, ``has_schema_privilege``, ``pg_has_role`` on the owner,
all by OID: no name is resolved, so a schema the role may not use is reported, not raised) is
read on the session that will do the work. What each feature needs is the privileges
table (docs/production.md, ``Privileges``); a privilege missed here still surfaces with its
code when PostgreSQL refuses the statement (:func:`.failures.database_error`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .connection import Connection
from .failures import DATABASE_ERRORS, DatabaseError, FailureSide
from .identifiers import TableName, quote_identifier

_TABLE = """
SELECT has_schema_privilege(n.oid, 'USAGE'),
       pg_has_role(c.relowner, 'USAGE'),
       array(SELECT p FROM unnest(%s::text[]) AS p
             WHERE NOT has_table_privilege(c.oid, p)
               AND NOT (p = 'SELECT' AND NOT EXISTS (  -- every column granted one by one
                   SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
                   AND NOT a.attisdropped AND NOT has_column_privilege(c.oid, a.attnum, p))))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_SCHEMA = """
SELECT n.oid IS NOT NULL, coalesce(has_schema_privilege(n.oid, 'USAGE'), false),
       coalesce(has_schema_privilege(n.oid, 'CREATE'), false),
       has_database_privilege(current_database(), 'CREATE')
FROM (SELECT 1) AS one LEFT JOIN pg_namespace n ON n.nspname = %s
"""


def require_table(
    conn: Connection,
    side: FailureSide,
    table: TableName,
    privileges: Sequence[str],
    *,
    owner: bool = False,
) -> None:
    """Refuses a role that may not use ``table``'s schema or lacks ``privileges`` on it (or,
    with ``owner``, its ownership: ``DROP``, ``ALTER`` need it). A missing table passes (the
    catalog reports it).

    Raises:
        DatabaseError: ``<side>_permission_denied``.
    """
    row = conn.execute(_TABLE, (list(privileges), table.schema, table.name)).fetchone()
    if row is None:
        return
    usage, owns, missing = bool(row[0]), bool(row[1]), [str(p) for p in row[2]]
    role = _role(conn)
    lacks, commands = [], []
    if not usage:
        lacks.append(f"USAGE on schema {quote_identifier(table.schema)}")
        commands.append(f"GRANT USAGE ON SCHEMA {quote_identifier(table.schema)} TO {role};")
    if missing:
        lacks.append(f"{', '.join(missing)} on table {table}")
        commands.append(f"GRANT {', '.join(missing)} ON TABLE {table} TO {role};")
    if owner and not owns:
        lacks.append(f"ownership of table {table} (to swap or alter it)")
        commands.append(f"ALTER TABLE {table} OWNER TO {role};")
    if lacks:
        raise _refused(conn, side, lacks, commands)


def require_schema(conn: Connection, side: FailureSide, schema: str) -> None:
    """Refuses a role that may not create tables in ``schema`` (``USAGE, CREATE``; the
    database's ``CREATE`` when the schema does not exist yet, and only then).

    Raises:
        DatabaseError: ``<side>_permission_denied``.
    """
    row = conn.execute(_SCHEMA, (schema,)).fetchone()
    assert row is not None
    exists, usage, create, create_schema = (bool(v) for v in row)
    role, name = _role(conn), quote_identifier(schema)
    if not exists and not create_schema:
        database = quote_identifier(str(conn.info.dbname))
        lacks = [f"CREATE on database {database} (schema {name} does not exist)"]
        commands = [
            f"CREATE SCHEMA {name}; GRANT USAGE, CREATE ON SCHEMA {name} TO {role};",
            f"(or GRANT CREATE ON DATABASE {database} TO {role};)",
        ]
        raise _refused(conn, side, lacks, commands)
    missing = [p for p, held in (("USAGE", usage), ("CREATE", create)) if exists and not held]
    if missing:
        privileges = ", ".join(missing)
        raise _refused(
            conn, side, [f"{privileges} on schema {name}"],
            [f"GRANT {privileges} ON SCHEMA {name} TO {role};"],
        )  # fmt: skip


def _role(conn: Connection) -> str:
    return quote_identifier(str(conn.info.user))


def _refused(
    conn: Connection, side: FailureSide, lacks: Sequence[str], commands: Sequence[str]
) -> DatabaseError:
    database = conn.info.dbname
    return DatabaseError.from_catalog(
        DATABASE_ERRORS,
        f"{side}_permission_denied",
        f"Role {conn.info.user!r} lacks {' and '.join(lacks)} in the {side} database "
        f"{database!r}. Nothing was read or written.",
        [
            f"Run in the {side} database {database!r}, as the owner: {' '.join(commands)}",
            "The privileges table (docs/production.md, Privileges) lists what each feature needs "
            "on the source, the target and the ledger.",
        ],
    )
