"""Against a TLS-only PostgreSQL server the tests start (tests/helpers/tls_server.py).

``sslmode=require`` and ``verify-full`` (trusting the throwaway CA) copy, backfill and stream;
a wrong CA, an absent CA file, a host name the certificate is not issued for and a session
without TLS each fail with ``<side>_tls_failed``, whose next actions name ``sslrootcert`` and
the certificate's host names, and nothing is written.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import psycopg
import pytest
from psycopg import conninfo

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    backfill_asset,
    cursor_range_partitions,
    incremental_asset,
    snapshot_copy_assets,
)
from dpone_dagster.dagster.failures import ERROR_CODE_KEY, NEXT_ACTIONS_KEY
from dpone_dagster.postgres.connection import SESSION_ERRORS
from dpone_dagster.postgres.tls import ServerCertificate, server_certificate
from tests.helpers import pg
from tests.helpers.tls_server import HOST_NAMES, TlsServer

ROWS = 500


@dataclass(frozen=True)
class Pair:
    """A source and a target database on the TLS server (verify-full admin DSNs)."""

    source: str
    target: str


def _with(dsn: str, server: TlsServer, **params: str) -> str:
    """``dsn``'s database on the TLS server with other TLS parameters."""
    dbname = conninfo.conninfo_to_dict(dsn)["dbname"]
    return server.dsn(str(dbname), **params)


@pytest.fixture
def pair(tls_server: TlsServer) -> Iterator[Pair]:
    source = pg.create_database("dpone_tls_src", tls_server.verified())
    target = pg.create_database("dpone_tls_tgt", tls_server.verified())
    pg.execute(source, "CREATE SCHEMA shop")
    pg.execute(
        source,
        "CREATE TABLE shop.orders (id bigint PRIMARY KEY, "
        "updated_at timestamptz NOT NULL DEFAULT now(), note text)",
    )
    pg.execute(source, "CREATE INDEX ON shop.orders (updated_at)")
    pg.execute(
        source,
        "INSERT INTO shop.orders (id, note) SELECT g, md5(g::text) FROM generate_series(1, %s) g",
        (ROWS,),
    )
    try:
        yield Pair(source, target)
    finally:
        pg.drop_database(source)
        pg.drop_database(target)


MODES = {
    "require": lambda s: {"sslmode": "require"},
    "verify-full": lambda s: {"sslmode": "verify-full", "sslrootcert": str(s.ca_file)},
}
FAULTS = {
    "wrong_ca": lambda s: {"sslmode": "verify-full", "sslrootcert": str(s.wrong_ca_file)},
    "absent_ca": lambda s: {"sslmode": "verify-full", "sslrootcert": str(s.folder / "none.crt")},
    "host_mismatch": lambda s: {
        "sslmode": "verify-full",
        "sslrootcert": str(s.ca_file),
        "host": "db.wrong.example",
        "hostaddr": "127.0.0.1",
    },
    "no_tls": lambda s: {"sslmode": "disable"},
}


def _assets() -> dict[str, tuple[dg.AssetsDefinition, str | None]]:
    return {
        "copy": (snapshot_copy_assets(["shop.orders"]), None),
        "backfill": (
            backfill_asset(
                "shop.orders", cursor="id", partitions_def=cursor_range_partitions(0, ROWS, ROWS)
            ),
            f"0..{ROWS}",
        ),
        "stream": (incremental_asset("shop.orders", cursor="updated_at"), None),
    }


def _run(kind: str, source: str, target: str) -> dg.ExecuteInProcessResult:
    asset, partition = _assets()[kind]
    return dg.materialize(
        [asset],
        partition_key=partition,
        resources={
            "source": PostgresSourceResource(dsn=source),
            "target": PostgresTargetResource(dsn=target),
            "ledger": LedgerResource(),
        },
        raise_on_error=False,
    )


def _failure(result: dg.ExecuteInProcessResult) -> tuple[str, str]:
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data.user_failure_data
            assert data is not None, event.step_failure_data.error
            code, actions = data.metadata[ERROR_CODE_KEY], data.metadata[NEXT_ACTIONS_KEY]
            return str(getattr(code, "value", code)), str(getattr(actions, "value", actions))
    raise AssertionError("no step failed")


@pytest.mark.parametrize("kind", ["copy", "backfill", "stream"])
@pytest.mark.parametrize("mode", list(MODES))
def test_copy_backfill_and_stream_work_over_tls(
    tls_server: TlsServer, pair: Pair, kind: str, mode: str
) -> None:
    params = MODES[mode](tls_server)
    result = _run(
        kind, _with(pair.source, tls_server, **params), _with(pair.target, tls_server, **params)
    )
    assert result.success
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM shop.orders") == ROWS
    assert (
        pg.fetch_one(
            pair.target,
            "SELECT count(*) FROM (SELECT id, note FROM shop.orders EXCEPT "
            "SELECT g, md5(g::text) FROM generate_series(1, %s) g) d",
            (ROWS,),
        )
        == 0
    )


def test_the_server_refuses_every_session_without_tls(tls_server: TlsServer) -> None:
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        pg.fetch_one(tls_server.dsn(sslmode="disable"), "SELECT 1")
    assert pg.fetch_one(
        tls_server.verified(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    )


@pytest.mark.parametrize("kind", ["copy", "backfill", "stream"])
@pytest.mark.parametrize("side", ["source", "target"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_tls_failure_is_side_tls_failed_naming_sslrootcert_and_the_host_names(
    tls_server: TlsServer, pair: Pair, kind: str, side: str, fault: str
) -> None:
    good = MODES["verify-full"](tls_server)
    bad = FAULTS[fault](tls_server)
    source = _with(pair.source, tls_server, **(bad if side == "source" else good))
    target = _with(pair.target, tls_server, **(bad if side == "target" else good))
    result = _run(kind, source, target)
    code, actions = _failure(result)
    assert code == f"{side}_tls_failed" and code in SESSION_ERRORS
    assert "sslrootcert" in actions and "sslmode" in actions
    # The certificate's host names and issuer, as the server presented them.
    assert f"{', '.join(HOST_NAMES)} (issued by CN=dpone test ca)" in actions
    assert not pg.table_exists(pair.target, "shop", "orders")
    assert not pg.staging_tables(pair.target)


def test_the_server_certificate_is_read_without_logging_in(tls_server: TlsServer) -> None:
    certificate = server_certificate("127.0.0.1", tls_server.port, 5)
    assert certificate == ServerCertificate(HOST_NAMES, "CN=dpone test ca")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        assert server_certificate("127.0.0.1", closed.getsockname()[1], 2) is None


def test_a_ledger_elsewhere_that_fails_tls_is_ledger_tls_failed(
    tls_server: TlsServer, pair: Pair
) -> None:
    good = MODES["verify-full"](tls_server)
    asset, partition = _assets()["backfill"]
    ledger = tls_server.dsn("postgres", **FAULTS["wrong_ca"](tls_server))
    result = dg.materialize(
        [asset],
        partition_key=partition,
        resources={
            "source": PostgresSourceResource(dsn=_with(pair.source, tls_server, **good)),
            "target": PostgresTargetResource(dsn=_with(pair.target, tls_server, **good)),
            "ledger": LedgerResource(dsn=ledger),
        },
        raise_on_error=False,
    )
    code, actions = _failure(result)
    assert code == "ledger_tls_failed"
    assert "sslrootcert" in actions and "CN=dpone test ca" in actions
    if pg.table_exists(pair.target, "shop", "orders"):
        assert pg.fetch_one(pair.target, "SELECT count(*) FROM shop.orders") == 0


def test_a_dsn_that_requires_tls_of_a_server_without_it_is_side_tls_failed(
    tls_server: TlsServer, plain_server: TlsServer, pair: Pair
) -> None:
    target = plain_server.dsn("postgres", sslmode="require")
    result = _run(
        "copy", _with(pair.source, tls_server, **MODES["verify-full"](tls_server)), target
    )
    code, actions = _failure(result)
    assert code == "target_tls_failed"
    assert actions.startswith("- Check sslmode") and "the server presented none" in actions
    assert not pg.table_exists(plain_server.dsn("postgres"), "shop", "orders")
