"""The engines' one error catalog: a stable code, a message and the next actions for each.

Every deliberate failure of an engine (the ordered backfill, the incremental stream) is an
:class:`EngineError` built from :data:`ENGINE_ERRORS` by :func:`engine_error`, so an operator (or
a program branching on ``error.code``) finds every code, its meaning and what to do about it in
one place. The backfill's codes (``plan_invalid`` to ``backfill_persistence_failed``) are those
of the ordered-backfill protocol the project started from, plus
``backfill_high_water_mark_unsettled`` (a transaction in flight when the high-water mark was
taken did not finish in time). The stream's codes start with ``incremental_``: a bad stream
(``incremental_primary_key_missing``, ``incremental_cursor_invalid``,
``incremental_cursor_unindexed``, ``incremental_cursor_null``, ``incremental_target_key_differs``,
``incremental_options_invalid``) is refused when the run is planned, before anything is written;
so is a cursor that is not a column of the table, in both engines (``cursor_not_found``), and a
stream's source table that does not exist (``table_not_found``). The refusals of the cursor
engine's one table check (:class:`TableRefusal`) take their codes from :data:`TABLE_REFUSALS`,
one column per policy, so each engine keeps the codes it had;
``incremental_mark_unsettled`` is not raised but names, in a run's notices, transactions that
were still open when the run's settle timeout ran out. The Kafka source's codes start with
``kafka_`` (raised as :class:`~dpone_dagster.sources.SourceError` from this catalog). The
replication's start with ``replication_`` (and ``publication_not_permitted``,
``replica_identity_missing``): a source that cannot replicate is refused before anything is
created, and so is a group that cannot change as asked (a parent named with its own partition,
a table dropped at the source, a publication dropped by hand).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum, StrEnum
from typing import Final

from dpone_dagster.lifecycle import DponeError


class EngineError(DponeError):
    """A deliberate engine failure with a stable code (see :data:`ENGINE_ERRORS`)."""


RECORD_CHANGED_ACTIONS: Final[tuple[str, ...]] = (
    "Inspect the differing ranges (ledger table backfill_range_checks): if the target is wrong, "
    "fix it and reconcile again (Backfill.reconcile, or run the partition again).",
    "If the source table changes under the backfill (rows updated or deleted after they were "
    'copied), run the partition again with on_changed="repair" (Backfill, backfill_asset, '
    "the ledger resource's backfill): the differing ranges are rewritten from one source "
    "snapshot, and the partition is labelled repaired_to_one_snapshot.",
    "To keep a changing table current after its backfill, use incremental_asset.",
)
"""The next actions of ``backfill_record_changed``: fix a wrong target, or repair from the
source, or keep a changing table current incrementally."""

ENGINE_ERRORS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "plan_invalid": (
        "The backfill plan is invalid.",
        ("Fix the source table, cursor or partition range and plan again.",),
    ),
    "destination_expansion_incomplete": (
        "The target table is not ready to receive the backfill.",
        (
            "Create the target table with the source's columns and types, the same primary "
            "key and an index whose first column is the cursor, then plan again.",
        ),
    ),
    "backfill_cursor_missing": (
        "An online backfill needs a trustworthy cursor or a bounded write pause.",
        (
            "Declare a trustworthy cursor column (monotonic, indexed) or run inside a "
            "bounded write pause.",
        ),
    ),
    "cursor_not_found": (
        "The cursor column is not a column of the source table; nothing was created or written.",
        ("Name one of the table's columns as the cursor (the message lists them).",),
    ),
    "backfill_high_water_mark_unsettled": (
        "Transactions that were in flight when the high-water mark was taken did not finish.",
        (
            "End or wait out the listed sessions, then plan again; a transaction that reserved "
            "a cursor value below the mark could otherwise commit after its batch was copied.",
        ),
    ),
    "backfill_batch_unordered": (
        "The batch does not advance strictly beyond the durable checkpoint in cursor order.",
        ("Resume the source query strictly after the checkpoint's cursor value.",),
    ),
    "backfill_checkpoint_stale": (
        "The expected checkpoint is stale: newer durable progress exists for this run.",
        ("Reload the durable run (Backfill.load) and resume from its current checkpoint.",),
    ),
    "backfill_batch_changed": (
        "A committed batch id was reused with different contents.",
        ("Resume with the original batch or allocate the next ordered batch id.",),
    ),
    "backfill_record_changed": (
        "A copied record differs from the source.",
        RECORD_CHANGED_ACTIONS,
    ),
    "backfill_schema_changed": (
        "The source's copied columns changed during the run; it does not evolve mid-run, because "
        "the batches it already committed hold the old columns.",
        (
            "Either restore the source's columns as they were and run again: the run resumes "
            "after its last durable checkpoint.",
            "Or start the partition over under the new columns: change the target table to "
            "the source's new columns, delete the partition's rows from the target, and run "
            "again (a new run, with its own id, copies the partition from its start).",
        ),
    ),
    "backfill_key_duplicated": (
        "The target holds a key more than once, so the primary key the backfill deferred while "
        "it loaded the table it created cannot be built; nothing was changed.",
        (
            "Find the rows put in beside the backfill (the message shows some of the keys), "
            "delete the ones the source does not hold, and run again: the key is built first, "
            "then the run resumes after its last durable checkpoint.",
        ),
    ),
    "backfill_run_invalid": (
        "The backfill run failed its integrity validation.",
        ("Resume from the last integrity-valid durable revision; do not edit ledger rows.",),
    ),
    "backfill_persistence_failed": (
        "PostgreSQL failed; the last durable checkpoint is intact.",
        (
            "Restore PostgreSQL availability and run again: it resumes after the last durable "
            "checkpoint.",
        ),
    ),
    "incremental_failed": (
        "PostgreSQL failed during the stream's run; its committed batches are intact.",
        ("Run again: the stream resumes after its last committed batch.",),
    ),
    "incremental_options_invalid": (
        "The incremental stream's options are invalid.",
        ("Fix the option named in the message.",),
    ),
    "table_not_found": (
        "The source table does not exist.",
        ("Check the schema and table name, and the database the DSN names.",),
    ),
    "incremental_primary_key_missing": (
        "The source table has no primary key.",
        (
            "Add a primary key to the source table: the merge and the delete detection match "
            "rows by it.",
        ),
    ),
    "incremental_cursor_invalid": (
        "The cursor column is missing or of a type that cannot order a stream.",
        ("Name a column of type integer, numeric, date, timestamp or timestamptz.",),
    ),
    "incremental_cursor_unindexed": (
        "No index of the source table starts with the cursor column.",
        (
            "CREATE INDEX CONCURRENTLY ON the source table (cursor): without it every run "
            "scans the whole table.",
        ),
    ),
    "incremental_cursor_null": (
        "Rows of the source table have a NULL cursor: no run would ever copy them.",
        (
            "Fill the NULL cursor values and make the column NOT NULL (or choose another "
            "cursor), then run again.",
        ),
    ),
    "incremental_target_key_differs": (
        "The target table's primary key differs from the source's.",
        (
            "Give the target the source's primary key (same columns, same order), or copy into "
            "a new target table.",
        ),
    ),
    "incremental_backfill_incomplete": (
        "The stream cannot continue from the backfill: it is not complete.",
        (
            "Finish the backfill of every partition (backfill_asset), then run again; or run "
            "without continue_from_backfill to copy the table from the start.",
        ),
    ),
    "incremental_stream_stale": (
        "The stream's state changed under this run (another run advanced it).",
        ("Run again: the stream resumes from its newest durable state.",),
    ),
    "incremental_mark_unsettled": (
        "Transactions open when the mark was taken were still open after the settle timeout.",
        (
            "End the listed sessions (or set idle_in_transaction_session_timeout): until they "
            "end, each run reads again from the mark before they began, so none of their rows "
            "is lost, at the cost of re-reading that range.",
        ),
    ),
    # Replication from the WAL, the apply side (dpone_dagster/replication/engine.py).
    "replication_options_invalid": (
        "The replication group's options are invalid.",
        ("Fix the option named in the message.",),
    ),
    "replication_target_exists": (
        "A target table of the group already holds rows, and the first run of a group copies "
        "every table; nothing was written.",
        (
            "Run with adopt=True to take the existing target tables over (filled by "
            "backfill_asset or incremental_asset): each is checked against the source's columns "
            "by the schema-change policy, then copied again under the slot's snapshot, so the "
            "stream starts from exactly that state.",
            "Or drop or empty the target tables, then run again.",
        ),
    ),
    "replication_group_changed": (
        "The replication group names another publication than the one its slot was created "
        "with; nothing was written.",
        ("Run once with resync=True: every table of the group is copied again under a new slot.",),
    ),
    "replication_join_overtaken": (
        "The group's applied position passed the snapshot a joining table was copied under (a "
        "run of the group streamed meanwhile); the copy was not committed.",
        ("Run again: the table is copied under a new snapshot and then joins the stream.",),
    ),
    "replication_toast_unresolved": (
        "An update left a TOASTed value unchanged, but neither the run's changes nor the target "
        "hold the row's value; nothing of the run's transaction was committed.",
        (
            "The target table was changed outside the replication: run once with resync=True "
            "to copy the group again.",
        ),
    ),
    "replication_row_missing": (
        "An update or delete of a table without a primary key names a row (its old values) the "
        "target does not hold; nothing of the run's transaction was committed.",
        (
            "The target table was changed outside the replication: run once with resync=True "
            "to copy the group again.",
        ),
    ),
    "replication_failed": (
        "The replication run failed: the target transactions it committed stay, each with "
        "its applied position in the ledger, and the one in progress, if any, was rolled back.",
        (
            "Check both servers, then run again: the run resumes after the ledger's applied "
            "position.",
        ),
    ),
    # The Kafka source (dpone_dagster/sources/kafka.py): a topic into a PostgreSQL table.
    "kafka_options_invalid": (
        "The Kafka copy's options are invalid.",
        ("Fix the option named in the message.",),
    ),
    "kafka_unreachable": (
        "The Kafka broker did not answer.",
        (
            "Check that the broker runs and that bootstrap_servers reaches it (host, port, "
            "security_protocol); nothing was written to the target.",
        ),
    ),
    "kafka_authentication_failed": (
        "The Kafka broker refused the login.",
        (
            "Check sasl_mechanism, sasl_username and the password (pass it with "
            "EnvVar('KAFKA_PASSWORD')); nothing was written to the target.",
        ),
    ),
    "kafka_topic_unknown": (
        "The Kafka topic does not exist on the broker.",
        ("Check the topic's name, or create the topic first; nothing was written.",),
    ),
    "kafka_message_invalid": (
        "A Kafka message could not be loaded; nothing of the run's messages was committed and "
        "the ledger's offsets did not move.",
        (
            "Fix or skip the message at the source, loosen the model (a field | None), or set "
            "dead_letter_table= so bad messages are kept there with their reason.",
        ),
    ),
    "kafka_key_missing": (
        "A Kafka message has no key, and the merge sink keeps one row per key; nothing of the "
        "run's messages was committed.",
        (
            "Produce keyed messages to the topic, use sink='append', or set dead_letter_table= "
            "to keep unkeyed messages there.",
        ),
    ),
    "kafka_offsets_lost": (
        "The broker no longer holds the messages at the offset the ledger resumes from "
        "(deleted by retention, or the topic was recreated); nothing was written.",
        (
            "Run once with on_lost_offsets='earliest' to restart those partitions from the "
            "earliest offset the broker holds: the messages named in the message are lost for "
            "the target (re-produce them, or accept the gap).",
        ),
    ),
    "kafka_read_failed": (
        "Reading the Kafka topic failed mid-run; nothing of the run's messages was committed.",
        ("Check the broker and the network, then run again: the run resumes from the ledger.",),
    ),
    # Replication from the WAL (dpone_dagster/replication/): the source's setup, refused before
    # anything is created (replication/setup.py), the slot (replication/slot.py) and the decoder.
    "replication_wal_level": (
        "The source server's wal_level is not logical, so its WAL cannot be decoded; nothing "
        "was created.",
        (
            "On the source server run ALTER SYSTEM SET wal_level = logical and restart it (a "
            "managed service sets it by its own parameter: RDS rds.logical_replication = 1, "
            "Cloud SQL the cloudsql.logical_decoding flag, Azure azure.replication_support = "
            "logical), then run again.",
        ),
    ),
    "replication_privilege_missing": (
        "The source role may not use a replication slot (it lacks the REPLICATION attribute); "
        "nothing was created.",
        (
            "Run ALTER ROLE <role> WITH REPLICATION on the source as a superuser (on RDS: GRANT "
            "rds_replication TO <role>; on Cloud SQL: ALTER USER <role> WITH REPLICATION), then "
            "run again.",
        ),
    ),
    "replication_slots_exhausted": (
        "Every replication slot the source server allows is in use (max_replication_slots); "
        "nothing was created.",
        (
            "Drop a slot nobody uses (SELECT pg_drop_replication_slot(name), after checking "
            "pg_replication_slots), or raise max_replication_slots on the source (ALTER SYSTEM "
            "SET max_replication_slots = <n>, then restart), then run again.",
        ),
    ),
    "publication_not_permitted": (
        "The source role may not create the group's publication: it does not own every table "
        "of the group (or may not create in the database); nothing was created.",
        (
            "Have the tables' owner (or a superuser) create the publication: CREATE PUBLICATION "
            "<name> FOR TABLE <tables> (the message names both), or make the role the tables' "
            "owner, then run again.",
        ),
    ),
    "replication_slot_foreign": (
        "A replication slot of the group's name exists and was not made by dpone for this group "
        "(another plugin, another database or another consumer); it was left untouched.",
        (
            "Choose another slot name for the group (slot=), or drop that slot if nothing uses "
            "it (SELECT pg_drop_replication_slot(name)), then run again.",
        ),
    ),
    "replica_identity_missing": (
        "A table of the group has no primary key and no REPLICA IDENTITY FULL, so its updates "
        "and deletes cannot be replicated; nothing was created.",
        (
            "Add a primary key to the table, or run ALTER TABLE <table> REPLICA IDENTITY FULL on "
            "the source, then run again.",
        ),
    ),
    "replication_slot_active": (
        "The replication slot is in use by another session; it was left untouched.",
        (
            "Wait for the other run to finish, or end its session (the message names its pid: "
            "pg_terminate_backend(pid)), then run again; a run waits for the slot as long as its "
            "lock_wait (ConnectionOptions) before it fails.",
        ),
    ),
    "replication_slot_missing": (
        "The group's replication slot does not exist on the source (dropped, or never made); "
        "nothing was applied.",
        (
            "Run once with resync=True: the slot is created again and the tables are copied "
            "anew under its snapshot (changes made while there was no slot are not in any WAL "
            "the group can read).",
        ),
    ),
    "replication_slot_lost": (
        "The group's replication slot is lost: the source removed WAL it still needed "
        "(max_slot_wal_keep_size), so changes since its position cannot be read; nothing was "
        "applied.",
        (
            "Run once with resync=True: the slot is dropped and created again and the tables "
            "are copied anew under its snapshot.",
            "Then run the group more often, or raise max_slot_wal_keep_size on the source, so "
            "that the slot keeps up.",
        ),
    ),
    "replication_partition_overlap": (
        "The group names a partitioned table and one of its own partitions: the parent's "
        "changes already carry the partition's rows; nothing was created or changed.",
        (
            "Name only the parent (every partition's rows replicate through it), or only "
            "partitions, then run again.",
        ),
    ),
    "replication_table_dropped": (
        "A table of the group no longer exists at the source (dropped, or renamed); nothing "
        "was changed.",
        (
            "Take the table out of the group's tables and run again: the other tables go on, "
            "and its target table is kept as it is (every change up to its drop applied).",
            "Or create the table again at the source (or name it by its new name): the next "
            "run copies it alone under a snapshot whose place in the stream is known, as a "
            "table that joins the group.",
        ),
    ),
    "replication_publication_missing": (
        "The group's publication no longer exists at the source (dropped by hand): the changes "
        "made while it did not exist cannot be decoded (PostgreSQL 15 fails the slot's read at "
        "that point, 16 and later skip them); nothing was applied.",
        (
            "Run once with resync=True: the publication and the slot are created again and "
            "the tables copied anew under the slot's snapshot.",
        ),
    ),
    "replication_senders_exhausted": (
        "Every WAL sender the source server allows is in use (max_wal_senders): the slot's "
        "snapshot is taken on a replication connection; nothing was created.",
        (
            "End a replication connection nobody needs (pg_stat_replication, "
            "pg_stat_activity WHERE backend_type = 'walsender'), or raise max_wal_senders on "
            "the source (ALTER SYSTEM SET max_wal_senders = <n>, then restart), then run "
            "again.",
        ),
    ),
    "replication_failover_unsupported": (
        "The group asks for a failover slot (failover=True), and the source server is older "
        "than PostgreSQL 17, which added them; nothing was created.",
        (
            "Upgrade the source to PostgreSQL 17 or later, or leave failover unset (a failover "
            "slot where the server supports it) or False (a plain slot), then run again.",
        ),
    ),
    "replication_failover_slot_missing": (
        "The source was promoted from a standby (its timeline changed since the target's "
        "applied position) and has no slot of the group: the standby never held a synchronized "
        "copy of it, so the changes since the target's position cannot be read; nothing was "
        "written.",
        (
            "Run once with resync=True: the slot is created on the new primary and the tables "
            "are copied anew under its snapshot.",
            "Then make the group's slot survive the next failover: a failover slot (PostgreSQL "
            "17+), sync_replication_slots = on and hot_standby_feedback = on on the standby, "
            "and the standby's physical slot in synchronized_standby_slots on the primary "
            "(docs/replication.md, Failover).",
        ),
    ),
    "replication_standby_slot_missing": (
        "The source's synchronized_standby_slots names a physical slot the server does not "
        "have (or has invalidated): a failover slot's reader would wait for that standby "
        "forever, so the run did not read the slot; nothing was written.",
        (
            "On the source, set synchronized_standby_slots to the physical slots of its "
            "standbys (ALTER SYSTEM SET synchronized_standby_slots = '<slot>', then SELECT "
            "pg_reload_conf()), or to '' when it has none; a promoted standby keeps its old "
            "primary's setting, which names its own slot there. Then run again.",
        ),
    ),
    "replication_source_diverged": (
        "The source's history forked before what the target holds: the server was promoted "
        "from a standby that had not received transactions the target already applied, so the "
        "target holds changes the new primary never had, and the new primary's positions past "
        "the fork name other transactions; nothing was written.",
        (
            "Run once with resync=True: the tables are copied anew from the new primary under "
            "a new slot's snapshot.",
            "Then list the standby's physical slot in synchronized_standby_slots on the "
            "primary, so that a slot's reader never receives a transaction the standby lacks "
            "(docs/replication.md, Failover).",
        ),
    ),
    "replication_message_invalid": (
        "A message read from the replication slot is not one of pgoutput's protocol version 1; "
        "nothing of it was applied.",
        ("Report the message's first bytes (in the message) with the source's version.",),
    ),
}
"""Every engine code with its default message and next actions."""


def engine_error(
    code: str, detail: str | None = None, next_actions: Sequence[str] | None = None
) -> EngineError:
    """Builds the error for ``code`` with its catalogued message and next actions.

    Args:
        code: A key of :data:`ENGINE_ERRORS`.
        detail: A sentence appended to the message (what exactly was found).
        next_actions: Replaces the catalogued next actions when given.

    Returns:
        The error, ready to raise.

    Raises:
        KeyError: for a code that is not catalogued (a programming error).
    """
    return EngineError.from_catalog(ENGINE_ERRORS, code, detail, next_actions)


class TableRefusal(StrEnum):
    """Why the cursor engine's one table check refuses a job's tables
    (:mod:`dpone_dagster.cursor.table_check`); each refusal's code per policy is in
    :data:`TABLE_REFUSALS`."""

    SOURCE_MISSING = "source_missing"
    """The source table does not exist."""
    CURSOR_MISSING = "cursor_missing"
    """The cursor is not one of the source's copied columns."""
    CURSOR_TYPE = "cursor_type"
    """The cursor's type cannot order a copy (not one of the cursor types)."""
    PRIMARY_KEY = "primary_key"
    """The source table has no primary key: rows could not be matched in the target."""
    CURSOR_INDEX = "cursor_index"
    """No index of the source starts with the cursor: every batch would scan the table."""
    TARGET_KEY = "target_key"
    """The target's primary key is not the source's."""
    CURSOR_NULL = "cursor_null"
    """Rows of the source have a NULL cursor: no range holds them."""
    TARGET_NOT_READY = "target_not_ready"
    """A fixed mark's target is missing, lacks or retypes a column, or has no cursor index."""


class RefusalColumn(IntEnum):
    """Whose codes a table refusal takes: a column of :data:`TABLE_REFUSALS`."""

    FIXED_MARK = 0
    """The ordered backfill's (a high-water mark fixed when the run is planned)."""
    MOVING_MARK = 1
    """The incremental stream's (a mark taken again by every run)."""


TABLE_REFUSALS: Final[dict[TableRefusal, tuple[str, str]]] = {
    TableRefusal.SOURCE_MISSING: ("plan_invalid", "table_not_found"),
    TableRefusal.CURSOR_MISSING: ("cursor_not_found", "cursor_not_found"),
    TableRefusal.CURSOR_TYPE: ("plan_invalid", "incremental_cursor_invalid"),
    TableRefusal.PRIMARY_KEY: ("plan_invalid", "incremental_primary_key_missing"),
    TableRefusal.CURSOR_INDEX: ("plan_invalid", "incremental_cursor_unindexed"),
    TableRefusal.TARGET_KEY: ("destination_expansion_incomplete", "incremental_target_key_differs"),
    TableRefusal.CURSOR_NULL: ("plan_invalid", "incremental_cursor_null"),
    TableRefusal.TARGET_NOT_READY: (
        "destination_expansion_incomplete", "destination_expansion_incomplete",
    ),
}  # fmt: skip
"""Each table refusal's code under a fixed mark and under a moving mark (by
:class:`RefusalColumn`): the codes each engine gave before they shared the check, kept because
users branch on them (``error.code``, ``dpone/error_code``)."""


def refusal_error(
    refusal: TableRefusal,
    column: RefusalColumn,
    detail: str,
    next_actions: Sequence[str] | None = None,
) -> EngineError:
    """The error of a table refusal under a policy's codes (see :data:`TABLE_REFUSALS`).

    Args:
        refusal: What the table check refused.
        column: The policy whose code the refusal takes.
        detail: What exactly was found (a sentence appended to the code's message).
        next_actions: Replaces the code's catalogued next actions when given.

    Returns:
        The error, ready to raise.
    """
    return engine_error(TABLE_REFUSALS[refusal][column], detail, next_actions)
