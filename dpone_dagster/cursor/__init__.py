"""The cursor engine: a source table copied in cursor order into a target, under one of two
policies (a high-water mark fixed when the run is planned, or a mark each run takes again).
No Dagster.

Its faces are :mod:`dpone_dagster.backfill` (the fixed mark) and
:mod:`dpone_dagster.incremental` (the moving mark); it stands on the shared core and imports
neither face. :mod:`.table_check` is the one check of a job's tables, with one refusal
vocabulary whose codes each policy keeps (:data:`dpone_dagster.core.errors.TABLE_REFUSALS`).
"""
