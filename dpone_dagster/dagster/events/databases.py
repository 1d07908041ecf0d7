"""The databases a run's events reach, as plain values: a DSN and its sessions' options
(:class:`Database`), with what a target adds (:class:`TargetDatabase`: the extensions it may
create) and what a source adds (:class:`SourceDatabase`: its standby, and where the step's
sessions are tracked). The resources' methods build them (``resource.database``) and hand them
to the events: the resources import the events, never the reverse.
"""

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from dpone_dagster.postgres import ConnectionOptions, SnapshotSession
from dpone_dagster.snapshot_copy import SnapshotCopy

Tracked = TypeVar("Tracked", SnapshotSession, SnapshotCopy)
"""What a run's events open and hand to the step's tracking: a snapshot session, a copy."""


class Tracker(Protocol):
    """Registers what a run opens, so that the step's teardown closes what the run left open
    (a resource's ``track``)."""

    def __call__(self, artifact: Tracked, /) -> Tracked:
        """Registers ``artifact``; returns it."""
        ...


@dataclass(frozen=True)
class Database:
    """A PostgreSQL database as a run reaches it.

    Attributes:
        dsn: Its libpq DSN (it may hold a password: never shown).
        options: The options every session of the run on it uses.
    """

    dsn: str = field(repr=False)
    options: ConnectionOptions


@dataclass(frozen=True)
class TargetDatabase(Database):
    """The database a run writes to.

    Attributes:
        create_extensions: The extensions the run may create in it when a copied table's
            types need them.
    """

    create_extensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceDatabase(Database):
    """The database a run reads from.

    Attributes:
        track: Where the sessions and copies the run opens are registered.
        standby_dsn: Its physical standby's DSN, when known (a replication group reads its copy
            of the slot).
    """

    track: Tracker = field(compare=False)
    standby_dsn: str | None = field(default=None, repr=False)

    def open_snapshot(self, *, export: bool = False) -> SnapshotSession:
        """A tracked ``REPEATABLE READ READ ONLY`` session with a fixed snapshot (exported when
        ``export``, for sessions that import it)."""
        return self.track(SnapshotSession.open(self.dsn, self.options, export=export))
