"""The demo code location: `dagster dev` (via workspace.yaml) and the README's demo command load it.

The demo assets arrive with the Dagster surface; until then the location loads empty.
"""

from __future__ import annotations

import dagster as dg

defs = dg.Definitions()
