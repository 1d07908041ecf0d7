"""``dg scaffold defs dpone_dagster.PostgresCopyComponent <path>``: a ``defs.yaml`` that loads as
it is, with comments saying what to fill in."""

import json

import dagster as dg
from pydantic import BaseModel, Field

# What the scaffolded defs.yaml says, around the three values it is told: the tables, and the
# environment variables of the two DSNs. The optional jobs are commented out, ready to fill in.
_DEFS_YAML = """\
# A dpone PostgresCopyComponent: copies from a PostgreSQL source into a PostgreSQL target,
# declared without Python. Fill in the tables below; `dg check defs` checks this file and
# `dg list defs` shows its assets. Reference: the component's docstring
# (`dg list components`) and the example defs.yaml of dpone-dagster (examples/postgres_copy/).
type: dpone_dagster.PostgresCopyComponent

attributes:
  # The databases, as the `source` and `target` resources. A dsn of exactly "{{{{ env.NAME }}}}"
  # stays an EnvVar: read when a run starts, never written into the definitions or the UI.
  # Set both variables where the code location runs.
  source:
    dsn: "{{{{ env.{source_env} }}}}"
  target:
    dsn: "{{{{ env.{target_env} }}}}"

  # Snapshot copy: these tables are read under ONE source snapshot and loaded into the target
  # (the same schema.table there; `targets: {{source: target}}` renames).
  snapshot_copies:
    - tables:
{tables}
      # whole_copy, stream_rows, batched_copy, partitioned_copy (with `workers`), internal_query
      strategy: batched_copy
      # sink: replace          # or append, merge (by the primary key)
      # schema_changes: evolve # or freeze: a target whose columns differ fails the run

  # Ordered backfill of a large table: one partition per cursor range, each batch committed
  # with its receipt in the ledger (schema dpone_ledger of the target).
  # backfills:
  #   - table: events.page_views
  #     cursor: id
  #     range_partitions: {{start: 0, stop: 1000000, step: 100000}}

  # Incremental sync: each run copies what changed since the last (and the deletes).
  # incremental_streams:
  #   - table: shop.stock
  #     cursor: updated_at
  #     deletes: hard
  #     cron_schedule: "*/5 * * * *"
"""


class PostgresCopyScaffoldParams(BaseModel):
    """What ``dg scaffold defs dpone_dagster.PostgresCopyComponent`` may be told.

    Attributes:
        tables: Tables the scaffolded snapshot copy reads (``--json-params``).
        source_dsn_env: Environment variable of the source DSN.
        target_dsn_env: Environment variable of the target DSN.
    """

    tables: list[str] = Field(default_factory=lambda: ["public.my_table"])
    source_dsn_env: str = "DPONE_SOURCE_DSN"
    target_dsn_env: str = "DPONE_TARGET_DSN"


def defs_yaml(params: PostgresCopyScaffoldParams) -> str:
    """The commented ``defs.yaml`` of ``params``: it loads as it is.

    Examples:
        >>> import yaml
        >>> text = defs_yaml(PostgresCopyScaffoldParams(tables=['shop."Order Items"']))
        >>> yaml.safe_load(text)["attributes"]["snapshot_copies"]
        [{'tables': ['shop."Order Items"'], 'strategy': 'batched_copy'}]
    """
    # A JSON string is a YAML scalar: any table name, quoted or not, stays one value.
    tables = "\n".join(
        f"        - {json.dumps(t)}   # schema.table: your table here" for t in params.tables
    )
    return _DEFS_YAML.format(
        source_env=params.source_dsn_env, target_env=params.target_dsn_env, tables=tables
    )


class PostgresCopyScaffolder(dg.Scaffolder[PostgresCopyScaffoldParams]):
    """Writes a ``defs.yaml`` that loads as it is: one snapshot copy of the given tables, the
    other jobs commented out, each with what to fill in."""

    @classmethod
    def get_scaffold_params(cls) -> type[PostgresCopyScaffoldParams]:
        """The parameters ``dg scaffold defs`` accepts."""
        return PostgresCopyScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[PostgresCopyScaffoldParams]) -> None:
        """Writes the ``defs.yaml`` (Dagster's own file for ``--format python`` or an append)."""
        params = request.params or PostgresCopyScaffoldParams()
        if request.scaffold_format == "yaml" and not request.append:
            (request.target_path / "defs.yaml").write_text(defs_yaml(params))
            return
        attributes = {
            "source": {"dsn": f"{{{{ env.{params.source_dsn_env} }}}}"},
            "target": {"dsn": f"{{{{ env.{params.target_dsn_env} }}}}"},
            "snapshot_copies": [{"tables": list(params.tables), "strategy": "batched_copy"}],
        }
        dg.scaffold_component(request, attributes)
