"""What the PostgreSQL resources share: the DSN and its options, and the step's sessions.

A resource's literal ``dsn`` is checked when the definitions load. An ``EnvVar``'s value is
checked when the variable is set at load time, where a malformed one is one line
(:class:`InvalidDsnWarning`: the code, the message and the next action) and the definitions still
load; a run that uses the resource then fails when it starts with a :class:`DponeFailure` whose
first line says the same, never a traceback through pydantic's wrapper.

Every session a resource opens and every artifact it hands out is
tracked for the step; the step's teardown rolls back and closes what is still open and settles
every artifact left without a terminal outcome (``abort``), so a failed or interrupted step never
leaves a source transaction open.
"""

from __future__ import annotations

import threading
import uuid
import warnings
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from dpone_dagster.lifecycle import DponeError, ExtractionArtifact
from dpone_dagster.postgres import ConnectionOptions, SnapshotSession, check_dsn
from dpone_dagster.postgres.connection import Connection, Side, connect

from ..failures import DponeFailure, headline
from .secrets import SecretResource, at_run_time, user_level, warn_if_literal


class InvalidDsnWarning(UserWarning):
    """An ``EnvVar`` DSN is malformed when the definitions load: one line saying which variable,
    the code, the message and the next action; a run that uses the resource fails until it is
    fixed."""


@runtime_checkable
class Closeable(Protocol):
    """Something that settles what it owns and closes its sessions when closed."""

    def close(self) -> None:
        """Settles undecided artifacts (abort) and closes every session."""


_T = TypeVar("_T", bound="ExtractionArtifact | Closeable | SnapshotSession")
_H = TypeVar("_H")


def checked_dsn(value: Any, owner: str) -> Any:
    """Checks a DSN's shape now, or an EnvVar's value when it is set at load time.

    A literal DSN that holds a password warns (:class:`~.secrets.LiteralSecretWarning`):
    Dagster would store it in its run storage.

    Args:
        value: The ``dsn`` given to the resource: a string or an ``EnvVar``.
        owner: The resource class, for the messages.

    Warns:
        InvalidDsnWarning: an ``EnvVar`` set to a malformed DSN when the definitions load.

    Raises:
        ValueError: ``dsn_invalid`` for a literal DSN, naming the field, never the password.
        DponeFailure: ``dsn_invalid`` when a run starts with an ``EnvVar`` resolved to a
            malformed DSN (a :class:`dagster.Failure`, which pydantic does not wrap).
    """
    if isinstance(value, dg.EnvVar):
        resolved = value.get_value()
        if resolved is not None and not at_run_time():  # at run time: the resolved value's turn
            try:
                check_dsn(resolved)
            except DponeError as exc:
                where = f"environment variable {value.env_var_name}"
                warnings.warn(
                    f"{owner}: {where}: {headline(exc)} (a run that uses it fails until then)",
                    InvalidDsnWarning,
                    stacklevel=user_level(),
                )
        return value
    if isinstance(value, str) and at_run_time():
        try:  # an EnvVar's value, resolved by Dagster when the run starts
            check_dsn(value)
        except DponeError as exc:
            raise DponeFailure(exc) from None
    elif isinstance(value, str):
        params = _check_shape(value, "dsn")
        warn_if_literal(owner, "dsn", value, holds_secret=bool(params.get("password")))
    return value


def _check_shape(dsn: str, where: str) -> dict[str, str]:
    try:
        return check_dsn(dsn)
    except DponeError as exc:
        raise ValueError(f"{where}: {exc}") from None


class PostgresResource(SecretResource):
    """Connection settings and session tracking shared by the source and the target."""

    dsn: str = Field(
        description="libpq DSN, e.g. postgresql://user@host:5432/db (use EnvVar).", repr=False
    )
    application_name: str = Field(
        default="dpone-dagster", description="Shown in pg_stat_activity for every dpone session."
    )
    connect_timeout: int = Field(default=10, ge=1, description="Seconds to wait for the server.")
    statement_timeout_ms: int = Field(
        default=0, ge=0, description="Server-side statement timeout in milliseconds; 0 = none."
    )
    lock_wait: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Seconds a statement needing a strong lock on a target table users read (the "
            "replace swap, schema evolution) keeps trying, in attempts of 1 s that never queue "
            "readers for longer, before target_lock_timeout; a replication run waits as long "
            "for its slot while another session holds it, before replication_slot_active."
        ),
    )

    _side: ClassVar[Side] = "source"
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _sessions: list[Connection] = PrivateAttr(default_factory=list)
    _artifacts: list[ExtractionArtifact | Closeable | SnapshotSession] = PrivateAttr(
        default_factory=list
    )
    _held: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("dsn", mode="before")
    @classmethod
    def _dsn_shape(cls, value: Any) -> Any:
        return checked_dsn(value, cls.__name__)

    @property
    def options(self) -> ConnectionOptions:
        """The connection options every session of this resource uses."""
        return ConnectionOptions(
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
            statement_timeout_ms=self.statement_timeout_ms,
            lock_wait=self.lock_wait,
        )

    def connect(self, *, autocommit: bool = False) -> Connection:
        """Opens a session that the step's teardown will close if nobody else does."""
        conn = connect(self.dsn, self.options, side=self._side, autocommit=autocommit)
        with self._lock:
            self._sessions.append(conn)
        return conn

    def track(self, artifact: _T) -> _T:
        """Registers an artifact (or a copy that owns artifacts and sessions).

        Teardown settles an undecided artifact with ``abort``, and closes anything else (a
        :class:`~dpone_dagster.snapshot_copy.SnapshotCopy` settles its own artifacts when closed).
        """
        with self._lock:
            self._artifacts.append(artifact)
        return artifact

    def hold(self, live: _T) -> str:
        """Keeps a live object (a copy with open sessions) for later steps of the same run.

        Live sessions cannot be pickled between steps; the steps pass the returned handle
        instead. The object is tracked: teardown closes it if no step did.

        Returns:
            A handle for :meth:`held`.
        """
        handle = f"dpone-live-{uuid.uuid4().hex}"
        with self._lock:
            self._held[handle] = live
        self.track(live)
        return handle

    def held(self, handle: str, kind: type[_H]) -> _H:
        """The live object a previous step of this run put on hold.

        Raises:
            DponeError: ``live_handle_unknown`` when the handle was made in another process (the
                job must run on the in-process executor) or the object was released.
        """
        with self._lock:
            live = self._held.get(handle)
        if not isinstance(live, kind):
            raise DponeError(
                "live_handle_unknown",
                f"No live {kind.__name__} is held for {handle}: live sessions stay in the process "
                "that opened them.",
                ["Run this job on Dagster's in-process executor (the default of its factory)."],
            )
        return live

    def close_all(self, log: Any | None = None) -> None:
        """Settles undecided artifacts (``abort``) and closes every tracked session."""
        with self._lock:
            artifacts, self._artifacts = self._artifacts, []
            sessions, self._sessions = self._sessions, []
            self._held.clear()
        for artifact in artifacts:
            if isinstance(artifact, SnapshotSession):
                artifact.rollback_and_close()  # idempotent: a no-op once the session ended
            elif not isinstance(artifact, ExtractionArtifact):
                artifact.close()
            elif not artifact.terminal.decided:
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
