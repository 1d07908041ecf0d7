"""``ReplicationOptions``: a replication group's options, one frozen object validated once.

:func:`~dpone_dagster.replication_assets`, :meth:`~dpone_dagster.PostgresSourceResource.
replicate`, its events and the engine (through :class:`~.group_plan.ReplicationGroup`, the group's
tables, slot and publication with these options) all take this object. What is not a choice of
the group (the DSNs, the ledger, the sessions' options, a run's ``resync`` and ``adopt``, the
progress hook, the standby) is the engine's own arguments.

Examples:
    >>> ReplicationOptions(deletes="soft", max_changes_per_run=10_000).deletes
    <Deletes.SOFT: 'soft'>
    >>> try:
    ...     ReplicationOptions.parse({"deletes": "ignore"})
    ... except DponeError as exc:
    ...     print(exc.code)
    replication_options_invalid
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.options import JobOptions
from dpone_dagster.core.sweep import Sweep
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.identifiers import check_identifier
from dpone_dagster.postgres.schema_change import SchemaChanges

__all__ = [
    "DEFAULT_RETAINED_WAL_WARN_BYTES",
    "DEFAULT_SOFT_DELETE_COLUMN",
    "ReplicationOptions",
]

DEFAULT_SOFT_DELETE_COLUMN = "_dpone_deleted_at"
"""The target column ``soft`` deletes set (``timestamptz``, NULL for a live row), created if
missing."""
DEFAULT_RETAINED_WAL_WARN_BYTES = 1 << 30
"""``dpone_slot_healthy`` warns above this much WAL retained by the slot (1 GiB)."""


class ReplicationOptions(JobOptions):
    """How a replication group applies its changes and checks its runs; the defaults suit most
    groups.

    Raises:
        EngineError: ``replication_options_invalid`` for a bad option (the message names it).
        IdentifierError: ``identifier_invalid`` for a soft-delete column PostgreSQL would not
            read.
        DponeError: ``plan_invalid`` for a ``retained_wal_warn_bytes`` that is not a positive
            number of bytes.
    """

    refusal: ClassVar[str] = "replication_options_invalid"

    deletes: Deletes = Deletes.HARD
    """``hard`` (a source delete deletes the target row) or ``soft`` (sets
    :attr:`soft_delete_column` to the deleting transaction's commit time instead)."""
    soft_delete_column: str = DEFAULT_SOFT_DELETE_COLUMN
    """The ``timestamptz`` column ``soft`` deletes set (added if missing)."""
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    """``evolve`` (a column added, widened or dropped at the source changes the target in the
    data's transaction) or ``freeze`` (any difference fails with
    ``schema_change_incompatible``)."""
    max_changes_per_run: int | None = None
    """The per-run budget of decoded changes: a run stops after the source transaction that
    reaches it (the next run goes on); None drains the slot up to the LSN taken at the run's
    start."""
    sequences: bool = True
    """Each run brings the target's sequences of the tables' identity and ``serial`` columns to
    at least the source's value (made when the target has none), so that a target promoted to
    primary never hands out a used key; reported per table (``dpone/sequences``). False leaves
    the target's sequences alone."""
    failover: bool | None = None
    """The group's slot is a failover slot, which the source synchronizes to a standby set up
    for it, so that the group goes on from the standby once promoted. None: a failover slot
    where the source supports it (PostgreSQL 17+), a plain slot before; True: required (an
    older source fails the run with ``replication_failover_unsupported``, nothing created);
    False: a plain slot. See docs/replication.md, Failover."""
    reconcile: bool = True
    """Check each run: every key it inserted, updated or deleted, exactly, and a rolling slice
    of each table's key (every range verified within :attr:`sweep`'s bound), against the source
    as of the applied position; reported as each table's ``dpone_reconciled`` check. A run
    stopped by ``max_changes_per_run`` checks nothing: the first run that drains the slot
    checks its keys too."""
    sweep: Sweep = Field(default_factory=Sweep)
    """The rolling slice's per-run budget (``runs``, default a full sweep in 288 runs, once a
    day at a five-minute schedule; or ``rows`` or ``seconds`` per run)."""
    retained_wal_warn_bytes: int = DEFAULT_RETAINED_WAL_WARN_BYTES
    """``dpone_slot_healthy`` warns above this much WAL retained by the slot."""

    @field_validator("deletes", mode="after")
    @classmethod
    def _deletes(cls, value: Deletes) -> Deletes:
        if value not in (Deletes.HARD, Deletes.SOFT):
            raise engine_error(
                cls.refusal,
                f"deletes={value.value!r}: replication applies deletes as they happen.",
                ["Use deletes='hard' or deletes='soft'."],
            )
        return value

    @field_validator("soft_delete_column", mode="after")
    @classmethod
    def _soft_delete_column(cls, value: str) -> str:
        return check_identifier(value, what="soft-delete column")

    @field_validator("max_changes_per_run", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> int | None:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise engine_error(
                cls.refusal,
                f"max_changes_per_run={value!r}.",
                ["Use a whole number of at least 1, or None to drain the slot."],
            )
        return value

    @field_validator("sequences", mode="before")
    @classmethod
    def _sequences(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise engine_error(
                cls.refusal,
                f"sequences={value!r}.",
                ["Use True (bring the target's sequences along, the default) or False."],
            )
        return value

    @field_validator("failover", mode="before")
    @classmethod
    def _failover(cls, value: Any) -> bool | None:
        if value not in (None, True, False):
            raise engine_error(
                cls.refusal,
                f"failover={value!r}.",
                ["Use None (a failover slot where the source supports it, the default), True "
                 "(required) or False (a plain slot)."],
            )  # fmt: skip
        return value  # type: ignore[no-any-return]

    @field_validator("retained_wal_warn_bytes", mode="before")
    @classmethod
    def _warn_bytes(cls, value: Any) -> int:
        if isinstance(value, bool) or not (isinstance(value, int) and value > 0):
            raise DponeError(
                "plan_invalid",
                f"retained_wal_warn_bytes must be a positive number of bytes, not {value!r}.",
                ["Leave it unset (1 GiB), or give e.g. 10 * 2**30."],
            )
        return value
