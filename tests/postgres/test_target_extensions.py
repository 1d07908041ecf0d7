"""Extension types are never created silently: a copy that needs an extension the target lacks
is refused with the extension, its source version and the command to run; it creates the
extension only when told to, with a role allowed to; an extension the target server cannot
install at all is named as such."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from psycopg import conninfo, sql

from dpone_dagster.dagster.metadata.receipts import table_metadata
from dpone_dagster.lifecycle import TerminalOutcome
from dpone_dagster.postgres import TargetTypeError
from dpone_dagster.snapshot_copy import CopyError, copy_tables
from tests.helpers import pg

NOTES = """
CREATE EXTENSION hstore;
CREATE EXTENSION citext;
CREATE DOMAIN public.email AS citext CHECK (position('@' in VALUE) > 0);
CREATE TYPE public.tagged AS (tags hstore, owner public.email);
CREATE TABLE public.notes (
    id int PRIMARY KEY, attrs hstore, names citext[], contact public.email, card public.tagged
);
INSERT INTO public.notes VALUES
 (1, 'a=>1, "b c"=>NULL', '{Ann,BOB}', 'Ann@Example.org', ROW('x=>y', 'z@q')),
 (2, NULL, NULL, NULL, NULL);
"""


def _version(dsn: str, name: str, column: str = "extversion") -> str:
    table = "pg_extension" if column == "extversion" else "pg_available_extensions"
    key = "extname" if column == "extversion" else "name"
    query = sql.SQL("SELECT {} FROM {} WHERE {} = %s").format(
        sql.Identifier(column), sql.Identifier(table), sql.Identifier(key)
    )
    return str(pg.fetch_one(dsn, query, (name,)))


def _installed(dsn: str) -> list[str]:
    rows = pg.fetch_all(dsn, "SELECT extname FROM pg_extension WHERE extname <> 'plpgsql'")
    return sorted(str(r[0]) for r in rows)


@pytest.mark.cross_server
@pytest.mark.parametrize("allowed", [[], ["hstore"]])
def test_an_extension_the_target_lacks_is_refused_naming_its_version_and_command(
    source_dsn: str, target_dsn: str, allowed: list[str]
) -> None:
    pg.execute(source_dsn, NOTES)
    with pytest.raises(TargetTypeError) as caught:
        copy_tables(source_dsn, target_dsn, ["public.notes"], create_extensions=allowed)
    error = caught.value
    assert error.code == "target_extension_missing"
    for name in ("citext", "hstore"):
        source, offered = _version(source_dsn, name), _version(target_dsn, name, "default_version")
        assert f"{name} ({source} on the source; the target server offers {offered})" in (
            error.message
        )
    assert "Nothing was written" in error.message
    assert error.next_actions[0] == (
        "Run, as a role allowed to: CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA public; "
        "CREATE EXTENSION IF NOT EXISTS hstore WITH SCHEMA public;"
    )
    assert "create_extensions=['citext', 'hstore']" in error.next_actions[1]
    assert _installed(target_dsn) == [], "nothing created, not even an allowed one"
    assert not pg.table_exists(target_dsn, "public", "notes")


@pytest.mark.cross_server
def test_create_extensions_lets_the_copy_create_the_named_extensions_with_the_table(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, NOTES)
    report = copy_tables(
        source_dsn, target_dsn, ["public.notes"], create_extensions=["hstore", "citext"]
    )
    assert report.outcome is TerminalOutcome.SUCCESS
    assert _installed(target_dsn) == ["citext", "hstore"]
    assert pg.table_fingerprint(target_dsn, "public", "notes") == pg.table_fingerprint(
        source_dsn, "public", "notes"
    )
    created = report.tables[0].target_types
    assert [(e.name, e.version, e.source_version) for e in created.extensions] == [
        (name, _version(target_dsn, name), _version(source_dsn, name))
        for name in ("citext", "hstore")
    ]
    assert [t.qualified for t in created.types] == ["public.email", "public.tagged"]
    metadata = table_metadata(report, report.tables[0])
    assert [e["extension"] for e in metadata["dpone/extensions_created"].data] == [
        "citext",
        "hstore",
    ]
    assert metadata["dpone/types_created"].data[1] == {
        "type": "public.tagged",
        "kind": "composite",
        "definition": "composite (tags public.hstore, owner public.email)",
    }
    same_transaction = (
        "SELECT count(DISTINCT xmin::text) FROM (SELECT xmin FROM pg_extension WHERE extname <> "
        "'plpgsql' UNION ALL SELECT xmin FROM pg_class WHERE oid = 'public.notes'::regclass) x"
    )
    assert pg.fetch_one(target_dsn, same_transaction) == 1
    found = pg.fetch_one(
        target_dsn, "SELECT count(*) FROM public.notes WHERE contact = 'ann@EXAMPLE.org'"
    )
    assert found == 1, "citext compares without case on the target too"


def _available(name: str) -> Callable[[str], bool]:
    def check(server: str) -> bool:
        query = "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = %s)"
        return bool(pg.fetch_one(server, query, (name,)))

    return check


@pytest.mark.cross_server
def test_an_extension_the_target_server_cannot_install_is_named_unavailable(
    make_database: Callable[..., str],
) -> None:
    """pgvector is installable on the embedded PostgreSQL 18 and absent from the machine's
    PostgreSQL 15 (no type-bearing extension is installable on 15 but not on 18, so this runs
    18 -> 15 in both directions of the cross-server set)."""
    source_server = pg.server_where(_available("vector"), "able to install pgvector")
    target_server = pg.server_where(
        lambda s: not _available("vector")(s), "without pgvector", avoid=source_server
    )
    source_dsn = make_database("dpone_src", source_server)
    target_dsn = make_database("dpone_tgt", target_server)
    pg.execute(source_dsn, "CREATE EXTENSION vector")
    pg.execute(source_dsn, "CREATE TABLE public.items (id int PRIMARY KEY, v vector(3))")
    pg.execute(source_dsn, "INSERT INTO public.items VALUES (1, '[1,2,3]')")
    with pytest.raises(TargetTypeError) as caught:
        copy_tables(source_dsn, target_dsn, ["public.items"], create_extensions=["vector"])
    error = caught.value
    assert error.code == "target_extension_unavailable"
    version = pg.server_version(target_dsn)
    assert (
        f"needs extension(s) vector ({_version(source_dsn, 'vector')} on the source), which the "
        f"target server (PostgreSQL {version}) does not have at all: pg_available_extensions "
        "does not list them" in error.message
    )
    assert error.next_actions and _installed(target_dsn) == []
    assert not pg.table_exists(target_dsn, "public", "items")


@pytest.fixture
def creator_role(target_dsn: str) -> Iterator[str]:
    """A login role that may create tables and trusted extensions in the target database (CREATE
    on it and on schema public), not a superuser. Dropped at the end."""
    name = f"dpone_creator_{uuid.uuid4().hex[:10]}"
    role = sql.Identifier(name)
    database = sql.Identifier(str(conninfo.conninfo_to_dict(target_dsn)["dbname"]))
    pg.execute(target_dsn, sql.SQL("CREATE ROLE {} LOGIN").format(role))
    try:
        pg.execute(target_dsn, sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, role))
        pg.execute(target_dsn, sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(role))
        yield name
    finally:
        pg.execute(target_dsn, sql.SQL("DROP OWNED BY {}").format(role))
        pg.execute(target_dsn, sql.SQL("DROP ROLE {}").format(role))


@pytest.mark.cross_server
def test_a_role_that_may_not_create_a_named_extension_is_refused_and_nothing_is_written(
    source_dsn: str, target_dsn: str, creator_role: str
) -> None:
    """earthdistance is not a trusted extension: only a superuser creates it. cube, which it
    requires, is trusted: the role creates it, then the whole load rolls back."""
    pg.execute(source_dsn, "CREATE EXTENSION cube; CREATE EXTENSION earthdistance")
    pg.execute(source_dsn, "CREATE TABLE public.places (id int PRIMARY KEY, at earth)")
    pg.execute(source_dsn, "INSERT INTO public.places VALUES (1, ll_to_earth(48.85, 2.35))")
    as_role = conninfo.make_conninfo(target_dsn, user=creator_role)
    allowed = ["cube", "earthdistance"]
    with pytest.raises(TargetTypeError) as refused:
        copy_tables(source_dsn, as_role, ["public.places"], create_extensions=["earthdistance"])
    assert refused.value.code == "target_extension_missing", "cube, required, was not named"
    assert "cube (which another requires" in refused.value.message
    with pytest.raises(CopyError) as caught:
        copy_tables(source_dsn, as_role, ["public.places"], create_extensions=allowed)
    error = caught.value
    assert error.code == "target_extension_not_permitted"
    assert f"role {creator_role!r} may not create it" in error.message
    assert (
        "CREATE EXTENSION IF NOT EXISTS earthdistance WITH SCHEMA public;"
        in (error.next_actions[0])
    )
    assert error.report is not None and error.report.outcome is TerminalOutcome.ABORT
    assert _installed(target_dsn) == [] and not pg.table_exists(target_dsn, "public", "places")

    report = copy_tables(source_dsn, target_dsn, ["public.places"], create_extensions=allowed)
    assert [e.name for e in report.tables[0].target_types.extensions] == allowed
    assert pg.table_fingerprint(target_dsn, "public", "places") == pg.table_fingerprint(
        source_dsn, "public", "places"
    )
