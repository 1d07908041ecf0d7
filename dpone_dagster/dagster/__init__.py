"""The Dagster layer: thin wiring of the engines into Dagster, no SQL of its own.

Its rooms, each importing only from the rooms below it and from the engines:

- :mod:`~dpone_dagster.dagster.components`: ``PostgresCopyComponent`` (YAML).
- :mod:`~dpone_dagster.dagster.jobs`: the ``acquire -> extract -> load -> settle`` job.
- :mod:`~dpone_dagster.dagster.assets`: the asset factories, PostgreSQL and generic sources.
- :mod:`~dpone_dagster.dagster.resources`: the resources, whose methods return the event
  iterators (``source.copy_tables``, ``source.backfill``, ``source.incremental``,
  ``mysql.copy_table``, ``rest.copy_table``).
- :mod:`~dpone_dagster.dagster.events`: the event iterators, one skeleton for every job, taking
  plain values (the databases, the ledger's settings, the options objects).
- :mod:`~dpone_dagster.dagster.metadata`, :mod:`~dpone_dagster.dagster.partitions`,
  :mod:`~dpone_dagster.dagster.translator`, :mod:`~dpone_dagster.dagster.failures`: what a
  materialization says (every ``dpone/`` key declared once, in its job's set:
  :mod:`~dpone_dagster.dagster.metadata.keys`), cursor-range partitions, asset specs, run
  failures.
- :mod:`~dpone_dagster.dagster.run_plane`: the instance storage check and the Celery run
  launcher (the ``celery`` extra; nothing in the package imports it).

What a Dagster user imports is at the top level, :mod:`dpone_dagster`.
"""
