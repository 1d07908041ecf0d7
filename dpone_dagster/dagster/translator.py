"""From PostgreSQL table names to Dagster asset specs.

Dagster asset key parts accept only ``[A-Za-z0-9_]``, while PostgreSQL names may hold spaces,
quotes, dots and unicode. :func:`key_part` maps every name predictably: a name Dagster accepts is
kept as it is; any other is folded to ASCII, its other characters become ``_``, and an 8-digit
digest of the exact name is appended, so ``"Order Items"`` and ``"order items"`` get different
keys. The factories refuse, at definition time, two tables that would still share a key. The
exact qualified name is kept in the spec's metadata (``dpone/table``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import IdentifierError, TableName

_DAGSTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def key_part(name: str) -> str:
    """Maps one exact PostgreSQL name to a valid, collision-resistant asset key part.

    Examples:
        >>> key_part("orders")
        'orders'
        >>> key_part("Order Items")
        'Order_Items_dbc868c6'
    """
    if _DAGSTER_NAME.match(name):
        return name
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = re.sub(r"[^A-Za-z0-9_]+", "_", folded).strip("_") or "t"
    return f"{base}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


class CopyTableSpec(BaseModel):
    """One table to copy: a source table and, optionally, a differently named target.

    Attributes:
        source: The source table as SQL would name it (``sales."Order Items"``).
        target: The target table; the source's name when omitted.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(description='Source table, e.g. sales."Order Items".')
    target: str | None = Field(default=None, description="Target table; defaults to source.")

    @field_validator("source", "target")
    @classmethod
    def _parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                TableName.parse(value)
            except IdentifierError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def source_table(self) -> TableName:
        """The exact source table."""
        return TableName.parse(self.source)

    @property
    def target_table(self) -> TableName:
        """The exact target table."""
        return TableName.parse(self.target or self.source)

    @classmethod
    def coerce(cls, value: str | CopyTableSpec | dict[str, Any]) -> CopyTableSpec:
        """Accepts ``"schema.table"`` text, a mapping, or a spec."""
        if isinstance(value, CopyTableSpec):
            return value
        if isinstance(value, str):
            return cls(source=value)
        return cls.model_validate(value)


def coerce_tables(
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]],
) -> list[CopyTableSpec]:
    """Table specs from ``"schema.table"`` strings, mappings or specs; refuses duplicates.

    Raises:
        DponeError: ``plan_invalid`` for no table, or two tables copied into one target.
    """
    specs = [CopyTableSpec.coerce(dict(t) if isinstance(t, Mapping) else t) for t in tables]
    if not specs:
        raise DponeError("plan_invalid", "No table to copy.", ["Name at least one table."])
    seen: dict[object, CopyTableSpec] = {}
    for spec in specs:
        if spec.target_table in seen:
            raise DponeError(
                "plan_invalid",
                f"Two tables are copied into {spec.target_table}: "
                f"{seen[spec.target_table].source} and {spec.source}.",
                ["Give each table its own target."],
            )
        seen[spec.target_table] = spec
    return specs


@dataclass(frozen=True)
class DponeTranslator:
    """Turns a table spec into the :class:`dagster.AssetSpec` of its target table, and of its
    source table (an external asset upstream of it in the graph).

    Subclass and override :meth:`get_asset_key`, :meth:`get_source_asset_key` or
    :meth:`get_asset_spec` to change keys, groups, owners or tags, as with
    ``DagsterSlingTranslator``; override :meth:`get_source_asset_key` to point copies at the keys
    your source tables already have.

    Args:
        key_prefix: Parts put before ``[schema, table]`` in every key.
        group_name: The asset group; none when omitted.
        source_assets: Make each target depend on its source table's external asset (on by
            default; off: the copies are roots of the graph, without column lineage).
        source_key_prefix: Parts put before ``[schema, table]`` in source tables' keys.
    """

    key_prefix: tuple[str, ...] = ()
    group_name: str | None = None
    source_assets: bool = True
    source_key_prefix: tuple[str, ...] = ("source",)

    def get_source_asset_key(self, spec: CopyTableSpec) -> dg.AssetKey:
        """``[*source_key_prefix, schema, table]`` of the source table."""
        source = spec.source_table
        return dg.AssetKey(
            [*self.source_key_prefix, key_part(source.schema), key_part(source.name)]
        )

    def get_source_asset_spec(self, spec: CopyTableSpec) -> dg.AssetSpec | None:
        """The source table as an external asset (none when ``source_assets`` is off)."""
        if not self.source_assets:
            return None
        return dg.AssetSpec(
            key=self.get_source_asset_key(spec),
            description=f"PostgreSQL source table {spec.source_table}.",
            metadata=dict(CommonMetadataSet(table=spec.source_table.qualified)),
            kinds={"postgres"},
        )

    def get_asset_key(self, spec: CopyTableSpec) -> dg.AssetKey:
        """``[*key_prefix, schema, table]`` of the target table, mapped with :func:`key_part`."""
        target = spec.target_table
        return dg.AssetKey([*self.key_prefix, key_part(target.schema), key_part(target.name)])

    def get_description(self, spec: CopyTableSpec) -> str:
        """A one-line description naming both tables."""
        return f"Copy of PostgreSQL table {spec.source_table} into {spec.target_table}."

    def get_metadata(self, spec: CopyTableSpec) -> dict[str, Any]:
        """The exact names, kept because a key part may have been mapped."""
        return dict(
            CommonMetadataSet(
                table=spec.target_table.qualified, source_table=spec.source_table.qualified
            )
        )

    def get_asset_spec(self, spec: CopyTableSpec) -> dg.AssetSpec:
        """The full asset spec of the target table."""
        source = self.get_source_asset_spec(spec)
        return dg.AssetSpec(
            key=self.get_asset_key(spec),
            description=self.get_description(spec),
            metadata=self.get_metadata(spec),
            group_name=self.group_name,
            kinds={"postgres"},
            deps=[] if source is None else [source.key],
        )


def source_asset_specs(
    assets: Sequence[dg.AssetsDefinition], translator: DponeTranslator | None = None
) -> list[dg.AssetSpec]:
    """The external source-table specs upstream of dpone assets, to add to ``Definitions``.

    Dagster shows a dependency on an undefined key as a bare external asset; these specs give
    the source tables their kind, description and exact name. Pass the translator the assets
    were built with.

    Examples:
        .. code-block:: python

            shop = snapshot_copy_assets(["shop.orders"])
            defs = dg.Definitions(assets=[shop, *source_asset_specs([shop])])
    """
    tr = translator or DponeTranslator()
    found: dict[dg.AssetKey, dg.AssetSpec] = {}
    for assets_def in assets:
        for spec in assets_def.specs:
            names = CommonMetadataSet.read(spec.metadata, "source_table", "table")
            if names.source_table is None:
                continue
            copied = CopyTableSpec(source=names.source_table, target=names.table)
            upstream = tr.get_source_asset_spec(copied)
            if upstream is not None:
                found.setdefault(upstream.key, upstream)
    return list(found.values())
