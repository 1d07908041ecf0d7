"""The cursor engine: a source table copied in cursor order into a target, under one of two
policies (a high-water mark fixed when the run is planned, or a mark each run takes again).
No Dagster.

Its faces are :mod:`dpone_dagster.backfill` (the fixed mark) and
:mod:`dpone_dagster.incremental` (the moving mark); it stands on the shared core and imports
neither face. :mod:`.table_check` is the one check of a job's tables, with one refusal
vocabulary whose codes each policy keeps (:data:`dpone_dagster.core.errors.TABLE_REFUSALS`).

The durable side: each policy's wire documents (:mod:`.backfill_documents`,
:mod:`.stream_documents`, :mod:`.range_checks`), the pure rules (:mod:`.run_rules`,
:mod:`.batch_rules`, :mod:`.chain`; cursor order in :mod:`.cursor_sql`), and one ledger facade
over today's tables, :class:`.cursor_ledger.CursorLedger`, bound per policy by
:class:`~.cursor_ledger.RunLedger` and :class:`~.cursor_ledger.StreamLedger`.
"""
