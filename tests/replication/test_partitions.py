"""Partitioned tables against real servers, with the source on PostgreSQL 15 and on 18 (and,
in the cross-server set, the target on the other): replicated through their parent, whatever
partition holds a row; rows that move between partitions; partitions created, attached,
detached, truncated alone and dropped; a parent named with its own partition refused before
anything is made; a group whose publication did not publish through the root healed."""

from __future__ import annotations

import pytest

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.identifiers import TableName
from tests.helpers import pg
from tests.replication.group import Group

pytestmark = pytest.mark.cross_server

SCHEMA = """
CREATE SCHEMA app;
CREATE TABLE app.users (id int PRIMARY KEY, name text);
CREATE TABLE app.events (id bigint, day int, v text, PRIMARY KEY (id, day))
    PARTITION BY RANGE (day);
CREATE TABLE app.events_a PARTITION OF app.events FOR VALUES FROM (0) TO (10);
CREATE TABLE app.events_b PARTITION OF app.events FOR VALUES FROM (10) TO (20);
INSERT INTO app.users SELECT g, 'u' || g FROM generate_series(1, 5) g;
INSERT INTO app.events SELECT g, g %% 20, 'e' || g FROM generate_series(1, 200) g;
"""
EVENTS, USERS = TableName("app", "events"), TableName("app", "users")


def _published(src: str) -> list[tuple[object, ...]]:
    """Whether the group's publication publishes through the root, and the tables it names."""
    return pg.fetch_all(
        src,
        "SELECT p.pubviaroot, r.prrelid::regclass::text FROM pg_publication p"
        " JOIN pg_publication_rel r ON r.prpubid = p.oid ORDER BY 2",
    )


def test_a_partitioned_table_replicates_through_its_parent_as_partitions_come_and_go(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """Every partition's rows reach the one target table: moved rows, a partition created or
    attached (merged, the target not copied again), detached, truncated alone or dropped (the
    parent copied again alone); the other table is never copied again."""
    src = versioned_source_dsn
    pg.execute(src, SCHEMA)
    group = Group(src, target_dsn, ("app.users", "app.events"))
    assert group.run().initial_copy is not None
    group.assert_equal()
    assert _published(src) == [(True, "app.events"), (True, "app.users")]
    users, events = group.target_oid("app.users"), group.target_oid("app.events")
    # Rows inserted in each partition, one moved to the other by its key, one deleted, and a
    # partition created with CREATE TABLE ... PARTITION OF that takes rows at once.
    pg.execute(src, "INSERT INTO app.events VALUES (1001, 3, 'new a'), (1002, 13, 'new b')")
    pg.execute(src, "UPDATE app.events SET day = day + 10, v = 'moved' WHERE id IN (1, 2, 3)")
    pg.execute(src, "DELETE FROM app.events WHERE id = 4")
    pg.execute(
        src, "CREATE TABLE app.events_c PARTITION OF app.events FOR VALUES FROM (20) TO (30)"
    )
    pg.execute(src, "INSERT INTO app.events VALUES (1003, 25, 'in c'), (1004, 21, 'in c')")
    report = group.run()
    assert (report.tables_joined, report.partitions_merged) == ((), (TableName("app", "events_c"),))
    group.assert_equal()
    assert (group.target_oid("app.users"), group.target_oid("app.events")) == (users, events)
    # A table with rows of its own attached as a partition: the WAL carries none of them.
    pg.execute(
        src,
        "CREATE TABLE app.events_old (id bigint, day int, v text, PRIMARY KEY (id, day));"
        "INSERT INTO app.events_old"
        " SELECT g, 30 + g %% 10, 'old' FROM generate_series(5000, 5050) g;"
        "ALTER TABLE app.events ATTACH PARTITION app.events_old FOR VALUES FROM (30) TO (40);"
        "UPDATE app.events SET v = 'changed after attach' WHERE id = 5000",
    )
    report = group.run()
    assert report.partitions_merged == (TableName("app", "events_old"),)
    group.assert_equal()
    assert group.target_oid("app.events") == events
    # A partition detached, one truncated alone, one dropped: none of their rows leave through
    # the WAL, so the parent is copied again, alone, each time.
    for n, change in enumerate((
        "ALTER TABLE app.events DETACH PARTITION app.events_a",
        "TRUNCATE app.events_b",
        "DROP TABLE app.events_c",
    )):  # fmt: skip
        pg.execute(src, change)
        pg.execute(src, "INSERT INTO app.events VALUES (%s, 35, 'x')", (9000 + n,))
        report = group.run()
        assert (report.tables_joined, report.partitions_merged) == ((EVENTS,), ()), change
        assert report.join_copies and report.join_copies[0].tables[0].target == EVENTS
        group.assert_equal()
        assert group.target_oid("app.users") == users
    quiet = group.run()
    assert (quiet.tables_joined, quiet.partitions_merged, quiet.transactions) == ((), (), 0)


def test_a_parent_named_with_its_own_partition_is_refused_before_anything_is_made(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """At the first run (nothing created) and when a streaming group would take a partition of
    one of its tables (the publication left as it was): ``replication_partition_overlap``."""
    src = versioned_source_dsn
    pg.execute(src, SCHEMA)
    pg.execute(
        src,
        "CREATE TABLE app.sub (id bigint, day int, v text, PRIMARY KEY (id, day))"
        " PARTITION BY RANGE (day); ALTER TABLE app.events DETACH PARTITION app.events_b;"
        "ALTER TABLE app.sub ATTACH PARTITION app.events_b FOR VALUES FROM (10) TO (20);"
        "ALTER TABLE app.events ATTACH PARTITION app.sub FOR VALUES FROM (10) TO (20)",
    )
    for tables, partition in (
        (("app.events", "app.events_a"), "app.events_a is a partition of app.events"),
        (("app.events_b", "app.users", "app.events"), "app.events_b is a partition of app.events"),
    ):
        with pytest.raises(DponeError) as caught:
            Group(src, target_dsn, tables).run()
        assert caught.value.code == "replication_partition_overlap"
        assert partition in caught.value.message and caught.value.next_actions
        assert pg.fetch_one(src, "SELECT count(*) FROM pg_replication_slots WHERE database ="
                                 " current_database()") == 0  # fmt: skip
        assert pg.fetch_one(src, "SELECT count(*) FROM pg_publication") == 0
    group = Group(src, target_dsn, ("app.users", "app.events"))
    group.run()
    with pytest.raises(DponeError) as caught:
        Group(src, target_dsn, ("app.users", "app.events", "app.sub")).run()
    assert caught.value.code == "replication_partition_overlap"
    assert _published(src) == [(True, "app.events"), (True, "app.users")]
    group.run()
    group.assert_equal()


def test_a_group_whose_publication_did_not_publish_through_the_root_heals(
    versioned_source_dsn: str, target_dsn: str
) -> None:
    """A publication without ``publish_via_partition_root`` (as the release before this one
    made it) sent the partitions' changes under their own names, which the group does not
    apply: the next run turns the option on and copies the partitioned table again, alone."""
    src = versioned_source_dsn
    pg.execute(src, SCHEMA)
    group = Group(src, target_dsn, ("app.users", "app.events"))
    group.run()
    users = group.target_oid("app.users")
    pg.execute(src, "ALTER PUBLICATION dpone_test_pub SET (publish_via_partition_root = false)")
    pg.execute(src, "INSERT INTO app.events VALUES (7001, 1, 'lost to a leaf name')")
    pg.execute(src, "UPDATE app.users SET name = 'still applied' WHERE id = 1")
    report = group.run()
    assert report.tables_joined == (EVENTS,)
    assert report.tables[0].updated == 1  # users streamed as ever
    group.assert_equal()
    assert group.target_oid("app.users") == users
    assert _published(src) == [(True, "app.events"), (True, "app.users")]
