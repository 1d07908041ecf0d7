"""The pgoutput decoder and the reader, against real changes of a server with wal_level logical.

Every message kind is decoded from changes the server itself wrote: inserts, updates with and
without a key change, the old rows of REPLICA IDENTITY FULL, deletes, a truncate of several
tables, an unchanged TOAST value, NULLs and the hostile types (each value compared with the
server's own text of it). The reader peeks without consuming, stops at its LSN and at its budget
only at a transaction boundary, and holds a bounded number of messages.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from dpone_dagster.core.errors import EngineError
from dpone_dagster.replication import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Update,
    lsn_text,
    parse_lsn,
)
from dpone_dagster.replication.pgoutput import decode, new_tuple_text, row_change
from dpone_dagster.replication.reader import read_ahead, read_changes
from dpone_dagster.replication.slot import advance_slot, current_lsn, slot_status
from tests.helpers import logical

SLOT = "dpone_test_slot"
PUBLICATION = "dpone_test_pub"


@pytest.fixture
def source(logical_source_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit session of a fresh source database on the logical server."""
    with psycopg.connect(logical_source_dsn, autocommit=True) as conn:
        yield conn


def replicate(conn: psycopg.Connection[tuple[object, ...]], *tables: str) -> None:
    """A publication of ``tables`` and a slot, created after the tables exist."""
    conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(tables)}")
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))


def changes(
    conn: psycopg.Connection[tuple[object, ...]], max_changes: int | None = None, **kw: int
) -> list[Message]:
    """Every message up to the current LSN."""
    return [
        message
        for _, message in read_changes(
            conn,
            slot=SLOT,
            publication=PUBLICATION,
            upto_lsn=current_lsn(conn),
            max_changes=max_changes,
            **kw,
        )
    ]


def rows(messages: list[Message]) -> list[Message]:
    """The row changes alone (no begin, commit or relation)."""
    return [m for m in messages if isinstance(m, Insert | Update | Delete | Truncate)]


def oid(conn: psycopg.Connection[tuple[object, ...]], table: str) -> int:
    row = conn.execute("SELECT %s::regclass::oid::int8", (table,)).fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def test_the_replication_tests_source_runs_with_wal_level_logical(logical_server: str) -> None:
    assert logical.wal_level(logical_server) == "logical"


def test_inserts_updates_and_deletes_decode_with_their_keys_and_nulls(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE shop (id int PRIMARY KEY, name text, qty int)")
    replicate(source, "shop")
    with source.transaction():
        source.execute("INSERT INTO shop VALUES (1, 'one', 10), (2, NULL, NULL)")
        xid_row = source.execute("SELECT pg_current_xact_id()::text::int8").fetchone()
    source.execute("UPDATE shop SET qty = 11 WHERE id = 1")  # the key stays
    source.execute("UPDATE shop SET id = 3 WHERE id = 1")  # the key changes
    source.execute("DELETE FROM shop WHERE id = 2")
    messages = changes(source)

    begin, relation = messages[0], messages[1]
    assert isinstance(begin, Begin) and xid_row is not None and begin.xid == xid_row[0]
    assert abs(begin.commit_time - datetime.now(UTC)) < timedelta(minutes=5)
    assert isinstance(relation, Relation)
    assert (relation.oid, relation.schema, relation.name) == (oid(source, "shop"), "public", "shop")
    assert relation.replica_identity == "d"
    assert [(c.name, c.type_oid, c.is_key) for c in relation.columns] == [
        ("id", 23, True),
        ("name", 25, False),
        ("qty", 23, False),
    ]
    table = relation.oid
    assert rows(messages) == [
        Insert(table, (b"1", b"one", b"10")),
        Insert(table, (b"2", None, None)),
        Update(table, (b"1", b"one", b"11"), None),
        # A key change sends the old key (the other columns None).
        Update(table, (b"3", b"one", b"11"), (b"1", None, None)),
        Delete(table, (b"2", None, None)),
    ]
    # Every transaction is whole: a begin and a commit around its changes, in commit order.
    kinds = [type(m).__name__ for m in messages]
    assert kinds == [
        "Begin", "Relation", "Insert", "Insert", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Delete", "Commit",
    ]  # fmt: skip
    begins = [m for m in messages if isinstance(m, Begin)]
    commits = [m for m in messages if isinstance(m, Commit)]
    assert [b.final_lsn for b in begins] == [c.commit_lsn for c in commits]
    assert all(c.commit_lsn < c.end_lsn for c in commits)
    assert [c.commit_lsn for c in commits] == sorted(c.commit_lsn for c in commits)


def test_replica_identity_full_sends_the_whole_old_row(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE notes (body text, n int)")
    source.execute("ALTER TABLE notes REPLICA IDENTITY FULL")
    replicate(source, "notes")
    source.execute("INSERT INTO notes VALUES ('a', 1), (NULL, 2)")
    source.execute("UPDATE notes SET n = 20 WHERE n = 2")
    source.execute("DELETE FROM notes WHERE n = 1")
    messages = changes(source)
    relation = next(m for m in messages if isinstance(m, Relation))
    assert relation.replica_identity == "f"
    assert all(c.is_key for c in relation.columns)  # FULL: every column identifies the row
    table = relation.oid
    assert rows(messages) == [
        Insert(table, (b"a", b"1")),
        Insert(table, (None, b"2")),
        Update(table, (None, b"20"), (None, b"2")),
        Delete(table, (b"a", b"1")),
    ]


def test_a_truncate_of_several_tables_is_one_message_with_its_options(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE parent (id int PRIMARY KEY)")
    source.execute("CREATE TABLE child (id serial PRIMARY KEY, p int REFERENCES parent)")
    source.execute("CREATE TABLE other (id int PRIMARY KEY)")
    replicate(source, "parent", "child", "other")
    source.execute("INSERT INTO parent VALUES (1)")
    source.execute("INSERT INTO child (p) VALUES (1)")
    source.execute("TRUNCATE parent, child RESTART IDENTITY CASCADE")
    source.execute("TRUNCATE other")
    truncates = [m for m in changes(source) if isinstance(m, Truncate)]
    assert len(truncates) == 2
    assert set(truncates[0].relations) == {oid(source, "parent"), oid(source, "child")}
    assert (truncates[0].cascade, truncates[0].restart_identity) == (True, True)
    assert truncates[1] == Truncate((oid(source, "other"),), False, False)


def test_an_unchanged_toasted_value_decodes_as_unchanged_and_a_changed_one_whole(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)")
    # Out of line and uncompressed: a value this size is then TOASTed for certain.
    source.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    replicate(source, "docs")
    source.execute(
        "INSERT INTO docs SELECT 1, string_agg(md5(g::text), '') , 0 FROM generate_series(1, 400) g"
    )
    toasted = source.execute(
        "SELECT pg_relation_size(reltoastrelid) > 0 FROM pg_class WHERE relname = 'docs'"
    ).fetchone()
    assert toasted == (True,)  # the value lives in the TOAST table
    body = source.execute("SELECT body FROM docs").fetchone()
    assert body is not None and len(body[0]) == 12_800  # type: ignore[arg-type]
    source.execute("UPDATE docs SET n = 1")  # the TOASTed value does not change
    source.execute("UPDATE docs SET body = body || 'x', n = 2")  # it changes
    table = oid(source, "docs")
    assert rows(changes(source)) == [
        Insert(table, (b"1", str(body[0]).encode(), b"0")),
        Update(table, (b"1", UNCHANGED, b"1"), None),
        Update(table, (b"1", (str(body[0]) + "x").encode(), b"2"), None),
    ]
    assert repr(UNCHANGED) == "UNCHANGED"


HOSTILE = """
    id int PRIMARY KEY,
    mood mood,
    moods mood[],
    price positive,
    amount numeric,
    ratio double precision,
    tags text[],
    grid int[][],
    blob bytea,
    doc json,
    docb jsonb,
    at timestamptz,
    span interval,
    label text
"""

HOSTILE_ROWS = [
    "(1, 'happy', '{sad,happy}', 1.5, 'NaN', 'Infinity', '{\"a,b\",NULL,\"q\\\"uote\",\"\"}',"
    " '{{1,2},{3,4}}', '\\x00ff10', '{\"k\": [1, 2.50, null]}', '{\"k\": [1, 2.50, null]}',"
    " '2024-02-29 23:59:59.999999+00', '1 year -2 days 03:04:05.678', 'zwölf € 😀 \\ tab\t')",
    "(2, NULL, '{}', 0.001, '-Infinity', '-Infinity', NULL, NULL, '', 'null', '[]',"
    " 'infinity', '-178000000 years', '')",
    "(3, 'sad', NULL, 99999999999999999999.99999, 'Infinity', 'NaN', '{NULL}', '{}', NULL,"
    " '\"text\"', '\"text\"', '-infinity', '0', NULL)",
    "(4, 'happy', '{happy}', 7, '-0.000000000000000000001', '-0', '{\" \"}', '{{NULL}}',"
    ' \'\\x5c27\', \'{"deep": {"er": "x"}}\', \'{"b": 1, "a": 2}\', \'0001-01-01 00:00 BC\','
    " '-1 microseconds', 'line\nbreak')",
]


def test_the_hostile_types_arrive_as_exactly_the_servers_own_text(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    source.execute("CREATE DOMAIN positive AS numeric CHECK (VALUE > 0)")
    source.execute('CREATE SCHEMA "Odd Schema"')
    source.execute(f'CREATE TABLE "Odd Schema"."Hostile Table" ({HOSTILE})')
    replicate(source, '"Odd Schema"."Hostile Table"')
    source.execute(f'INSERT INTO "Odd Schema"."Hostile Table" VALUES {", ".join(HOSTILE_ROWS)}')
    messages = changes(source)
    relation = next(m for m in messages if isinstance(m, Relation))
    assert (relation.schema, relation.name) == ("Odd Schema", "Hostile Table")
    types = source.execute(
        "SELECT atttypid::int8 FROM pg_attribute"
        ' WHERE attrelid = \'"Odd Schema"."Hostile Table"\'::regclass AND attnum > 0'
        " ORDER BY attnum"
    ).fetchall()
    # The enum's, the enum array's and the domain's own OIDs (type messages came before).
    assert [c.type_oid for c in relation.columns] == [t[0] for t in types]
    inserted = [m.new for m in messages if isinstance(m, Insert)]
    # The server's text of every value, NULL as None: what the decoder must have kept exactly.
    texts = source.execute(
        "SELECT ARRAY[id::text, mood::text, moods::text, price::text, amount::text, ratio::text,"
        " tags::text, grid::text, blob::text, doc::text, docb::text, at::text, span::text, label]"
        ' FROM "Odd Schema"."Hostile Table" ORDER BY id'
    ).fetchall()
    expected = [tuple(None if v is None else v.encode() for v in row[0]) for row in texts]  # type: ignore[attr-defined]
    assert inserted == expected
    assert expected[0][4] == b"NaN" and expected[1][5] == b"-Infinity"  # the test's own premise


def test_read_changes_never_consumes_the_slot(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE t (id int PRIMARY KEY)")
    replicate(source, "t")
    source.execute("INSERT INTO t SELECT generate_series(1, 100)")
    before = slot_status(source, SLOT)
    first, second = changes(source), changes(source)
    assert len(rows(first)) == 100 and first == second
    after = slot_status(source, SLOT)
    assert before is not None and after is not None
    assert after.confirmed_flush_lsn == before.confirmed_flush_lsn
    # Only an advance moves it: past a transaction's end, that transaction is not read again.
    commit = next(m for m in first if isinstance(m, Commit))
    assert advance_slot(source, SLOT, commit.end_lsn) == commit.end_lsn
    assert changes(source) == []


def test_read_changes_stops_at_its_lsn(source: psycopg.Connection[tuple[object, ...]]) -> None:
    source.execute("CREATE TABLE t (id int PRIMARY KEY)")
    replicate(source, "t")
    source.execute("INSERT INTO t VALUES (1)")
    upto = current_lsn(source)
    source.execute("INSERT INTO t VALUES (2)")
    read = [
        m
        for _, m in read_changes(
            source, slot=SLOT, publication=PUBLICATION, upto_lsn=upto, max_changes=None
        )
    ]
    assert rows(read) == [Insert(oid(source, "t"), (b"1",))]
    assert isinstance(read[-1], Commit) and read[-1].commit_lsn < upto
    assert len(rows(changes(source))) == 2  # the later one is read by a later run


def test_the_budget_stops_only_at_a_transaction_boundary(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE t (id int PRIMARY KEY)")
    replicate(source, "t")
    source.execute("INSERT INTO t SELECT generate_series(1, 50)")
    source.execute("INSERT INTO t SELECT generate_series(51, 100)")
    read = changes(source, max_changes=10)
    # The whole first transaction (its 50 rows, past the budget of 10), none of the second.
    assert [m.new[0] for m in rows(read)] == [str(i).encode() for i in range(1, 51)]  # type: ignore[union-attr]
    assert isinstance(read[0], Begin) and isinstance(read[-1], Commit)
    assert len(read) == 53  # begin, relation, 50 inserts, commit: the server counts messages
    assert len(rows(changes(source, max_changes=53))) == 50  # reached at its commit: stop
    assert len(rows(changes(source, max_changes=54))) == 100  # one more: the next one whole
    with pytest.raises(ValueError, match="max_changes"):
        changes(source, max_changes=0)


def test_read_ahead_through_a_copy_reads_what_a_peek_reads_and_never_moves_the_slot(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    """:func:`~dpone_dagster.replication.reader.read_ahead` with its temporary copy, in rounds
    of 30 messages growing to 60 and more: the same changes, in the same order, as one peek (a
    round repeats the Relation message of a table it meets first: the same message), the
    budget kept at a transaction's boundary over the rounds, the group's slot unmoved, the copy
    gone after the read (and after a read closed early)."""
    source.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    replicate(source, "t")
    for start in range(1, 400, 20):  # 20 transactions of 20 rows: 22 messages each
        source.execute(
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
            (start, start + 19),
        )
    source.execute("UPDATE t SET v = 'x' WHERE id % 7 = 0")
    before = slot_status(source, SLOT)
    upto = current_lsn(source)

    def read(ahead: bool, budget: int | None = None) -> list[bytes]:
        chunks = read_ahead(source, slot=SLOT, publication=PUBLICATION, upto_lsn=upto,
                            max_changes=budget, round_changes=30, ahead=ahead)  # fmt: skip
        return [data for chunk in chunks for data in chunk]

    def changes_of(messages: list[bytes]) -> list[bytes]:
        return [m for m in messages if m[0] != ord("R")]

    peeked, ahead = read(ahead=False), read(ahead=True)
    assert len(peeked) == 1 + 20 * 22 + 57 + 2  # a relation, 20 x (begin, 20 rows, commit), ...
    assert changes_of(ahead) == changes_of(peeked) and len(ahead) > len(peeked)
    assert {m for m in ahead if m[0] == ord("R")} == {m for m in peeked if m[0] == ord("R")}
    budgeted = changes_of(read(ahead=True, budget=100))  # whole transactions, about 100 messages
    assert budgeted == changes_of(peeked)[: len(budgeted)] and budgeted[-1][0] == ord("C")
    assert 90 <= len(budgeted) <= 110
    early = read_ahead(source, slot=SLOT, publication=PUBLICATION, upto_lsn=upto,
                       max_changes=None, round_changes=30)  # fmt: skip
    next(early)
    early.close()  # a read closed early: its copy is dropped all the same
    after = slot_status(source, SLOT)
    assert before is not None and after is not None
    assert after.confirmed_flush_lsn == before.confirmed_flush_lsn
    copies = "SELECT count(*) FROM pg_replication_slots WHERE temporary AND database = %s"
    assert source.execute(copies, (source.info.dbname,)).fetchone() == (0,)


def test_a_large_transaction_is_read_with_bounded_client_memory(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)")
    replicate(source, "big")
    # One transaction of 100,000 rows of ~500 bytes: about 50 MB of values.
    source.execute(
        "INSERT INTO big SELECT g, repeat(md5(g::text), 16) FROM generate_series(1, 100000) g"
    )
    gc.collect()
    tracemalloc.start()
    try:
        count = total = 0
        for _, message in read_changes(
            source,
            slot=SLOT,
            publication=PUBLICATION,
            upto_lsn=current_lsn(source),
            max_changes=None,
            fetch_rows=1000,
        ):
            if isinstance(message, Insert):
                count += 1
                total += len(message.new[1])  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (count, total) == (100_000, 100_000 * 512)
    assert peak < 8 * 1024 * 1024, f"the reader held {peak / 2**20:.1f} MiB at its peak"


def test_a_message_that_is_not_pgoutput_version_1_is_refused_with_a_code(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    source.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    replicate(source, "t")
    source.execute("INSERT INTO t VALUES (1, 'abc')")
    raw = source.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '1', 'publication_names', %s)",
        (SLOT, PUBLICATION),
    ).fetchall()
    insert = next(bytes(r[0]) for r in raw if bytes(r[0])[:1] == b"I")  # type: ignore[arg-type]
    assert isinstance(decode(insert), Insert)
    for bad in (insert[:-2], b"Z" + insert[1:], insert[:8] + b"b" + insert[9:], insert + b"x", b""):
        with pytest.raises(EngineError) as caught:
            decode(bad)
        assert caught.value.code == "replication_message_invalid"


def test_reading_a_slot_that_does_not_exist_says_so_with_a_code(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    with pytest.raises(EngineError) as caught:
        list(
            read_changes(
                source, slot="no_such_slot", publication="p", upto_lsn=1 << 40, max_changes=None
            )
        )
    assert caught.value.code == "replication_slot_missing"
    assert "no_such_slot" in caught.value.message


def test_lsns_convert_to_and_from_the_servers_notation(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    row = source.execute(
        "SELECT pg_current_wal_lsn()::text, (pg_current_wal_lsn() - '0/0')::int8"
    ).fetchone()
    assert row is not None
    text, number = str(row[0]), int(row[1])  # type: ignore[call-overload]
    assert parse_lsn(text) == number and lsn_text(number) == text
    for bad in ("", "12", "0/", "/1", "G/1", "123456789/0"):
        with pytest.raises(ValueError, match="not an LSN"):
            parse_lsn(bad)


def test_the_fast_paths_text_is_the_decoded_values_joined_or_none_where_copy_needs_more(
    source: psycopg.Connection[tuple[object, ...]],
) -> None:
    """:func:`~dpone_dagster.replication.pgoutput.new_tuple_text` (the apply's fast path) on
    the server's own messages: an insert's and a plain update's row is the decoded values
    joined by tabs; a NULL, text that COPY escapes (tab, newline, backslash, carriage return),
    an update with its old key, a delete, an unchanged TOASTed value and a truncated message
    give None (the decoder's path, which codes a malformed message)."""
    source.execute("CREATE TABLE t (id int PRIMARY KEY, a text, b text)")
    replicate(source, "t")
    source.execute(
        "INSERT INTO t VALUES (1, 'plain', 'x'), (2, NULL, 'x'), (3, e'tab\\there', 'x')"
    )
    source.execute("INSERT INTO t VALUES (4, e'new\\nline', 'x'), (5, e'back\\\\slash', 'x'),"
                   " (7, 'x', e'carriage\\rreturn')")  # fmt: skip
    source.execute("UPDATE t SET a = 'upd' WHERE id = 1")
    source.execute("UPDATE t SET id = 10 WHERE id = 2")  # its old key is sent
    source.execute("INSERT INTO t VALUES (6, 'toast', repeat('y', 300000))")
    source.execute("UPDATE t SET a = 'kept' WHERE id = 6")  # b: an unchanged TOASTed value
    source.execute("DELETE FROM t WHERE id = 5")
    rows = [
        bytes(r[0])
        for r in source.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', %s) WHERE get_byte(data, 0) IN"
            " (73, 85, 68)",
            (SLOT, PUBLICATION),
        )
    ]
    fast = [new_tuple_text(r, 3) for r in rows]
    plain = [b"\t".join(row_change(r)[2]) for r, f in zip(rows, fast, strict=True) if f]
    assert fast == [b"1\tplain\tx", None, None, None, None, None, b"1\tupd\tx", None, fast[8],
                    None, None]  # fmt: skip
    assert fast[8] is not None and fast[8].startswith(b"6\ttoast\tyyy")
    assert [f for f in fast if f] == plain
    assert new_tuple_text(rows[0][:-2], 3) is None  # truncated: the decoder says why
    with pytest.raises(EngineError) as caught:
        row_change(rows[0][:-2])
    assert caught.value.code == "replication_message_invalid"
