"""The ledger resource: where backfill runs, batch receipts and incremental streams' state live."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from dpone_dagster.core import DEFAULT_LEDGER_SCHEMA, LedgerConfig
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import same_database
from dpone_dagster.postgres.identifiers import check_identifier

from .secrets import SecretResource
from .sessions import PostgresResource, checked_dsn


class LedgerResource(SecretResource):
    """Where backfill runs and their batch receipts, and incremental streams' state, are kept.

    By default the ledger lives in the target database (``dsn`` unset), in schema
    ``dpone_ledger``: a batch's rows and its receipt then commit in one transaction. A ``dsn``
    that names the target's own database (same host, port and database, whatever the user or
    other parameters) is the default: the ledger's tables are written through the target's
    session. A ledger in another database is allowed for backfills; see docs/backfill.md for the
    weaker guarantee it gives. Incremental streams keep their state in the target database only.

    Examples:
        >>> from dpone_dagster import PostgresTargetResource
        >>> target = PostgresTargetResource(dsn="postgresql://loader@db:5432/warehouse")
        >>> LedgerResource(dsn="host=db dbname=warehouse user=admin").in_target(target)
        True
        >>> LedgerResource(dsn="postgresql://db/ledger").config(target).dsn
        'postgresql://db/ledger'
    """

    dsn: str | None = Field(
        default=None, description="Ledger database; the target's database when unset.", repr=False
    )
    schema_name: str = Field(
        default=DEFAULT_LEDGER_SCHEMA, description="Schema of the ledger tables."
    )

    @field_validator("dsn", mode="before")
    @classmethod
    def _dsn_shape(cls, value: Any) -> Any:
        return None if value is None else checked_dsn(value, cls.__name__)

    @field_validator("schema_name")
    @classmethod
    def _schema(cls, value: str) -> str:
        try:
            return check_identifier(value, what="schema")
        except DponeError as exc:
            raise ValueError(str(exc)) from None

    def in_target(self, target: PostgresResource) -> bool:
        """True when the ledger is in the target's database (one transaction per batch)."""
        return self.dsn is None or same_database(self.dsn, target.dsn)

    def ledger_dsn(self, target: PostgresResource) -> str:
        """The ledger's DSN: the target's when the ledger is in the target's database."""
        return target.dsn if self.dsn is None or self.in_target(target) else self.dsn

    def config(self, target: PostgresResource) -> LedgerConfig:
        """The engines' ledger settings: in the target (``dsn=None``), or the ledger's own DSN."""
        return LedgerConfig(
            dsn=None if self.in_target(target) else self.dsn, schema=self.schema_name
        )
