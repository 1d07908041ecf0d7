"""A replication group's ``dpone_slot_healthy`` check with the source's standby known
(``PostgresSourceResource(standby_dsn=...)``), through Dagster against a real primary and its
physical standby (:mod:`tests.helpers.standby`): it warns while a promotion of the standby would
not keep the group going, and passes with the copy's figures once the standby holds the slot."""

from __future__ import annotations

from typing import Any

import dagster as dg

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    ReplicationOptions,
    replication_assets,
)
from dpone_dagster.dagster.metadata.replication import SLOT_CHECK_NAME
from tests.dagster.test_replication_assets import SHOP, unique_slot
from tests.helpers import pg
from tests.helpers.standby import standby_pair

ORDERS = dg.AssetKey(["shop", "orders"])


def _slot_check(result: dg.ExecuteInProcessResult) -> Any:
    """The ``dpone_slot_healthy`` evaluation of ``shop.orders``."""
    [check] = [
        e for e in result.get_asset_check_evaluations()
        if e.check_name == SLOT_CHECK_NAME and e.asset_key == ORDERS
    ]  # fmt: skip
    return check


def _values(check: Any) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in check.metadata.items()}


def test_the_slot_check_says_whether_the_standby_holds_the_slot(make_database: Any) -> None:
    """With ``standby_dsn`` set, each run's slot check reports whether the standby holds a copy
    of the slot a promotion keeps: a warning naming why while it does not (the copy is still
    temporary, or the slot is a plain one), then a pass with ``dpone/standby_holds_slot`` and
    how far the copy trails once it does, and a warning again once the copy trails the slot by
    more than the threshold (the standby's slot sync stopped)."""
    tgt = make_database("dpone_repl_fo_tgt")
    with standby_pair() as pair:
        src = pair.primary_dsn("source")
        pg.execute(src, SHOP)
        resources = {
            "source": PostgresSourceResource(dsn=src, standby_dsn=pair.standby_dsn("source")),
            "target": PostgresTargetResource(dsn=tgt),
            "ledger": LedgerResource(),
        }
        shop = replication_assets(["shop.orders", "shop.customers"],
                                  slot=unique_slot("dpone_fo"))  # fmt: skip

        def run() -> Any:
            result = dg.materialize([shop], resources=resources)
            assert result.success
            return _slot_check(result)

        first = run()  # the initial copy: the standby's copy is not kept yet
        first_values = _values(first)
        assert first_values["dpone/slot_failover"] is True
        assert first_values["dpone/standby_holds_slot"] is False
        assert not first.passed and first.severity == dg.AssetCheckSeverity.WARN
        assert "would not survive a failover" in (first.description or "")
        assert "dpone/standby_slot_lag_bytes" not in first_values

        def advance() -> None:
            pg.execute(src, "UPDATE shop.orders SET note = note || '.' WHERE id = 1")
            run()

        slot = shop.node_def.name.removeprefix("replication_")
        pair.wait_synced(slot, advance=advance)
        held = run()
        held_values = _values(held)
        assert held.passed, held.description
        assert held_values["dpone/standby_holds_slot"] is True
        assert isinstance(held_values["dpone/standby_slot_lag_bytes"], int)
        assert held_values["dpone/standby_slot_lag_bytes"] >= 0

        # The standby stops synchronizing slots: the group's runs move the primary's slot on,
        # the standby's copy stays where it was, and the check warns once it trails by more
        # than the threshold (the same group, declared with a threshold of 64 KiB).
        standby = pair.standby_dsn()
        pg.execute(standby, "ALTER SYSTEM SET sync_replication_slots = off")
        pg.execute(standby, "SELECT pg_reload_conf()")
        pg.wait_until(lambda: not pg.fetch_all(standby, "SELECT 1 FROM pg_stat_activity"
                                               " WHERE backend_type = 'slotsync worker'"),
                      timeout=30, what="the standby's slot sync worker ends")  # fmt: skip
        warn_early = ReplicationOptions(retained_wal_warn_bytes=64 * 1024)
        strict = replication_assets(["shop.orders", "shop.customers"], slot=slot,
                                    options=warn_early)  # fmt: skip
        pg.execute(
            src,
            "INSERT INTO shop.orders SELECT g, 1, md5(g::text) FROM generate_series(10, 3009) g",
        )  # about 300 KiB of WAL
        result = dg.materialize([strict], resources=resources)
        assert result.success
        trailing = _slot_check(result)
        lag = _values(trailing)["dpone/standby_slot_lag_bytes"]
        assert lag > 64 * 1024, lag
        assert not trailing.passed and trailing.severity == dg.AssetCheckSeverity.WARN
        assert f"standby's copy of slot {slot} trails it by {lag} bytes" in (
            trailing.description or ""
        )

        plain = replication_assets(["shop.customers"], slot=unique_slot("dpone_plain"),
                                   options=ReplicationOptions(failover=False),
                                   name="plain_group")  # fmt: skip
        other = {**resources, "target": PostgresTargetResource(dsn=make_database("dpone_fo_t2"))}
        result = dg.materialize([plain], resources=other)
        assert result.success
        [check] = [e for e in result.get_asset_check_evaluations()
                   if e.check_name == SLOT_CHECK_NAME]  # fmt: skip
        values = _values(check)
        assert values["dpone/slot_failover"] is False
        assert values["dpone/standby_holds_slot"] is False
        assert not check.passed and "not a failover slot" in (check.description or "")


def test_a_materialization_after_a_promotion_goes_on_from_the_synchronized_slot(
    make_database: Any,
) -> None:
    """The source resource's DSN names both servers (``target_session_attrs=read-write``): after
    the primary is stopped with ``-m immediate`` and the standby promoted, the next
    materialization goes on from the standby's copy of the slot, applying what the new primary
    committed, and the target equals it; the slot check now says the standby DSN is no standby
    any more."""
    tgt = make_database("dpone_repl_fo_tgt")
    with standby_pair() as pair:
        pg.execute(pair.primary_dsn("source"), SHOP)
        resources = {
            "source": PostgresSourceResource(dsn=pair.multi_host_dsn("source"),
                                             standby_dsn=pair.standby_dsn("source")),
            "target": PostgresTargetResource(dsn=tgt),
            "ledger": LedgerResource(),
        }  # fmt: skip
        shop = replication_assets(["shop.orders", "shop.customers"],
                                  slot=unique_slot("dpone_fo"))  # fmt: skip

        def materialize() -> dg.ExecuteInProcessResult:
            result = dg.materialize([shop], resources=resources)
            assert result.success
            return result

        materialize()
        slot = shop.node_def.name.removeprefix("replication_")
        source = pair.primary_dsn("source")
        pair.wait_synced(slot, advance=lambda: (
            pg.execute(source, "UPDATE shop.customers SET balance = balance + 1 WHERE id = 1"),
            materialize(),
        ))  # fmt: skip
        pg.execute(source, "INSERT INTO shop.orders VALUES (100, 2, 'before the failover')")
        pair.kill_primary()
        pair.promote()
        promoted = pair.standby_dsn("source")
        pg.execute(promoted, "INSERT INTO shop.orders VALUES (101, 3, 'after the failover')")
        pg.execute(promoted, "DELETE FROM shop.orders WHERE id = 1")
        check = _slot_check(materialize())
        for table in ("shop.orders", "shop.customers"):
            query = f"SELECT * FROM {table} ORDER BY id"  # test tables only
            assert pg.fetch_all(tgt, query) == pg.fetch_all(promoted, query), table
        assert _values(check)["dpone/standby_holds_slot"] is False
        assert "not a standby" in (check.description or "")
