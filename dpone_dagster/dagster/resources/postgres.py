"""The PostgreSQL source and target resources; the source carries the event iterators.

Each is a :class:`dagster.ConfigurableResource` with a ``dsn`` (pass secrets as
``EnvVar("DPONE_SOURCE_DSN")``) and the options users expect; what they share (DSN checks,
session tracking, the teardown that settles what a step left open) is
:class:`~dpone_dagster.dagster.resources.sessions.PostgresResource`'s.

The copies are event iterators on the source, as with dagster-sling's ``replicate``: an asset
body writes ``yield from source.copy_tables(context, target=target)``,
``yield from source.backfill(context, target=target, ledger=ledger)`` or
``yield from source.incremental(context, target=target, ledger=ledger)`` or
``yield from source.replicate(context, target=target, ledger=ledger)``, alone or with its own
logic around it. Each returns an iterator object that holds its inputs; nothing runs until it is
iterated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import dagster as dg
from pydantic import Field, field_validator

from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events.databases import SourceDatabase, TargetDatabase
from dpone_dagster.dagster.events.snapshot_copy import CopyEvents
from dpone_dagster.dagster.failures import dagster_failures
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator
from dpone_dagster.postgres import Sink, SnapshotSession
from dpone_dagster.postgres.connection import Side, connect
from dpone_dagster.snapshot_copy import SnapshotCopyOptions, Strategy

from .ledger import LedgerResource
from .sessions import PostgresResource, checked_dsn

# The other jobs' options and events are imported by the methods that run them: a code location
# that copies tables under a snapshot loads neither the backfill, the stream nor replication.
if TYPE_CHECKING:
    from dpone_dagster.backfill import BackfillOptions
    from dpone_dagster.core.deletes import Deletes
    from dpone_dagster.dagster.events.backfill import BackfillEvents
    from dpone_dagster.dagster.events.incremental import IncrementalEvents
    from dpone_dagster.dagster.events.replication import ReplicationEvents
    from dpone_dagster.incremental import IncrementalOptions
    from dpone_dagster.replication import ReplicationOptions
    from dpone_dagster.replication.slot import Dropped


class PostgresTargetResource(PostgresResource):
    """The PostgreSQL database dpone writes to.

    A table a copy creates here brings the user-defined types its columns need; the extensions
    their types come from are created only when named in ``create_extensions``.
    """

    create_extensions: list[str] = Field(
        default_factory=list,
        description=(
            "Extensions dpone may create in this database (CREATE EXTENSION, in the load's "
            "transaction) when a copied table's types need them and the database lacks them; "
            "any other is refused with target_extension_missing. This resource's role must be "
            "allowed to create them."
        ),
    )

    _side: ClassVar[Side] = "target"

    @property
    def database(self) -> TargetDatabase:
        """This database as a run's events reach it: its DSN, options and the extensions a
        run may create."""
        return TargetDatabase(self.dsn, self.options, tuple(self.create_extensions))


class PostgresSourceResource(PostgresResource):
    """The PostgreSQL database dpone reads from, and the copies read from it.

    Besides the DSN and options, it opens the snapshot sessions the copies are built on:
    :meth:`open_snapshot` (a coordinator, optionally exporting its snapshot) and
    :meth:`import_snapshot` (a worker that reads under an exported snapshot). Every session it
    opens is rolled back and closed at the step's teardown if nobody ended it before. Its event
    iterators, :meth:`copy_tables`, :meth:`backfill`, :meth:`incremental` and :meth:`replicate`,
    are what the asset factories' bodies are; call them from your own assets the same way.
    :meth:`drop_replication` ends a replication group for good.

    Examples:
        >>> source = PostgresSourceResource(dsn="postgresql://reader@db:5432/shop")
        >>> source.application_name
        'dpone-dagster'
    """

    standby_dsn: str | None = Field(
        default=None,
        description=(
            "libpq DSN of the source's physical standby (use EnvVar): each replication run "
            "reads its copy of the group's slot, and dpone_slot_healthy warns when a promotion "
            "of it would not keep the group going (docs/replication.md, Failover)."
        ),
        repr=False,
    )

    @field_validator("standby_dsn", mode="before")
    @classmethod
    def _standby_shape(cls, value: Any) -> Any:
        return None if value is None else checked_dsn(value, cls.__name__)

    @property
    def database(self) -> SourceDatabase:
        """This database as a run's events reach it: its DSN, options and standby, the
        sessions a run opens tracked by this resource (:meth:`track`)."""
        return SourceDatabase(self.dsn, self.options, self.track, self.standby_dsn)

    def open_snapshot(self, *, export: bool = False) -> SnapshotSession:
        """Opens a ``REPEATABLE READ READ ONLY`` session with a fixed snapshot.

        Args:
            export: Export the snapshot (``pg_export_snapshot()``) so that other sessions can
                import it with :meth:`import_snapshot`.
        """
        return self.database.open_snapshot(export=export)

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
        *,
        target: PostgresTargetResource,
        tables: Sequence[str | CopyTableSpec | Mapping[str, Any]] | None = None,
        translator: DponeTranslator | None = None,
        options: SnapshotCopyOptions | None = None,
        strategy: Strategy | str | None = None,
        sink: Sink | str | None = None,
        **legacy: Any,
    ) -> CopyEvents:
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
            options: The copy's options (:class:`~dpone_dagster.snapshot_copy.SnapshotCopyOptions`:
                strategy, sink, workers, batch size, schema changes).
            strategy: Shortcut for ``options.strategy``.
            sink: Shortcut for ``options.sink``.
            **legacy: ``workers``, ``batch_size`` and ``schema_changes`` as keywords:
                deprecated (``options=SnapshotCopyOptions(...)``), for one release.

        Returns:
            The copy's events; iterating them runs it.

        Raises:
            DponeFailure: ``copy_options_invalid`` for a bad option (when called); any copy
                error, with its code, next actions and terminal outcome (while the events are
                iterated).

        Examples:
            .. code-block:: python

                @dg.multi_asset(specs=[...], can_subset=True)
                def shop(context, source: PostgresSourceResource, target: PostgresTargetResource):
                    yield from source.copy_tables(context, target=target, strategy="batched_copy")
        """
        with dagster_failures():
            chosen = build_options(
                SnapshotCopyOptions, options, caller="copy_tables",
                shortcuts={"strategy": strategy, "sink": sink}, legacy=legacy,
            )  # fmt: skip
        return CopyEvents(
            context, source=self.database, target=target.database, tables=tables,
            translator=translator, options=chosen,
        )  # fmt: skip

    def backfill(
        self,
        context: dg.AssetExecutionContext,
        *,
        target: PostgresTargetResource,
        ledger: LedgerResource | None = None,
        options: BackfillOptions | None = None,
        **legacy: Any,
    ) -> BackfillEvents:
        """Backfills each of the run's partitions through the ledger, in partition order.

        The table, target and cursor are the asset spec's (``dpone/source_table``,
        ``dpone/table``, ``dpone/cursor``, as :func:`~dpone_dagster.backfill_asset` writes them);
        each partition is a cursor range and its own durable ledger run. After every committed
        batch an ``AssetObservation`` and the run's progress tags show in the UI; each partition
        ends with its metadata, then the ``dpone_reconciled`` check (when the asset declares it)
        and the materialization are yielded.

        Args:
            context: The partitioned asset's execution context.
            target: The target database.
            ledger: Where the runs and receipts are kept; ``None``: schema ``dpone_ledger`` of
                the target database.
            options: How each partition's backfill runs (batch size, reconciliation,
                ``on_changed``...): :class:`~dpone_dagster.BackfillOptions`, the defaults when
                ``None``.
            **legacy: The fields of :class:`~dpone_dagster.BackfillOptions` as keyword
                arguments (``batch_size=...``), as before the options object: accepted for one
                release, with a ``DeprecationWarning``.

        Returns:
            The backfill's events; iterating them runs it.

        Raises:
            TypeError: for a keyword argument that is no option.
            DponeFailure: ``plan_invalid`` for an invalid keyword argument's value; any backfill
                error, with its code and next actions (while the events are iterated).

        Examples:
            .. code-block:: python

                from dpone_dagster.dagster.metadata import DponeMetadataSet

                names = DponeMetadataSet(
                    source_table="events.page_views", table="events.page_views", cursor="id"
                )

                @dg.asset(partitions_def=cursor_range_partitions(0, 3000, 1000),
                          metadata=dict(names))
                def page_views(context, source: PostgresSourceResource,
                               target: PostgresTargetResource):
                    yield from source.backfill(
                        context, target=target, options=BackfillOptions(batch_size=500)
                    )
        """
        from dpone_dagster.backfill import BackfillOptions
        from dpone_dagster.dagster.events.backfill import BackfillEvents

        with dagster_failures():
            built = build_options(
                BackfillOptions, options, caller="PostgresSourceResource.backfill", legacy=legacy
            )
        return BackfillEvents(
            context, source=self.database, target=target.database,
            ledger=(ledger or LedgerResource()).config(target), options=built,
        )  # fmt: skip

    def incremental(
        self,
        context: dg.AssetExecutionContext,
        *,
        target: PostgresTargetResource,
        ledger: LedgerResource | None = None,
        options: IncrementalOptions | None = None,
        **legacy: Any,
    ) -> IncrementalEvents:
        """Runs the asset's incremental stream once.

        The table, target and cursor are the asset spec's (``dpone/source_table``,
        ``dpone/table``, ``dpone/cursor``, as :func:`~dpone_dagster.incremental_asset` writes
        them). The run continues a run left in progress (a crash, a retry, a concurrent run)
        or copies ``(mark, new mark]``; after every committed batch an ``AssetObservation``
        shows in the UI; then the ``dpone_reconciled`` check (when declared) and the
        materialization with the run's metadata are yielded.

        Args:
            context: The asset's execution context.
            target: The target database; the stream's state lives in its ledger schema.
            ledger: The ledger schema; ``None``: ``dpone_ledger``. A ledger resource naming
                another database than the target's is refused (``incremental_options_invalid``).
            options: How the stream runs
                (:class:`~dpone_dagster.incremental.IncrementalOptions`); the defaults when
                ``None``.
            **legacy: The options as keyword arguments (``deletes="hard"``...), as this method
                took them before :class:`~dpone_dagster.incremental.IncrementalOptions`:
                accepted for one release, with a ``DeprecationWarning``.

        Returns:
            The run's events; iterating them runs it.

        Raises:
            TypeError: for a keyword argument that is no option.
            DponeFailure: ``incremental_options_invalid`` for an invalid keyword argument's
                value; any stream error, with its code and next actions (while the events are
                iterated).

        Examples:
            .. code-block:: python

                from dpone_dagster.dagster.metadata import DponeMetadataSet
                from dpone_dagster.incremental import IncrementalOptions

                names = DponeMetadataSet(
                    source_table="shop.stock", table="shop.stock", cursor="updated_at"
                )

                @dg.asset(metadata=dict(names))
                def stock(context, source: PostgresSourceResource, target: PostgresTargetResource):
                    yield from source.incremental(
                        context, target=target, options=IncrementalOptions(deletes="hard")
                    )
        """
        from dpone_dagster.dagster.events.incremental import IncrementalEvents
        from dpone_dagster.incremental import IncrementalOptions

        with dagster_failures():
            chosen = build_options(
                IncrementalOptions, options, caller="PostgresSourceResource.incremental",
                legacy=legacy,
            )  # fmt: skip
        return IncrementalEvents(
            context, source=self.database, target=target.database,
            ledger=(ledger or LedgerResource()).config(target), options=chosen,
        )  # fmt: skip

    def replicate(
        self,
        context: dg.AssetExecutionContext,
        *,
        target: PostgresTargetResource,
        ledger: LedgerResource | None = None,
        options: ReplicationOptions | None = None,
        deletes: Deletes | str | None = None,
        max_changes_per_run: int | None = None,
        resync: bool = False,
        adopt: bool = False,
        **legacy: Any,
    ) -> ReplicationEvents:
        """Runs the multi-asset's replication group once.

        The tables, slot and publication are the asset specs' (``dpone/source_table``,
        ``dpone/table``, ``dpone/slot``, ``dpone/publication``, as
        :func:`~dpone_dagster.replication_assets` writes them); every table of the group must be
        selected. The first run (or a resync) creates the publication and the slot and copies
        the tables under the slot's snapshot; every run applies the changes committed up to the
        source's LSN at its start, in commit order, then yields each table's
        ``dpone_slot_healthy`` and ``dpone_reconciled`` checks (when declared) and its
        materialization.

        Args:
            context: The multi-asset's execution context.
            target: The target database; the group's applied position lives in its ledger.
            ledger: The ledger schema; ``None``: ``dpone_ledger`` of the target database.
            options: The group's options
                (:class:`~dpone_dagster.replication.ReplicationOptions`: deletes, schema
                changes, budget, sequences, failover, the check and its sweep, the slot's WAL
                threshold; see :func:`~dpone_dagster.replication_assets`).
            deletes: Shortcut for ``options.deletes``.
            max_changes_per_run: Shortcut for ``options.max_changes_per_run``.
            resync: Start over: a new slot and an initial copy under its snapshot (the way back
                from ``replication_slot_lost``).
            adopt: Let the first run take over targets filled by another dpone asset, after a
                check.
            **legacy: The other options as keywords (``schema_changes``, ``reconcile``,
                ``sweep``, ...): deprecated (``options=ReplicationOptions(...)``), for one
                release.

        Returns:
            The run's events; iterating them runs it.

        Raises:
            DponeFailure: ``replication_options_invalid`` for a bad option (when called); any
                replication error, with its code and next actions (while the events are
                iterated); ``plan_invalid`` when only some of the group's tables are selected.

        Examples:
            .. code-block:: python

                @dg.multi_asset(specs=replication_assets(["shop.orders"]).specs,
                                can_subset=False)
                def orders(context, source: PostgresSourceResource,
                           target: PostgresTargetResource):
                    yield from source.replicate(context, target=target)
        """
        from dpone_dagster.dagster.events.replication import ReplicationEvents
        from dpone_dagster.replication import ReplicationOptions

        shortcuts = {"deletes": deletes, "max_changes_per_run": max_changes_per_run}
        with dagster_failures():
            chosen = build_options(
                ReplicationOptions, options, caller="replicate", shortcuts=shortcuts, legacy=legacy
            )
        return ReplicationEvents(
            context, source=self.database, target=target.database,
            ledger=(ledger or LedgerResource()).config(target), options=chosen, resync=resync,
            adopt=adopt,
        )  # fmt: skip

    def drop_replication(
        self, group: dg.AssetsDefinition | str, *, publication: str | None = None
    ) -> Dropped:
        """Drops a replication group's slot and publication on this source: the one call that
        ends a group (a forgotten slot keeps the source's WAL forever). Idempotent.

        A later materialization of the group starts over: a new slot, and an initial copy under
        its snapshot.

        Args:
            group: The multi-asset :func:`~dpone_dagster.replication_assets` built, or its slot's
                name.
            publication: The publication, when ``group`` is a slot's name (the slot's name by
                default, as the factory names it).

        Returns:
            What was dropped (``slot``, ``publication``: False for what was already gone).

        Raises:
            DponeError: ``replication_slot_active`` (another session is reading the slot) or
                ``replication_slot_foreign`` (the slot is not a dpone slot of this database);
                nothing dropped.

        Examples:
            .. code-block:: python

                PostgresSourceResource(dsn=...).drop_replication(shop)
        """
        from dpone_dagster.dagster.events.replication import group_specs
        from dpone_dagster.replication.slot import drop_replication

        if isinstance(group, dg.AssetsDefinition):
            with dagster_failures():
                names = group_specs(group)
            slot, publication = names.slot, names.publication
        else:
            slot = group
        with connect(self.dsn, self.options, side="source", autocommit=True) as conn:
            return drop_replication(conn, slot=slot, publication=publication or slot)
