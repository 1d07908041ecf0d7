"""One engine run in its own process, for the crash and concurrency tests of every engine.

``python -m tests.helpers.crash_child ENGINE SOURCE_DSN TARGET_DSN BATCH_SIZE`` runs one engine's
job to the end: ``backfill`` backfills ``public.mixed`` (cursor ``id``), ``backfill_keyless``
the same into a target it creates with its key deferred (``key`` printed before the key is
built), ``incremental`` runs the
stream of ``shop.orders`` (cursor ``updated_at``, hard deletes) once, ``kafka`` (SOURCE is
``BOOTSTRAP/TOPIC``) runs the stream ``TOPIC -> events.clicks`` (append) in runs of at most
BATCH_SIZE messages until one reads nothing, ``replication`` runs the replication group
``shop.orders`` + ``shop.lines`` (slot ``dpone_crash``, BATCH_SIZE changes per target transaction)
once, ``replication_keyless`` the group of the keyless ``shop.events`` (slot
``dpone_crash_keyless``) once, ``replication_join``, ``replication_lines`` and
``replication_all`` the group of slot ``dpone_crash`` with other tables (a table joins, one
leaves) once. It prints one line per
phase the engine reports (``copy N``, ``apply N``, ``commit N``; a replication's ``next N``: a
target transaction begun on one target session while the one before is applied on the other),
one per committed batch
(``committed N``, or ``replayed N`` for a batch answered by replay), then ``done`` and the rows
read, flushing each line so that the parent can ``kill -9`` it at a chosen moment
(:func:`tests.helpers.crash.kill_at`). An engine error prints ``error CODE`` and exits 3.

A new engine's crash test adds its runner to :data:`ENGINES`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dpone_dagster.backfill import (
    Backfill,
    BackfillOptions,
    BatchResult,
    prepare_target,
)
from dpone_dagster.incremental import BatchOutcome, IncrementalOptions, IncrementalSync
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import KafkaCopyOptions, KafkaSettings, KafkaSource, copy_topic


class Phases:
    """Prints the engine's phases, numbering batches by their ``copy`` phase."""

    def __init__(self) -> None:
        self.batch = 0

    def on_phase(self, phase: str) -> None:
        """Prints ``PHASE N`` (the engine's ``committed`` phase is printed by ``on_batch``)."""
        if phase == "copy":
            self.batch += 1
        if phase != "committed":
            print(f"{phase} {self.batch}", flush=True)

    @staticmethod
    def committed(sequence: int, replayed: bool = False) -> None:
        """Prints ``committed N`` (or ``replayed N``)."""
        print(f"{'replayed' if replayed else 'committed'} {sequence}", flush=True)


def backfill(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Backfills ``public.mixed`` to its mark; the rows it copied."""

    def on_batch(result: BatchResult) -> None:
        phases.committed(result.receipt.sequence, result.replayed)

    options = BackfillOptions(batch_size=batch_size)
    job = Backfill(source, target, "public.mixed", cursor="id", options=options,
                   on_phase=phases.on_phase)  # fmt: skip
    return job.run(on_batch=on_batch).run.progress.copied_count


def backfill_keyless(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Backfills ``public.mixed`` as ``backfill_asset``'s step does a target it creates: the
    table created with its key deferred, the batches loaded keyless, ``key`` printed, the key
    built, then the reconciliation. A target that exists already (a resume) is loaded keyed,
    its deferred key built first. The rows it copied."""

    def on_batch(result: BatchResult) -> None:
        phases.committed(result.receipt.sequence, result.replayed)

    table = TableName("public", "mixed")
    prepared = prepare_target(source, target, table, table, "id", defer_key=True)
    options = BackfillOptions(batch_size=batch_size)
    with Backfill(source, target, table, cursor="id", options=options, on_phase=phases.on_phase,
                  keyless_load=prepared.deferred_key) as job:  # fmt: skip
        job.run(on_batch=on_batch, reconcile=False)
        print("key", flush=True)
        job.build_key()
        return job.run().run.progress.copied_count


def incremental(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Runs the stream of ``shop.orders`` once; the rows it read."""

    def on_batch(done: BatchOutcome) -> None:
        phases.committed(done.receipt.sequence)

    sync = IncrementalSync(
        source, target, "shop.orders", cursor="updated_at",
        options=IncrementalOptions(deletes="hard", batch_size=batch_size, reconcile=False),
        on_phase=phases.on_phase, on_batch=on_batch,
    )  # fmt: skip
    return sync.run().rows


def kafka(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Copies the topic into ``events.clicks`` run after run; the messages read."""
    bootstrap, topic = source.split("/", 1)
    settings = KafkaSettings(bootstrap, timeout=20.0)
    table = TableName("events", "clicks")
    read = 0
    while True:
        phases.on_phase("copy")
        source_ = KafkaSource(settings, topic, KafkaCopyOptions(max_messages_per_run=batch_size))
        report = copy_topic(source_, target, table)
        phases.committed(report.run)
        read += report.messages
        if report.messages == 0:
            return read


def replication(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Runs the replication group ``shop.orders`` + ``shop.lines`` once; the changes it
    applied (``copy`` lines: the initial copy's start and each block of staged changes, inside
    a source transaction)."""
    return _replicate(("shop.orders", "shop.lines"), "dpone_crash", source, target, batch_size,
                      phases)  # fmt: skip


def replication_keyless(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Runs the replication group of the keyless ``shop.events`` (slot
    ``dpone_crash_keyless``) once, as :func:`replication` does."""
    return _replicate(("shop.events",), "dpone_crash_keyless", source, target, batch_size,
                      phases)  # fmt: skip


def replication_join(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Runs the group of slot ``dpone_crash`` as ``shop.orders`` + ``shop.extra`` once (after
    :func:`replication`'s runs, ``shop.lines`` leaves and ``shop.extra`` joins; it adopts a
    target that a former membership filled). ``joining`` and ``joined`` lines: the joining
    table's copy starts, and commits."""
    return _replicate(("shop.orders", "shop.extra"), "dpone_crash", source, target, batch_size,
                      phases, adopt=True)  # fmt: skip


def replication_lines(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """:func:`replication`'s group, adopting a target a former membership filled (after
    :func:`replication_join`'s runs, ``shop.extra`` leaves and ``shop.lines`` joins again)."""
    return _replicate(("shop.orders", "shop.lines"), "dpone_crash", source, target, batch_size,
                      phases, adopt=True)  # fmt: skip


def replication_all(source: str, target: str, batch_size: int, phases: Phases) -> int:
    """Runs the group of slot ``dpone_crash`` with all three tables once (adopting, as
    :func:`replication_join`)."""
    return _replicate(("shop.orders", "shop.lines", "shop.extra"), "dpone_crash", source, target,
                      batch_size, phases, adopt=True)  # fmt: skip


def _replicate(
    tables: tuple[str, ...],
    slot: str,
    source: str,
    target: str,
    batch_size: int,
    phases: Phases,
    *,
    adopt: bool = False,
) -> int:
    from dpone_dagster.replication import ReplicationOptions
    from dpone_dagster.replication.engine import Replication
    from dpone_dagster.replication.group_plan import ReplicationGroup
    from dpone_dagster.replication.replication_report import ReplicationProgress

    def on_progress(step: ReplicationProgress) -> None:
        if step.phase in ("copy", "stage"):
            phases.on_phase("copy")
        elif step.phase in ("apply", "commit", "next"):
            phases.on_phase(step.phase)
        elif step.phase == "committed":
            phases.committed(step.transactions)
        elif step.phase == "advanced":
            print("advanced", flush=True)
        elif step.phase in ("joining", "joined"):
            print(step.phase, flush=True)

    unchecked = ReplicationOptions(reconcile=False)
    group = ReplicationGroup(tuple(TableName.parse(t) for t in tables), slot=slot,
                             publication=slot, options=unchecked)  # fmt: skip
    job = Replication(group, source=source, target=target, on_progress=on_progress,
                      batch_changes=batch_size, adopt=adopt)  # fmt: skip
    report = job.run()
    return report.changes


ENGINES: dict[str, Callable[[str, str, int, Phases], int]] = {
    "backfill": backfill,
    "backfill_keyless": backfill_keyless,
    "incremental": incremental,
    "kafka": kafka,
    "replication": replication,
    "replication_keyless": replication_keyless,
    "replication_join": replication_join,
    "replication_lines": replication_lines,
    "replication_all": replication_all,
}


def main() -> int:
    engine, source, target, batch_size = sys.argv[1:5]
    try:
        rows = ENGINES[engine](source, target, int(batch_size), Phases())
    except DponeError as exc:
        print(f"error {exc.code}", flush=True)
        return 3
    print(f"done {rows}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
