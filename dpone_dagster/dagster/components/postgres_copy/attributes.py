"""Dagster asset attributes from YAML, per table: key, group, tags, kinds, owners, description.

:class:`AssetAttributes` is what a ``defs.yaml`` may set on a copied table (or, at the
component's top level, on every table), as the dagster-sling component's ``translation`` does;
:class:`AttributesTranslator` applies them through the translator, so a key set in YAML is the
asset's key and the source table's external asset stays upstream of it.
"""

# No `from __future__ import annotations`: Dagster's Resolvable reads the field annotations.
from collections.abc import Mapping
from dataclasses import dataclass, field

import dagster as dg

from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator


@dataclass(kw_only=True)
class AssetAttributes(dg.Resolvable):
    """Asset attributes a YAML file may set.

    Attributes:
        key: The asset key (``warehouse/orders``); the translator's when omitted.
        group_name: The asset group.
        description: The asset's description.
        tags: Tags added to the asset's.
        kinds: Kinds added to ``postgres``.
        owners: Owners (``team:data``, ``someone@example.com``).
    """

    key: dg.ResolvedAssetKey | None = None
    group_name: str | None = None
    description: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    kinds: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)

    def apply(self, spec: dg.AssetSpec) -> dg.AssetSpec:
        """``spec`` with these attributes (but the key, which the translator sets): set ones
        replace, tags, kinds and owners add."""
        changed = spec.replace_attributes(
            group_name=self.group_name or spec.group_name,
            description=self.description or spec.description,
            owners=[*spec.owners, *(o for o in self.owners if o not in spec.owners)],
        )
        return changed.merge_attributes(tags=self.tags, kinds=set(self.kinds))


@dataclass(kw_only=True)
class TableModel(AssetAttributes):
    """One table of a snapshot copy, with its own target name and asset attributes.

    Attributes:
        source: The source table as SQL names it (``'shop."Order Items"'``).
        target: The target table; the source's name when omitted.
    """

    source: str
    target: str | None = None

    def spec(self) -> CopyTableSpec:
        """The table spec this entry names."""
        return CopyTableSpec(source=self.source, target=self.target)


@dataclass(frozen=True)
class AttributesTranslator(DponeTranslator):
    """A translator that applies the component's attributes, then each table's own.

    Args:
        common: The attributes of every table (a ``key`` here is refused: keys are per table).
        per_table: Each table's attributes, by table spec.
    """

    common: AssetAttributes | None = None
    per_table: Mapping[CopyTableSpec, AssetAttributes] = field(default_factory=dict)

    def get_asset_key(self, spec: CopyTableSpec) -> dg.AssetKey:
        """The table's ``key`` from YAML, else the default ``[*key_prefix, schema, table]``."""
        own = self.per_table.get(spec)
        if own is not None and own.key is not None:
            return own.key
        return super().get_asset_key(spec)

    def get_asset_spec(self, spec: CopyTableSpec) -> dg.AssetSpec:
        """The default spec with the common, then the table's own attributes applied."""
        result = super().get_asset_spec(spec)
        for attributes in (self.common, self.per_table.get(spec)):
            if attributes is not None:
                result = attributes.apply(result)
        return result
