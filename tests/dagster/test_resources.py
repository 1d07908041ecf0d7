"""Resources: DSN shape checked at load, sessions and artifacts settled at teardown."""

from __future__ import annotations

import dagster as dg
import pytest

from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.resources.sessions import InvalidDsnWarning
from dpone_dagster.lifecycle import ExtractionArtifact, TerminalOutcome
from dpone_dagster.postgres.session import SourceTransaction
from tests.helpers import pg


def test_a_malformed_dsn_fails_when_the_resource_is_built() -> None:
    with pytest.raises(Exception, match="dsn_invalid"):
        PostgresSourceResource(dsn="host=db port=")
    with pytest.raises(Exception, match="dsn_invalid"):
        PostgresTargetResource(dsn="")
    with pytest.raises(Exception, match="identifier_invalid"):
        LedgerResource(schema_name="x" * 64)


def test_an_env_var_dsn_is_checked_when_set_and_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPONE_BAD_DSN", "postgresql://u:hunter2@host:notaport/db")
    with pytest.warns(InvalidDsnWarning, match="DPONE_BAD_DSN: \\[dsn_invalid\\]") as caught:
        PostgresSourceResource(dsn=dg.EnvVar("DPONE_BAD_DSN"))  # one line; the run fails
    assert "hunter2" not in str(caught[0].message)
    monkeypatch.delenv("DPONE_BAD_DSN")
    PostgresSourceResource(dsn=dg.EnvVar("DPONE_BAD_DSN"))  # unset at load: checked at run time


def test_the_ledger_defaults_to_the_target_database() -> None:
    target = PostgresTargetResource(dsn="postgresql://postgres@127.0.0.1/t")
    ledger = LedgerResource()
    assert ledger.ledger_dsn(target) == target.dsn and ledger.in_target(target)
    assert ledger.schema_name == "dpone_ledger"
    elsewhere = LedgerResource(dsn="postgresql://postgres@127.0.0.1/ledger")
    assert not elsewhere.in_target(target)
    assert elsewhere.config(target).dsn == elsewhere.dsn == elsewhere.ledger_dsn(target)
    assert ledger.config(target).dsn is None


def test_a_ledger_dsn_naming_the_target_database_is_the_default_ledger() -> None:
    target = PostgresTargetResource(dsn="postgresql://loader@127.0.0.1/t")
    for dsn in (target.dsn, "host=127.0.0.1 port=5432 dbname=t user=admin application_name=x"):
        ledger = LedgerResource(dsn=dsn)
        assert ledger.in_target(target) and ledger.ledger_dsn(target) == target.dsn
        assert ledger.config(target).dsn is None  # the engines write it in the target's session
        assert ledger.config(target).schema == "dpone_ledger"


def test_teardown_closes_sessions_and_settles_undecided_artifacts(source_dsn: str) -> None:
    """A step that dies with an open source transaction still ends with it rolled back."""
    app = "dpone-test-teardown"
    seen: dict[str, object] = {}

    @dg.asset
    def leaky(source: PostgresSourceResource) -> None:
        conn = source.connect()
        conn.execute("SELECT 1")
        artifact = source.track(ExtractionArtifact())
        artifact.attach_source(SourceTransaction(source.connect()))
        seen["artifact"] = artifact
        seen["open"] = len(pg.open_transactions(source_dsn, app))
        raise RuntimeError("the step fails with everything open")

    result = dg.materialize(
        [leaky],
        resources={"source": PostgresSourceResource(dsn=source_dsn, application_name=app)},
        raise_on_error=False,
    )
    assert not result.success
    assert seen["open"] == 1
    artifact = seen["artifact"]
    assert isinstance(artifact, ExtractionArtifact)
    assert artifact.terminal_receipt is not None
    assert artifact.terminal_receipt.outcome is TerminalOutcome.ABORT
    assert not pg.open_transactions(source_dsn, app)
    assert not pg.backends(source_dsn, app)


def test_the_source_resource_exports_and_imports_one_snapshot(source_dsn: str) -> None:
    """Sessions opened through the resource share one snapshot and are closed at teardown."""
    app = "dpone-test-snapshots"
    pg.execute(source_dsn, "CREATE TABLE t (n int)")
    pg.execute(source_dsn, "INSERT INTO t VALUES (1)")
    seen: dict[str, object] = {}

    @dg.asset
    def reads(source: PostgresSourceResource) -> None:
        coordinator = source.open_snapshot(export=True)
        pg.execute(source_dsn, "INSERT INTO t VALUES (2)")  # committed after the export
        worker = source.import_snapshot(coordinator.evidence.token)
        seen["pids"] = {coordinator.backend_pid, worker.backend_pid}
        seen["counts"] = [
            s.conn.execute("SELECT count(*) FROM t").fetchone() for s in (coordinator, worker)
        ]
        seen["open"] = len(pg.open_transactions(source_dsn, app))

    assert dg.materialize(
        [reads], resources={"source": PostgresSourceResource(dsn=source_dsn, application_name=app)}
    ).success
    assert len(seen["pids"]) == 2  # type: ignore[arg-type]
    assert seen["counts"] == [(1,), (1,)], "both sessions read the exported snapshot"
    assert seen["open"] == 2
    assert not pg.backends(source_dsn, app), "teardown closed both sessions"
