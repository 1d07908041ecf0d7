"""Dagster resources: the source, the target and the backfill ledger.

Each is a :class:`dagster.ConfigurableResource` with a ``dsn`` (pass secrets as
``EnvVar("DPONE_SOURCE_DSN")``) and the options users expect. A DSN whose shape is wrong fails
when the definitions load (for an ``EnvVar``, when the variable is set at load time). Every
session a resource opens and every artifact it hands out is tracked for the step; the step's
teardown rolls back and closes what is still open and settles every artifact left without a
terminal outcome (``abort``), so a failed or interrupted step never leaves a source transaction
open.
"""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
import psycopg
from pydantic import Field, PrivateAttr, field_validator

from dpone_dagster.lifecycle import DponeError, ExtractionArtifact
from dpone_dagster.postgres import ConnectionOptions, check_dsn, connect
from dpone_dagster.postgres.identifiers import check_identifier

DEFAULT_LEDGER_SCHEMA = "dpone_ledger"


def _checked_dsn(value: Any) -> Any:
    """Checks a DSN's shape now, or an EnvVar's value when it is set at load time."""
    if isinstance(value, dg.EnvVar):
        resolved = value.get_value()
        if resolved is not None:
            _check_shape(resolved, f"environment variable {value.env_var_name}")
        return value
    if isinstance(value, str):
        _check_shape(value, "dsn")
    return value


def _check_shape(dsn: str, where: str) -> None:
    try:
        check_dsn(dsn)
    except DponeError as exc:
        raise ValueError(f"{where}: {exc}") from None


class _PostgresResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Connection settings and session tracking shared by the three resources."""

    dsn: str = Field(description="libpq DSN, e.g. postgresql://user@host:5432/db (use EnvVar).")
    application_name: str = Field(
        default="dpone-dagster", description="Shown in pg_stat_activity for every dpone session."
    )
    connect_timeout: int = Field(default=10, ge=1, description="Seconds to wait for the server.")
    statement_timeout_ms: int = Field(
        default=0, ge=0, description="Server-side statement timeout in milliseconds; 0 = none."
    )

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _sessions: list[psycopg.Connection[tuple[object, ...]]] = PrivateAttr(default_factory=list)
    _artifacts: list[ExtractionArtifact] = PrivateAttr(default_factory=list)

    @field_validator("dsn", mode="before")
    @classmethod
    def _dsn_shape(cls, value: Any) -> Any:
        return _checked_dsn(value)

    @property
    def options(self) -> ConnectionOptions:
        """The connection options every session of this resource uses."""
        return ConnectionOptions(
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
            statement_timeout_ms=self.statement_timeout_ms,
        )

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
        """Opens a session that the step's teardown will close if nobody else does."""
        conn = connect(self.dsn, self.options, autocommit=autocommit)
        with self._lock:
            self._sessions.append(conn)
        return conn

    def track(self, artifact: ExtractionArtifact) -> ExtractionArtifact:
        """Registers an artifact; teardown settles it with ``abort`` if it is still undecided."""
        with self._lock:
            self._artifacts.append(artifact)
        return artifact

    def open_artifacts(self) -> list[ExtractionArtifact]:
        """Tracked artifacts that have no terminal outcome yet."""
        with self._lock:
            return [a for a in self._artifacts if not a.terminal.decided]

    def close_all(self, log: Any | None = None) -> None:
        """Settles undecided artifacts (``abort``) and closes every tracked session."""
        with self._lock:
            artifacts, self._artifacts = self._artifacts, []
            sessions, self._sessions = self._sessions, []
        for artifact in artifacts:
            if not artifact.terminal.decided:
                receipt = artifact.abort()
                if log is not None:
                    log.warning(
                        f"dpone: artifact {receipt.artifact_id} had no terminal outcome at "
                        f"teardown; settled as {receipt.outcome.value}"
                    )
        for conn in sessions:
            if not conn.closed:
                try:
                    if not conn.broken:
                        conn.rollback()
                finally:
                    conn.close()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Closes every session and settles every artifact the step left open."""
        self.close_all(context.log)


class PostgresSourceResource(_PostgresResource):
    """The PostgreSQL database dpone reads from.

    Examples:
        >>> source = PostgresSourceResource(dsn="postgresql://reader@db:5432/shop")
        >>> source.application_name
        'dpone-dagster'
    """


class PostgresTargetResource(_PostgresResource):
    """The PostgreSQL database dpone writes to."""


class BackfillLedgerResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Where backfill runs and batch receipts are kept.

    By default the ledger lives in the target database (``dsn`` unset), in schema
    ``dpone_ledger``: a batch's rows and its receipt then commit in one transaction. A ledger in
    another database is allowed; see the README for the weaker guarantee it gives.
    """

    dsn: str | None = Field(
        default=None, description="Ledger database; the target's database when unset."
    )
    schema_name: str = Field(
        default=DEFAULT_LEDGER_SCHEMA, description="Schema of the ledger tables."
    )

    @field_validator("dsn", mode="before")
    @classmethod
    def _dsn_shape(cls, value: Any) -> Any:
        return None if value is None else _checked_dsn(value)

    @field_validator("schema_name")
    @classmethod
    def _schema(cls, value: str) -> str:
        try:
            return check_identifier(value, what="schema")
        except DponeError as exc:
            raise ValueError(str(exc)) from None

    def ledger_dsn(self, target: PostgresTargetResource) -> str:
        """The ledger's DSN: its own, or the target's."""
        return self.dsn or target.dsn

    def in_target(self, target: PostgresTargetResource) -> bool:
        """True when the ledger shares the target's database (one transaction per batch)."""
        return self.dsn is None or self.dsn == target.dsn
