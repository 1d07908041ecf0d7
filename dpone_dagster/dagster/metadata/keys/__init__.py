"""Every ``dpone/`` key of metadata, declared once, in the set of the job that writes it: one
module per set, so that a job's events import its own keys and the common ones, not every job's.

- :mod:`.common`: :class:`~.common.CommonMetadataSet` (keys several jobs write: the tables an
  asset names, what a load did, the source read and its rates, a run's batches, a check's
  guarantee, the next actions) and :class:`~.common.FailureMetadataSet` (a run's failure).
- :mod:`.copy`: :class:`~.copy.CopyMetadataSet` (a snapshot copy).
- :mod:`.backfill`: :class:`~.backfill.PartitionMetadataSet` (a backfill's partitions and its
  checks).
- :mod:`.batch`: :class:`~.batch.BatchMetadataSet` (a committed batch's observation).
- :mod:`.incremental`: :class:`~.incremental.IncrementalMetadataSet` (an incremental run).
- :mod:`.stream_check`: :class:`~.stream_check.StreamCheckMetadataSet` (the
  ``dpone_reconciled`` check of an incremental stream or a replicated table).
- :mod:`.replication`: :class:`~.replication.ReplicationMetadataSet` (a replication group) and
  :class:`~.replication.SlotMetadataSet` (its slot).
- :mod:`.kafka`: :class:`~.kafka.KafkaMetadataSet` (a Kafka topic's copy).
- :mod:`.freshness`: :class:`~.freshness.FreshnessMetadataSet` (a stream's ``dpone_fresh``).

Every set is a :class:`~.base.DponeSet`; :mod:`dpone_dagster.dagster.metadata.sets` gathers
them all (``DponeMetadataSet``) with the run tags, and generates the docs' reference.
"""
