"""No password in an error, event, tag, metadata value, log line or Dagster's storage.

Every entry point that takes a secret (snapshot-copy assets, backfill asset, incremental asset,
the component, MySQL/MariaDB and REST copy assets) runs to success and to failure in a persistent
``DAGSTER_HOME`` (sqlite storage), with every secret given through ``dg.EnvVar``
(``tests/helpers/secret_runs.py``, in a subprocess whose stdout and stderr are captured). Then
the password is searched in that output, in every file under ``DAGSTER_HOME`` (every sqlite
value too, zlib-decompressed where it is compressed, as the job snapshots in ``runs.db`` are)
and in every row of the target database and its ledger: it is nowhere. A literal secret warns
at definition time (and is found in Dagster's storage, which is why); a DSN refused at
definition time is never echoed, by pydantic (``input_value=...``) or by dpone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster.components.testing import create_defs_folder_sandbox
from psycopg import conninfo

from dpone_dagster import (
    KafkaSourceResource,
    LedgerResource,
    MySQLSourceResource,
    PostgresCopyComponent,
    PostgresSourceResource,
    PostgresTargetResource,
    RestSourceResource,
    snapshot_copy_assets,
)
from dpone_dagster.dagster.components.postgres_copy.attributes import PostgresResourceModel
from dpone_dagster.dagster.resources.secrets import LiteralSecretWarning
from dpone_dagster.dagster.resources.sessions import InvalidDsnWarning
from dpone_dagster.sources import MySQLSettings, quote_mysql_identifier
from tests.helpers import mysql, pg
from tests.helpers.http_api import ApiServer, Reply, Request
from tests.helpers.secret_runs import ROWS

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = f"Dp0neS3cretQ7x{uuid.uuid4().hex[:8]}"
TOKEN = f"Dp0neT0kenZ9w{uuid.uuid4().hex[:8]}"


def _values(raw: Any) -> Iterator[bytes]:
    """A sqlite value as bytes, and decompressed too when it is zlib data."""
    if raw is None:
        return
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    yield data
    if isinstance(raw, bytes):
        with contextlib.suppress(zlib.error):
            yield zlib.decompress(raw)


def storage_texts(home: Path) -> Iterator[tuple[str, bytes]]:
    """Every file under ``home`` (raw), and every value of every sqlite table in it."""
    for path in sorted(home.rglob("*")):
        if not path.is_file():
            continue
        yield str(path), path.read_bytes()
        if path.suffix != ".db":
            continue
        with sqlite3.connect(path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for table in tables:
                for row in db.execute(f'SELECT * FROM "{table}"'):  # sqlite's own names
                    for value in row:
                        for data in _values(value):
                            yield f"{path}:{table}", data


def where_found(secret: str, home: Path) -> list[str]:
    """The files and sqlite tables under ``home`` that hold ``secret``."""
    return sorted({where for where, data in storage_texts(home) if secret.encode() in data})


def database_rows(dsn: str) -> list[str]:
    """Every row of every table of ``dsn``'s database (the ledger schema included), as text."""
    tables = pg.fetch_all(
        dsn,
        "SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables "
        "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    )
    rows: list[str] = []
    for (name,) in tables:
        rows += [str(r[0]) for r in pg.fetch_all(dsn, f"SELECT t::text FROM {name} t")]
    return rows


def with_password(dsn: str) -> str:
    return conninfo.make_conninfo(dsn, password=PASSWORD)


@pytest.fixture
def mysql_source() -> Iterator[MySQLSettings]:
    """A MariaDB database with table ``items`` and a user whose password is :data:`PASSWORD`."""
    problem = mysql.server_problem()
    assert problem is None, problem
    settings = mysql.create_database("dpone_secret")
    user = f"dpone_s_{uuid.uuid4().hex[:8]}"
    db = quote_mysql_identifier(settings.database)
    mysql.execute(
        settings,
        "CREATE TABLE items (id int PRIMARY KEY, name varchar(20))",
        "INSERT INTO items VALUES (1, 'a'), (2, 'b')",
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{PASSWORD}'",
        f"CREATE USER '{user}'@'localhost' IDENTIFIED BY '{PASSWORD}'",
        f"GRANT SELECT ON {db}.* TO '{user}'@'%'",
        f"GRANT SELECT ON {db}.* TO '{user}'@'localhost'",
    )
    try:
        yield MySQLSettings(
            host=settings.host, port=settings.port, user=user, password=PASSWORD,
            database=settings.database,
        )  # fmt: skip
    finally:
        mysql.execute(settings, f"DROP USER '{user}'@'%'", f"DROP USER '{user}'@'localhost'")
        mysql.drop_database(settings)


def _api(request: Request) -> Reply:
    if request.headers.get("Authorization") != f"Bearer {TOKEN}":
        return Reply({"error": "unauthorized"}, status=401)
    if request.path == "/items":
        return Reply([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    return Reply({"error": "boom"}, status=500)


@pytest.fixture
def shop(source_dsn: str) -> str:
    pg.execute(source_dsn, "CREATE SCHEMA shop")
    pg.execute(
        source_dsn,
        "CREATE TABLE shop.orders (id bigint PRIMARY KEY, "
        "updated_at timestamptz NOT NULL DEFAULT now(), note text)",
    )
    pg.execute(source_dsn, "CREATE INDEX ON shop.orders (updated_at)")
    pg.execute(
        source_dsn,
        "INSERT INTO shop.orders (id, note) SELECT g, md5(g::text) FROM generate_series(1, %s) g",
        (ROWS,),
    )
    return source_dsn


@pytest.fixture
def down() -> Iterator[str]:
    """A DSN (with the password) whose port is bound but never listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        yield f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/nowhere?connect_timeout=3"


EXPECTED = {
    "copy": None,
    "copy_target_down": "target_unreachable",
    "copy_table_missing": "*",
    "copy_dsn_refused_at_run_time": "failed",
    "backfill": None,
    "backfill_source_refused": "source_login_failed",
    "stream": None,
    "stream_target_down": "target_unreachable",
    "mysql": None,
    "mysql_wrong_password": "source_login_failed",
    "rest": None,
    "rest_failing": "*",
    "component": None,
    "component_target_down": "target_unreachable",
}
"""Each run of secret_runs.py: None for a success, else its failure's code (``*``: any code;
``failed``: a failure, coded or not: a resource refused when the run starts fails in Dagster)."""


def test_no_entry_point_leaks_a_secret_given_through_env_var(
    shop: str,
    target_dsn: str,
    down: str,
    mysql_source: MySQLSettings,
    tmp_path: Path,
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    refused = conninfo.make_conninfo(shop, user="dpone_no_such_role", password=PASSWORD)
    with ApiServer(_api) as api:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "DPONE_SECRET_SOURCE_DSN": with_password(shop),
            "DPONE_SECRET_TARGET_DSN": with_password(target_dsn),
            "DPONE_SECRET_DOWN_DSN": down,
            "DPONE_SECRET_REFUSED_DSN": refused,
            "DPONE_SECRET_MYSQL_HOST": mysql_source.host,
            "DPONE_SECRET_MYSQL_PORT": str(mysql_source.port),
            "DPONE_SECRET_MYSQL_USER": mysql_source.user,
            "DPONE_SECRET_MYSQL_DATABASE": mysql_source.database,
            "DPONE_SECRET_MYSQL_PASSWORD": PASSWORD,
            "DPONE_SECRET_MYSQL_WRONG_PASSWORD": PASSWORD + "-wrong",
            "DPONE_SECRET_API_URL": api.url,
            "DPONE_SECRET_API_TOKEN": TOKEN,
            "DPONE_SECRET_LATE_DSN": f"postgresql://postgres:{PASSWORD}@127.0.0.1:99999/x",
        }
        done = subprocess.run(
            [sys.executable, "-W", f"error::{LiteralSecretWarning.__module__}.LiteralSecretWarning",
             "-m", "tests.helpers.secret_runs"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    outcomes = {name: (ok, code) for name, ok, code in json.loads(done.stdout.splitlines()[-1])}
    for name, expected in EXPECTED.items():
        ok, code = outcomes[name]
        if expected is None:
            assert ok, (name, code)
        else:
            assert not ok, (name, code)
            if expected != "failed":
                assert code not in (None, "no code"), (name, code)
                assert expected == "*" or code == expected, (name, code)
    # The search reads what Dagster stored: every run, and the job snapshots decompressed.
    texts = list(storage_texts(home))
    assert any(b"DPONE_SECRET_SOURCE_DSN" in data for where, data in texts if "snapshots" in where)
    assert any(b"target_unreachable" in data for _, data in texts)
    assert any(b"dsn_invalid" in data for _, data in texts)
    assert any("compute_logs" in where and where.endswith(".err") for where, _ in texts)
    for secret in (PASSWORD, TOKEN):
        assert secret not in done.stdout and secret not in done.stderr
        assert where_found(secret, home) == []
        assert not [row for row in database_rows(target_dsn) if secret in row]
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.backfill_runs") == 1


def test_a_literal_secret_warns_at_definition_time_and_dagster_stores_it(
    shop: str, target_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    literal = with_password(target_dsn)
    makers: list[Callable[[], object]] = [
        lambda: PostgresSourceResource(dsn=with_password(shop)),
        lambda: PostgresTargetResource(dsn=literal),
        lambda: LedgerResource(dsn=literal),
        lambda: MySQLSourceResource(user="u", password=PASSWORD, database="d"),
        lambda: RestSourceResource(base_url="http://127.0.0.1:1", bearer_token=PASSWORD),
        lambda: KafkaSourceResource(bootstrap_servers="127.0.0.1:1", sasl_password=PASSWORD),
    ]
    for make in makers:
        with pytest.warns(LiteralSecretWarning) as caught:
            make()
        [warning] = [str(w.message) for w in caught if w.category is LiteralSecretWarning]
        assert "dg.EnvVar" in warning and "runs.db" in warning and PASSWORD not in warning
    with pytest.warns(LiteralSecretWarning) as caught:
        PostgresSourceResource(dsn=with_password(shop))
    assert "passfile" in str(caught[0].message) and "PGPASSWORD" in str(caught[0].message)
    assert caught[0].filename == __file__  # the line that defined the resource
    # Why it warns: Dagster keeps the literal in the job snapshot of its run storage.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with pytest.warns(LiteralSecretWarning):
        resources = {
            "source": PostgresSourceResource(dsn=with_password(shop)),
            "target": PostgresTargetResource(dsn=literal),
        }
    with dg.DagsterInstance.get() as instance:
        result = dg.materialize(
            [snapshot_copy_assets(["shop.orders"])], resources=resources, instance=instance
        )
    assert result.success
    assert any("runs.db:snapshots" in where for where in where_found(PASSWORD, home))


def test_a_secret_through_env_var_never_warns_even_when_a_run_resolves_it(
    shop: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_SECRET_SOURCE_DSN", with_password(shop))
    monkeypatch.setenv("DPONE_SECRET_TARGET_DSN", with_password(target_dsn))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LiteralSecretWarning)
        result = dg.materialize(
            [snapshot_copy_assets(["shop.orders"])],
            resources={
                "source": PostgresSourceResource(dsn=dg.EnvVar("DPONE_SECRET_SOURCE_DSN")),
                "target": PostgresTargetResource(dsn=dg.EnvVar("DPONE_SECRET_TARGET_DSN")),
            },
        )
    assert result.success
    assert PostgresSourceResource(dsn="postgresql://reader@db/shop").dsn  # no password: silent


BAD_PORT = f"postgresql://app:{PASSWORD}@db:99999/shop"


@pytest.mark.parametrize(
    "build",
    [
        lambda: PostgresSourceResource(dsn=BAD_PORT),
        lambda: PostgresTargetResource(dsn=BAD_PORT),
        lambda: LedgerResource(dsn=f"host=db password={PASSWORD} port=0"),
        lambda: PostgresSourceResource(dsn=BAD_PORT.replace("99999", "5432"), connect_timeout=0),
        lambda: MySQLSourceResource(user="u", password=PASSWORD, database="d", port=0),
        lambda: MySQLSourceResource(user="u", password=[PASSWORD], database="d"),
        lambda: RestSourceResource(base_url="http://a", bearer_token=[PASSWORD]),
        lambda: PostgresResourceModel(dsn=BAD_PORT, connect_timeout=[PASSWORD]),
        lambda: KafkaSourceResource(bootstrap_servers="b", sasl_password=[PASSWORD]),
    ],
    ids=[
        "source",
        "target",
        "ledger",
        "other_field",
        "mysql",
        "mysql_type",
        "rest",
        "yaml_model",
        "kafka",
    ],
)
def test_a_value_refused_at_definition_time_is_never_echoed(build: Callable[[], object]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiteralSecretWarning)
        with pytest.raises(Exception) as err:  # noqa: PT011 (pydantic's ValidationError)
            build()
    assert PASSWORD not in str(err.value) and PASSWORD not in repr(err.value)
    assert "input_value" not in str(err.value)


def _load_component(source: dict[str, Any]) -> None:
    contents = {
        "type": "dpone_dagster.PostgresCopyComponent",
        "attributes": {
            "source": source,
            "target": {"dsn": "postgresql://loader@db/warehouse"},
            "snapshot_copies": [{"tables": ["shop.orders"]}],
        },
    }
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=PostgresCopyComponent, defs_yaml_contents=contents
        )
        with sandbox.load_component_and_build_defs(defs_path=path):
            pass


@pytest.mark.parametrize(
    "dsn", ["{{ env.DPONE_SECRET_BAD_DSN }}", "postgresql://app:{{ env.DPONE_SECRET_PW }}@db:0/s"]
)
def test_a_component_dsn_refused_at_load_is_never_echoed(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_SECRET_BAD_DSN", BAD_PORT)
    monkeypatch.setenv("DPONE_SECRET_PW", PASSWORD)
    if dsn == "{{ env.DPONE_SECRET_BAD_DSN }}":  # an EnvVar: one warning line, the run refuses
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _load_component({"dsn": dsn})
        text = " ".join(str(w.message) for w in caught if w.category is InvalidDsnWarning)
    else:  # a literal with the password templated in: refused at load
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LiteralSecretWarning)
            with pytest.raises(Exception) as err:  # noqa: PT011 (Dagster's load error)
                _load_component({"dsn": dsn})
        text = f"{err.value!s} {err.value!r} {err.value.__cause__!s}"
    assert "dsn_invalid" in text
    assert PASSWORD not in text


def test_a_component_with_a_literal_password_in_its_yaml_warns_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPONE_SECRET_PW", PASSWORD)
    for dsn in (
        "postgresql://app:{{ env.DPONE_SECRET_PW }}@db/shop",
        f"host=db password={PASSWORD}",
    ):
        with pytest.warns(LiteralSecretWarning, match="dg.EnvVar"):
            _load_component({"dsn": dsn})
