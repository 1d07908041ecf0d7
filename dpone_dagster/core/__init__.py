"""The shared core the engines stand on. No Dagster.

The engines (the cursor engine and its two faces, replication, the sources) import from here,
never from each other:

* :mod:`.sessions`: how every engine transaction begins (isolation and read-only mode explicit)
  and how a failure ends them all; the session settings that fix how values are spelled.
* :mod:`.waits`: waits on the server's own state with a deadline.
* :mod:`.in_flight`: who had a transaction open when a mark was read, and waiting them out.
* :mod:`.read_window`: a read's window, snapshot and clock, as a lifecycle receipt.
* :mod:`.ledger_schema` and :mod:`.ledger`: the one durable ledger (every engine's tables, one
  migration path, revisioned documents, receipt rows, advisory locks).
* :mod:`.errors`: the engines' one error catalog.
"""

from .errors import ENGINE_ERRORS, EngineError, engine_error
from .ledger import LedgerConfig, LedgerStore
from .ledger_schema import DEFAULT_LEDGER_SCHEMA, LEDGER_VERSION

__all__ = [
    "DEFAULT_LEDGER_SCHEMA",
    "ENGINE_ERRORS",
    "LEDGER_VERSION",
    "EngineError",
    "LedgerConfig",
    "LedgerStore",
    "engine_error",
]
