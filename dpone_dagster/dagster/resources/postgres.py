"""Dagster resources: the source, the target and the backfill ledger.

Each is a :class:`dagster.ConfigurableResource` with a ``dsn`` (pass secrets as
``EnvVar("DPONE_SOURCE_DSN")``) and the options users expect. A DSN whose shape is wrong fails
when the definitions load (for an ``EnvVar``, when the variable is set at load time). Every
session a resource opens and every artifact it hands out is tracked for the step; the step's
teardown rolls back and closes what is still open and settles every artifact left without a
terminal outcome (``abort``), so a failed or interrupted step never leaves a source transaction
open.

The copies themselves are event iterators on the resources, as with dagster-sling's
``replicate``: an asset body writes ``yield from source.copy_tables(context, target)`` or
``yield from ledger.backfill(context, source, target)``, alone or with its own logic around it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import dagster as dg
import psycopg
from pydantic import Field, PrivateAttr, field_validator

from dpone_dagster.backfill import DEFAULT_BATCH_SIZE, OnChanged
from dpone_dagster.lifecycle import DponeError, ExtractionArtifact
from dpone_dagster.postgres import ConnectionOptions, SnapshotSession, check_dsn
from dpone_dagster.postgres.connection import Side, connect
from dpone_dagster.postgres.identifiers import check_identifier
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator

from .backfill import backfill_events
from .incremental import IncrementalEvent, StreamOptions, incremental_events
from .snapshot_copy import CopyEvent, snapshot_copy_events

DEFAULT_LEDGER_SCHEMA = "dpone_ledger"
BackfillEvent = dg.AssetCheckResult | dg.MaterializeResult[Any]


@runtime_checkable
class Closeable(Protocol):
    """Something that settles what it owns and closes its sessions when closed."""

    def close(self) -> None:
        """Settles undecided artifacts (abort) and closes every session."""


_T = TypeVar("_T", bound="ExtractionArtifact | Closeable | SnapshotSession")
_H = TypeVar("_H")


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

    _side: ClassVar[Side] = "source"
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _sessions: list[psycopg.Connection[tuple[object, ...]]] = PrivateAttr(default_factory=list)
    _artifacts: list[ExtractionArtifact | Closeable | SnapshotSession] = PrivateAttr(
        default_factory=list
    )
    _held: dict[str, Any] = PrivateAttr(default_factory=dict)

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
        conn = connect(self.dsn, self.options, side=self._side, autocommit=autocommit)
        with self._lock:
            self._sessions.append(conn)
        return conn

    def track(self, artifact: _T) -> _T:
        """Registers an artifact (or a copy that owns artifacts and sessions).

        Teardown settles an undecided artifact with ``abort``, and closes anything else (a
        :class:`~dpone_dagster.postgres.SnapshotCopy` settles its own artifacts when closed).
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


class PostgresSourceResource(_PostgresResource):
    """The PostgreSQL database dpone reads from.

    Besides the DSN and options, it opens the snapshot sessions the copies are built on:
    :meth:`open_snapshot` (a coordinator, optionally exporting its snapshot) and
    :meth:`import_snapshot` (a worker that reads under an exported snapshot). Every session it
    opens is rolled back and closed at the step's teardown if nobody ended it before.

    Examples:
        >>> source = PostgresSourceResource(dsn="postgresql://reader@db:5432/shop")
        >>> source.application_name
        'dpone-dagster'
    """

    def open_snapshot(self, *, export: bool = False) -> SnapshotSession:
        """Opens a ``REPEATABLE READ READ ONLY`` session with a fixed snapshot.

        Args:
            export: Export the snapshot (``pg_export_snapshot()``) so that other sessions can
                import it with :meth:`import_snapshot`.
        """
        return self.track(SnapshotSession.open(self.dsn, self.options, export=export))

    def import_snapshot(self, token: str) -> SnapshotSession:
        """Opens a session that reads under an exported snapshot (``SET TRANSACTION SNAPSHOT``).

        Raises:
            SnapshotError: ``snapshot_import_failed`` when the token is unknown or its exporting
                transaction has ended.
        """
        return self.track(SnapshotSession.import_snapshot(self.dsn, token, self.options))

    def copy_tables(
        self,
        context: dg.AssetExecutionContext,
        target: PostgresTargetResource,
        *,
        tables: Sequence[str | CopyTableSpec | Mapping[str, Any]] | None = None,
        translator: DponeTranslator | None = None,
        strategy: str = "batched_copy",
        sink: str = "replace",
        workers: int = 4,
        batch_rows: int | None = None,
        schema_changes: str = "evolve",
    ) -> Iterator[CopyEvent]:
        """Copies the selected tables under ONE snapshot; yields each table's materialization,
        then each selected ``dpone_reconciled`` check.

        The tables are the selected assets' (their specs carry ``dpone/source_table`` and
        ``dpone/table``, as :class:`~dpone_dagster.DponeTranslator` writes them), or ``tables``
        keyed by ``translator``. The copy reads under a snapshot this step exports and holds, so
        each check compares the target with the source inside that very snapshot.

        Args:
            context: The asset's execution context.
            target: The target database.
            tables: The tables, when the assets' specs do not name them.
            translator: Maps ``tables`` to asset keys.
            strategy: ``whole_copy``, ``stream_rows``, ``batched_copy``, ``partitioned_copy`` or
                ``internal_query``.
            sink: ``replace``, ``append`` or ``merge``.
            workers: Worker sessions of ``partitioned_copy``.
            batch_rows: Rows per batch of ``batched_copy``.
            schema_changes: ``evolve`` (an existing target takes added columns, widened types
                and keeps dropped columns, in the load's transaction; the materialization lists
                them under ``dpone/schema_changes``) or ``freeze`` (any difference fails with
                ``schema_change_incompatible``).

        Raises:
            DponeFailure: any copy error, with its code, next actions and terminal outcome.

        Examples:
            .. code-block:: python

                @dg.multi_asset(specs=[...], can_subset=True)
                def shop(context, source: PostgresSourceResource, target: PostgresTargetResource):
                    yield from source.copy_tables(context, target, strategy="batched_copy")
        """
        yield from snapshot_copy_events(
            context, self, target, tables=tables, translator=translator, strategy=strategy,
            sink=sink, workers=workers, batch_rows=batch_rows, schema_changes=schema_changes,
        )  # fmt: skip


class PostgresTargetResource(_PostgresResource):
    """The PostgreSQL database dpone writes to."""

    _side: ClassVar[Side] = "target"


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

    def backfill(
        self,
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        reconcile: bool = True,
        on_changed: OnChanged = "fail",
    ) -> Iterator[BackfillEvent]:
        """Backfills each of the run's partitions through this ledger, in partition order.

        The table, target and cursor are the asset spec's (``dpone/source_table``,
        ``dpone/table``, ``dpone/cursor``, as :func:`~dpone_dagster.backfill_asset` writes them);
        each partition is a cursor range and its own durable ledger run. After every committed
        batch an ``AssetObservation`` and the run's progress tags show in the UI; each partition
        ends with its metadata, then the ``dpone_reconciled`` check (when the asset declares it)
        and the materialization are yielded.

        Args:
            context: The partitioned asset's execution context.
            source: The source database.
            target: The target database.
            batch_size: Rows per batch.
            reconcile: Reconcile each partition once it reaches its mark.
            on_changed: ``"fail"`` (default): a row the source changed or deleted after its
                batch was copied fails the partition with ``backfill_record_changed``;
                ``"repair"``: the partition's differing ranges are rewritten from the
                reconciliation's one source snapshot (label ``repaired_to_one_snapshot``).

        Raises:
            DponeFailure: any backfill error, with its code and next actions.
        """
        yield from backfill_events(
            context, self, source, target, batch_size=batch_size, reconcile=reconcile,
            on_changed=on_changed,
        )  # fmt: skip

    def incremental(
        self,
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        options: StreamOptions | None = None,
    ) -> Iterator[IncrementalEvent]:
        """Runs the asset's incremental stream once through this ledger.

        The table, target and cursor are the asset spec's (``dpone/source_table``,
        ``dpone/table``, ``dpone/cursor``, as :func:`~dpone_dagster.incremental_asset` writes
        them). The run continues a run left in progress (a crash, a retry, a concurrent run)
        or copies ``(mark, new mark]``; after every committed batch an ``AssetObservation``
        shows in the UI; then the ``dpone_reconciled`` check (when declared) and the
        materialization with the run's metadata are yielded.

        Args:
            context: The asset's execution context.
            source: The source database.
            target: The target database (the stream's state lives in its ledger schema).
            options: How the stream runs (deletes, batch size, lookback...).

        Raises:
            DponeFailure: any stream error, with its code and next actions.
        """
        yield from incremental_events(context, self, source, target, options or StreamOptions())

    def ledger_dsn(self, target: PostgresTargetResource) -> str:
        """The ledger's DSN: its own, or the target's."""
        return self.dsn or target.dsn

    def in_target(self, target: PostgresTargetResource) -> bool:
        """True when the ledger shares the target's database (one transaction per batch)."""
        return self.dsn is None or self.dsn == target.dsn
