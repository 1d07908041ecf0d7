"""A stream's run in its own process, for the crash and concurrency tests.

``python -m tests.incremental.child SOURCE_DSN TARGET_DSN BATCH_SIZE`` runs the stream of
``shop.orders`` (cursor ``updated_at``, hard deletes) once. It prints one line per phase
(``copy N``, ``apply N``, ``commit N``, ``committed N``), then ``done R`` with the rows the run
read, flushing each line so that the parent can ``kill -9`` it at a chosen moment.
"""

from __future__ import annotations

import sys

from dpone_dagster.incremental import BatchOutcome, IncrementalSync


def main() -> int:
    source, target, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    count = {"n": 0}

    def on_phase(phase: str) -> None:
        if phase == "copy":
            count["n"] += 1
        print(f"{phase} {count['n']}", flush=True)

    def on_batch(done: BatchOutcome) -> None:
        print(f"committed {done.receipt.sequence}", flush=True)

    sync = IncrementalSync(
        source, target, "shop.orders", cursor="updated_at", deletes="hard",
        batch_size=batch_size, on_phase=on_phase, on_batch=on_batch,
    )  # fmt: skip
    result = sync.run()
    print(f"done {result.rows}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
