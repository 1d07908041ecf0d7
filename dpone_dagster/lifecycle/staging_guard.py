"""The construction guard for target staging tables.

A staging table is created before rows are inserted into it and becomes the caller's only when
the artifact's ``materialize()`` returns. Until then nothing else can reach it, so the guard must
drop it on any failure: an insert, a file import, contract validation, logging, cancellation, or a
``BaseException`` such as Dagster's ``DagsterExecutionInterruptedError`` or ``KeyboardInterrupt``.
A drop that fails is attached to the primary exception as a redacted note; it never replaces it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from .errors import LifecycleError
from .redaction import redact

T = TypeVar("T")


@runtime_checkable
class StagingTable(Protocol):
    """A target staging table the guard can create and drop."""

    @property
    def display_name(self) -> str:
        """The table's qualified name, for messages."""

    def create(self) -> None:
        """Creates the table."""

    def drop(self) -> None:
        """Drops the table (must not fail when it is already gone)."""


class owned_staging_handle:  # noqa: N801 - a context manager used like a function
    """Creates ``staging`` and drops it unless ownership is transferred.

    Use it inside ``materialize()`` and return through :meth:`transfer`::

        with owned_staging_handle(staging) as guard:
            load_rows(staging)
            validate(staging)
            return guard.transfer(StagedLoad(staging))

    Args:
        staging: The staging table to create and guard.

    Raises:
        LifecycleError: ``staging_not_transferred`` when the block ends normally without
            :meth:`transfer` (the table is dropped first: nobody could reach it).
    """

    def __init__(self, staging: StagingTable) -> None:
        self.staging = staging
        self.transferred = False
        self.dropped = False

    def __enter__(self) -> owned_staging_handle:
        self.staging.create()
        return self

    def transfer(self, value: T) -> T:
        """Hands the staging table to the caller; returns ``value`` unchanged."""
        self.transferred = True
        return value

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None and self.transferred:
            return
        try:
            self.staging.drop()
            self.dropped = True
        except BaseException as drop_error:
            if exc is None:
                raise
            exc.add_note(
                f"dpone: staging table {self.staging.display_name} could not be dropped "
                f"({type(drop_error).__name__}: {redact(str(drop_error))}); drop it by hand."
            )
            return
        if exc is None:
            raise LifecycleError(
                "staging_not_transferred",
                f"Staging table {self.staging.display_name} was built but never handed over; "
                "it was dropped.",
                ["Return through guard.transfer(...) inside the guarded block."],
            )
