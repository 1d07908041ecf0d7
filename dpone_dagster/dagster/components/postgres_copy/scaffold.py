"""``dg scaffold defs dpone_dagster.PostgresCopyComponent <path>``: a ``defs.yaml`` that loads as
it is."""

import dagster as dg
from pydantic import BaseModel, Field


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


class PostgresCopyScaffolder(dg.Scaffolder[PostgresCopyScaffoldParams]):
    """Writes a ``defs.yaml`` that loads as it is: one snapshot copy of the given tables."""

    @classmethod
    def get_scaffold_params(cls) -> type[PostgresCopyScaffoldParams]:
        """The parameters ``dg scaffold defs`` accepts."""
        return PostgresCopyScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[PostgresCopyScaffoldParams]) -> None:
        """Writes the ``defs.yaml``."""
        params = request.params or PostgresCopyScaffoldParams()
        attributes = {
            "source": {"dsn": f"{{{{ env.{params.source_dsn_env} }}}}"},
            "target": {"dsn": f"{{{{ env.{params.target_dsn_env} }}}}"},
            "snapshot_copies": [{"tables": list(params.tables), "strategy": "batched_copy"}],
        }
        dg.scaffold_component(request, attributes)
