"""``MySQLRead``: what a MySQL/MariaDB copy reads, one frozen object validated once.

:func:`~dpone_dagster.mysql_copy_asset`,
:meth:`~dpone_dagster.MySQLSourceResource.copy_table` and the adapter
(:class:`~.mysql.MySQLSource`) all take this object: a table (of the resource's database or
another one, all its columns or some) or a query. How the rows land is the copy's
:class:`~.copy_options.SourceCopyOptions`; how to reach the server is the adapter's
:class:`~.mysql.MySQLSettings`.

Examples:
    >>> MySQLRead(table="orders", columns=["id", "total"]).columns
    ('id', 'total')
    >>> MySQLRead(query="SELECT id FROM orders; ").query
    'SELECT id FROM orders'
    >>> try:
    ...     MySQLRead.parse({"table": "orders", "query": "SELECT 1"})
    ... except SourceError as exc:
    ...     print(exc.code)
    mysql_source_invalid
"""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import field_validator, model_validator

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.lifecycle.options import ParsedOptions

from .mysql_catalog import quote_mysql_identifier
from .protocol import SourceError

__all__ = ["MySQLRead"]


class MySQLRead(ParsedOptions):
    """What a MySQL/MariaDB copy reads: exactly one of :attr:`table` and :attr:`query`.

    Raises:
        SourceError: ``mysql_source_invalid`` for neither or both of ``table`` and ``query``,
            ``columns`` with a query, or a field of the wrong type or an unknown one (through
            :meth:`parse`; constructing it directly raises pydantic's ``ValidationError`` for
            the last two); ``identifier_invalid`` for an empty table, database or column name.
    """

    refusal: ClassVar[str] = "mysql_source_invalid"
    error: ClassVar[type[DponeError]] = SourceError

    table: str | None = None
    """The table to copy (in the resource's database unless :attr:`database` is given)."""
    query: str | None = None
    """A SELECT whose rows to copy (its column names become the target's); a trailing ``;``
    is dropped."""
    database: str | None = None
    """The table's database, when it is not the resource's."""
    columns: tuple[str, ...] | None = None
    """Copy only these columns of :attr:`table`, in this order (None: all of them)."""

    @classmethod
    def refused(cls, detail: str) -> DponeError:
        """The MySQL source's error of an invalid read (``detail``: which field, and why)."""
        return SourceError(cls.refusal, detail, ["Pass table='orders' or query='SELECT ...'."])

    @field_validator("table", "database", mode="after")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None:
            quote_mysql_identifier(value)  # refuses an empty name or a NUL byte
        return value

    @field_validator("columns", mode="after")
    @classmethod
    def _columns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in value or ():
            quote_mysql_identifier(name)
        return value

    @field_validator("query", mode="after")
    @classmethod
    def _query(cls, value: str | None) -> str | None:
        return None if value is None else value.strip().rstrip(";").strip()

    @model_validator(mode="after")
    def _one_of_table_and_query(self) -> Self:
        if (self.table is None) == (self.query is None):
            raise self.refused("Give a MySQL source exactly one of table= and query=.")
        if self.query is not None and self.columns is not None:
            raise SourceError(
                self.refusal,
                "columns= selects columns of a table; a query selects its own.",
                ["Name the columns in the query's SELECT list."],
            )
        return self
