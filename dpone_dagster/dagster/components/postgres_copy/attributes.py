"""Dagster's asset attributes from YAML, per table and for every table; the databases as
resources resolved from YAML.

The attributes are Dagster's own models (``dg.AssetAttributesModel``, with ``key`` and
``key_prefix``, for a table, a backfill or a stream; Dagster's ``ResolvedAssetAttributes``,
without a key, at the component's top level), resolved by Dagster: templated (``{{ env.X }}``,
the project's template vars) and typed as ``AssetSpec`` takes them. :class:`AttributesTranslator`
applies them through the translator, so a key set in YAML is the asset's key and the source
table's external asset stays upstream of it. Metadata, tags, owners and kinds add to the
spec's (``postgres`` stays a kind, and a table's owners join the component's); any other
attribute replaces the spec's, as in Dagster's own ``translation``.

The source and target are :class:`~dpone_dagster.PostgresSourceResource` and
:class:`~dpone_dagster.PostgresTargetResource` resolved from YAML, as dagster-sling's component
takes its ``SlingResource``. Dagster renders ``{{ env.NAME }}`` to the variable's value when
the definitions load, and a resource's configuration is shown in the UI: a ``dsn`` written as
exactly ``{{ env.NAME }}`` (or ``{{ env("NAME") }}``) is therefore kept as ``EnvVar("NAME")``,
read when a run starts and never written into the definitions; any other ``dsn`` is rendered
as Dagster renders it.

The YAML of earlier versions still loads, with a ``FutureWarning`` naming the new spelling:
attributes written on an entry itself (:class:`InlineAttributes`) and ``source_dsn_env`` /
``target_dsn_env`` (:func:`resource_or_env`).
"""

# No `from __future__ import annotations`: Dagster's Resolvable reads the field annotations.
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, TypeVar

import dagster as dg

# Dagster's resolution of AssetAttributesModel (the attributes with a key) has no top-level
# name in dagster 1.13; dagster-sling's and dagster-dbt's components import from this module.
from dagster.components.resolved.core_models import resolve_asset_spec_update_kwargs_to_mapping
from pydantic import ConfigDict, Field

from dpone_dagster.dagster.resources import (
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.resources.sessions import PostgresResource
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator

ResolvedTableAttributes = Annotated[
    Mapping[str, Any],
    dg.Resolver(
        resolve_asset_spec_update_kwargs_to_mapping, model_field_type=dg.AssetAttributesModel
    ),
]
"""One asset's attributes from YAML (Dagster's ``AssetAttributesModel``): the fields it sets."""


_ADDED = ("metadata", "tags", "owners", "kinds")
"""Attributes that add to the spec's; every other one replaces it."""

_KEYED = ("key", "key_prefix")
"""Attributes that make the key (:func:`attributes_key`)."""


def attributes_key(key: dg.AssetKey, attributes: Mapping[str, Any]) -> dg.AssetKey:
    """``key`` after resolved YAML attributes: their ``key`` replaces it, their ``key_prefix``
    prefixes it."""
    key = attributes.get("key", key)
    return key.with_prefix(attributes["key_prefix"]) if "key_prefix" in attributes else key


def with_attributes(spec: dg.AssetSpec, attributes: Mapping[str, Any]) -> dg.AssetSpec:
    """``spec`` with resolved YAML attributes but its key (:func:`attributes_key`): metadata,
    tags, owners and kinds add to the spec's, any other attribute replaces the spec's."""
    replaced = {k: v for k, v in attributes.items() if k not in (*_ADDED, *_KEYED)}
    added: dict[str, Any] = {k: attributes[k] for k in _ADDED if k in attributes}
    if "owners" in added:
        added["owners"] = [o for o in added["owners"] if o not in spec.owners]
    if "kinds" in added:
        added["kinds"] = set(added["kinds"])
    return spec.replace_attributes(**replaced).merge_attributes(**added)


@dataclass(kw_only=True)
class InlineAttributes(dg.Resolvable):
    """Asset attributes written on an entry itself, as before ``attributes:`` (deprecated).

    Attributes:
        key: The asset key (``warehouse/orders``).
        description: The asset's description.
        tags: Tags added to the asset's.
        kinds: Kinds added to ``postgres``.
        owners: Owners (``team:data``, ``someone@example.com``).
    """

    key: dg.ResolvedAssetKey | None = None
    description: str | None = None
    tags: dict[str, str] | None = None
    kinds: list[str] | None = None
    owners: list[str] | None = None

    _inline: ClassVar[tuple[str, ...]] = ("key", "description", "tags", "kinds", "owners")

    def inline_attributes(self, entry: str) -> dict[str, Any]:
        """The attributes written inline on the entry (a warning names the new spelling)."""
        inline = {name: getattr(self, name) for name in self._inline}
        inline = {name: value for name, value in inline.items() if value is not None}
        if inline:
            warnings.warn(
                f"PostgresCopyComponent: {', '.join(inline)} written on {entry} itself is "
                f"deprecated; put {'it' if len(inline) == 1 else 'them'} under the entry's "
                "`attributes:` (Dagster's asset attributes).",
                FutureWarning,
                stacklevel=2,
            )
        return inline


@dataclass(kw_only=True)
class TableModel(InlineAttributes):
    """One table of a snapshot copy, with its own target name and asset attributes.

    Attributes:
        source: The source table as SQL names it (``'shop."Order Items"'``).
        target: The target table; the source's name when omitted.
        attributes: The table's asset attributes (Dagster's: ``key``, ``group_name``,
            ``description``, ``tags``, ``kinds``, ``owners``...), over the component's.
        group_name: Deprecated: ``attributes: {group_name: ...}``.
    """

    source: str
    target: str | None = None
    attributes: ResolvedTableAttributes = field(default_factory=dict)
    group_name: str | None = None

    _inline = (*InlineAttributes._inline, "group_name")

    def spec(self) -> CopyTableSpec:
        """The table spec this entry names."""
        return CopyTableSpec(source=self.source, target=self.target)

    def all_attributes(self) -> Mapping[str, Any]:
        """The entry's attributes: those written inline (deprecated), then ``attributes``."""
        return {**self.inline_attributes(f"table {self.source}"), **self.attributes}


@dataclass(frozen=True)
class AttributesTranslator(DponeTranslator):
    """A translator that applies the component's attributes, then each table's own.

    Args:
        common: The resolved attributes of every table (no key: keys are per table).
        per_table: Each table's resolved attributes, by table spec.
    """

    common: Mapping[str, Any] = field(default_factory=dict)
    per_table: Mapping[CopyTableSpec, Mapping[str, Any]] = field(default_factory=dict)

    def get_asset_key(self, spec: CopyTableSpec) -> dg.AssetKey:
        """The table's key from YAML, else the default ``[*key_prefix, schema, table]``."""
        return attributes_key(super().get_asset_key(spec), self.per_table.get(spec, {}))

    def get_asset_spec(self, spec: CopyTableSpec) -> dg.AssetSpec:
        """The default spec with the common, then the table's own attributes applied."""
        result = super().get_asset_spec(spec)
        for attributes in (self.common, self.per_table.get(spec, {})):
            result = with_attributes(result, attributes)
        return result


def _described(name: str) -> Any:
    """An optional YAML field with the resource field's own description."""
    return Field(default=None, description=PostgresResource.model_fields[name].description)


class PostgresResourceModel(dg.Model):
    """A PostgreSQL resource in YAML: its DSN and, optionally, its other settings.

    Attributes:
        dsn: ``"{{ env.DPONE_SOURCE_DSN }}"`` (kept as an ``EnvVar``: never shown), or a DSN.
    """

    # A DSN this model refuses is never quoted in the error (it may hold a password).
    model_config = ConfigDict(hide_input_in_errors=True)

    dsn: str = Field(
        description='libpq DSN; "{{ env.NAME }}" stays an EnvVar, read when a run starts.'
    )
    application_name: str | None = _described("application_name")
    connect_timeout: int | None = _described("connect_timeout")
    statement_timeout_ms: int | None = _described("statement_timeout_ms")


class PostgresTargetModel(PostgresResourceModel):
    """The target database in YAML: a PostgreSQL resource and the extensions dpone may create
    in it."""

    create_extensions: list[str] | None = Field(
        default=None,
        description=PostgresTargetResource.model_fields["create_extensions"].description,
    )


_ENV = re.compile(r"""^\s*\{\{\s*env(?:\.(\w+)|\(\s*['"](\w+)['"]\s*\))\s*\}\}\s*$""")


def resolve_dsn(context: dg.ResolutionContext, dsn: str) -> str:
    """``{{ env.NAME }}`` as ``EnvVar("NAME")``; any other DSN as Dagster renders it."""
    found = _ENV.match(dsn)
    if found:
        return dg.EnvVar(found.group(1) or found.group(2))
    return str(context.resolve_value(dsn))


_R = TypeVar("_R", bound=PostgresResource)


def _resource_resolver(
    kind: type[_R], description: str, model_type: type[PostgresResourceModel]
) -> dg.Resolver:
    """Resolves a ``model_type`` model (or nothing) into a ``kind`` resource."""

    def resolve(context: dg.ResolutionContext, model: PostgresResourceModel | None) -> _R | None:
        if model is None:
            return None
        settings = model.model_dump(exclude_unset=True, exclude={"dsn"})
        return kind(
            dsn=resolve_dsn(context.at_path("dsn"), model.dsn),
            **context.resolve_value(settings),
        )

    return dg.Resolver(resolve, model_field_type=model_type | None, description=description)


# Dagster checks that a resolved field's pydantic type has only fields it could resolve itself,
# even when the field has a resolver and a model_field_type, and refuses the resources'
# constrained fields (Field(ge=1)). The inner Annotated keeps the resource from that check;
# type checkers still read the resource's type.
ResolvedSource = Annotated[
    Annotated[PostgresSourceResource, PostgresResourceModel] | None,
    _resource_resolver(
        PostgresSourceResource,
        "The source database (the `source` resource).",
        PostgresResourceModel,
    ),
]
"""The ``source`` resource from YAML."""

ResolvedTarget = Annotated[
    Annotated[PostgresTargetResource, PostgresTargetModel] | None,
    _resource_resolver(
        PostgresTargetResource,
        "The target database (the `target` resource; the ledger in it).",
        PostgresTargetModel,
    ),
]
"""The ``target`` resource from YAML."""


_PG = TypeVar("_PG", PostgresSourceResource, PostgresTargetResource)


def resource_or_env(
    resource: _PG | None, kind: type[_PG], name: str, env: str | None
) -> _PG | None:
    """The resource from YAML, or one from the deprecated ``<name>_dsn_env`` (with a warning
    that names the new spelling).

    Raises:
        ValueError: when both are given.
    """
    if env is None:
        return resource
    if resource is not None:
        raise ValueError(f"PostgresCopyComponent: give {name} or {name}_dsn_env, not both.")
    warnings.warn(
        f"PostgresCopyComponent: {name}_dsn_env is deprecated; write "
        f'`{name}: {{dsn: "{{{{ env.{env} }}}}"}}` (the DSN stays an EnvVar, read at run time).',
        FutureWarning,
        stacklevel=3,
    )
    return kind(dsn=dg.EnvVar(env))
