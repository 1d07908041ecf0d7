"""The demo code location (``definitions.py``) as Celery workers run it.

A Celery worker executes each run inside its prefork pool process, which may not start child
processes ("daemonic processes are not allowed to have children"), so the runs use Dagster's
in-process executor instead of the default multiprocess one. Everything else is the demo's.
"""

import dagster as dg

import definitions

defs = dg.Definitions.merge(definitions.defs, dg.Definitions(executor=dg.in_process_executor))
