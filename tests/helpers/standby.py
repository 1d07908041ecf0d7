"""A primary and its physical standby, both private clusters of the embedded PostgreSQL 18, for
the failover tests: the standby streams the primary's WAL through a physical slot
(``standby1``) and, unless told otherwise, synchronizes the primary's failover slots
(``sync_replication_slots``), while the primary makes its failover slots' consumers wait for
that standby (``synchronized_standby_slots``).

A test can kill the primary (``pg_ctl -m immediate``: no shutdown checkpoint, the WAL the
standby has not received is lost), promote the standby, and stop or start it. Both clusters
live in folders outside pytest's numbered temporary folders and are stopped and removed when
the block ends, whatever happened in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from dpone_dagster import embedded
from tests.helpers import pg

PHYSICAL_SLOT = "standby1"
"""The primary's physical slot the standby streams through (``primary_slot_name``)."""

SLOT_COLUMNS = (
    "slot_name, slot_type, database, synced, temporary, failover, invalidation_reason,"
    " (confirmed_flush_lsn - '0/0')::int8 AS confirmed_flush_lsn,"
    " (restart_lsn - '0/0')::int8 AS restart_lsn"
)
"""The columns of ``pg_replication_slots`` :meth:`StandbyPair.slot_row` reads (LSNs as bytes)."""


def _bin(name: str) -> str:
    """The path of the embedded PostgreSQL's program ``name``."""
    return str(Path(embedded._commands().__file__).parent / "pginstall" / "bin" / name)


def _run(args: list[str], what: str, timeout: float = 120) -> None:
    """Runs a PostgreSQL program as the server's system user (``runuser`` when root).

    Its output goes to temporary files, not pipes: ``pg_ctl start`` leaves a postmaster that
    inherits them, and a pipe would keep the call waiting.

    Raises:
        AssertionError: naming ``what``, with the program's output, when it fails.
    """
    command = [*(["runuser", "-u", embedded.SYSTEM_USER, "--"] if os.geteuid() == 0 else []),
               *args]  # fmt: skip
    with tempfile.TemporaryFile("w+") as out:
        result = subprocess.run(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=timeout, check=False
        )
        out.seek(0)
        output = out.read()
    assert result.returncode == 0, f"{what} failed ({result.returncode}): {output}"


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


@dataclass
class StandbyPair:
    """A running primary and its physical standby (see the module).

    Attributes:
        primary_folder: The primary's cluster folder (its data directory is ``data``).
        standby_folder: The standby's.
        primary_port: The primary's TCP port at ``127.0.0.1``.
        standby_port: The standby's.
    """

    primary_folder: Path
    standby_folder: Path
    primary_port: int
    standby_port: int

    def primary_dsn(self, db: str = "postgres") -> str:
        """The DSN of database ``db`` on the (first) primary."""
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/{db}"

    def standby_dsn(self, db: str = "postgres") -> str:
        """The DSN of database ``db`` on the standby (the new primary once promoted)."""
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/{db}"

    def multi_host_dsn(self, db: str = "postgres") -> str:
        """A DSN of both servers that connects to whichever accepts writes: the primary, or the
        standby once promoted (``target_session_attrs=read-write``)."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},"
            f"127.0.0.1:{self.standby_port}/{db}?target_session_attrs=read-write"
        )

    def kill_primary(self) -> None:
        """Stops the primary at once (``pg_ctl -m immediate``: its sessions end, nothing is
        flushed or sent to the standby any more)."""
        _run([_bin("pg_ctl"), "-D", str(self.primary_folder / embedded.DATA), "-w",
              "-m", "immediate", "stop"], "killing the primary")  # fmt: skip

    def promote(self) -> None:
        """Promotes the standby and returns once it accepts writes."""
        _run([_bin("pg_ctl"), "-D", str(self.standby_folder / embedded.DATA), "-w", "-t", "60",
              "promote"], "promoting the standby")  # fmt: skip
        recovering = pg.fetch_one(self.standby_dsn(), "SELECT pg_is_in_recovery()")
        assert recovering is False, "the standby is still in recovery after pg_ctl promote"

    def stop_standby(self) -> None:
        """Stops the standby (fast shutdown)."""
        _run([_bin("pg_ctl"), "-D", str(self.standby_folder / embedded.DATA), "-w",
              "-m", "fast", "stop"], "stopping the standby")  # fmt: skip

    def start_standby(self) -> None:
        """Starts the standby on its port (it resumes recovery, or runs as the primary once
        promoted). A standby refuses to start with ``max_wal_senders`` (and the other limits)
        lower than its primary's: it gets the embedded server's settings."""
        settings = {
            "port": str(self.standby_port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "''",
            "TimeZone": "UTC",
            "autovacuum": "off",
            **embedded.LOGICAL_SETTINGS,
        }
        options = " ".join(f"-c {name}={value}" for name, value in settings.items())
        data = self.standby_folder / embedded.DATA
        _run([_bin("pg_ctl"), "-D", str(data), "-w", "-t", "60", "-o", options,
              "-l", str(data / "server.log"), "start"], "starting the standby")  # fmt: skip

    def slot_row(self, dsn: str, slot: str) -> dict[str, Any] | None:
        """The row of ``slot`` in ``pg_replication_slots`` of the server of ``dsn`` (see
        :data:`SLOT_COLUMNS`), or None when it has none."""
        with _connect(dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                sql.SQL("SELECT {} FROM pg_replication_slots WHERE slot_name = %s").format(
                    sql.SQL(SLOT_COLUMNS)
                ),
                (slot,),
            )
            return cur.fetchone()

    def log_snapshot(self) -> None:
        """Writes a running-transactions record on the primary (``pg_log_standby_snapshot``):
        a logical slot's restart point moves only at such a record (the background writer
        logs one every 15 s), and the standby's copy of a slot becomes persistent only once
        the primary's restart point has passed what the standby reserved."""
        pg.execute(self.primary_dsn(), "SELECT pg_log_standby_snapshot()")

    def wait_synced(
        self, slot: str, timeout: float = 60, advance: Callable[[], object] | None = None
    ) -> dict[str, Any]:
        """Waits until the standby holds ``slot`` as a synchronized slot that survives a
        promotion (``synced``, not ``temporary``, not invalidated), and returns its row.

        A slot the standby synchronizes stays temporary until the primary's slot has moved past
        what the standby reserved for it: ``advance`` (a replication run, say) is called
        between polls, each time after :meth:`log_snapshot`, so that the slot's restart point
        can move.

        Raises:
            AssertionError: after ``timeout`` seconds, naming the last row the standby showed.
        """
        last: list[dict[str, Any] | None] = [None]

        def held() -> dict[str, Any] | None:
            row = last[0] = self.slot_row(self.standby_dsn(), slot)
            if row and row["synced"] and not row["temporary"] and not row["invalidation_reason"]:
                return row
            if advance is not None:
                self.log_snapshot()
                advance()
            return None

        try:
            row: dict[str, Any] | None = pg.wait_until(
                held, timeout=timeout, what=f"the standby holds {slot}", interval=0.1
            )
        except TimeoutError:
            raise AssertionError(
                f"the standby did not hold slot {slot} as synced, persistent and valid within "
                f"{timeout:g}s; its last row: {last[0]!r}"
            ) from None
        assert row is not None
        return row

    def wait_replayed(self, timeout: float = 30) -> None:
        """Waits until the standby has replayed the primary's WAL up to the primary's current
        position (a database or a table made on the primary is then on the standby)."""
        target = pg.fetch_one(self.primary_dsn(), "SELECT pg_current_wal_lsn()")

        def replayed() -> bool:
            return bool(
                pg.fetch_one(
                    self.standby_dsn(),
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                    (str(target),),
                )
            )

        pg.wait_until(replayed, timeout=timeout, what=f"the standby replayed up to {target}")


def _make_folder(prefix: str) -> Path:
    """A fresh folder the server's system user may write (``mkdtemp`` makes it root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o777)
    return folder


def _stop(folder: Path) -> None:
    """Stops the cluster of ``folder`` if it runs (immediate: nothing of it is kept)."""
    # Not embedded.running(): a standby's postmaster.pid says "standby", never "ready".
    if not (folder / embedded.DATA / "postmaster.pid").exists():
        return
    with contextlib.suppress(AssertionError):  # it ended meanwhile: nothing left to stop
        _run([_bin("pg_ctl"), "-D", str(folder / embedded.DATA), "-w", "-m", "immediate",
              "stop"], f"stopping the cluster of {folder}")  # fmt: skip


def _base_backup(pair: StandbyPair, *, sync_slots: bool) -> None:
    """Makes the standby's data directory from the primary (``pg_basebackup -R``) and sets it
    up to stream through :data:`PHYSICAL_SLOT` and, when ``sync_slots``, to synchronize the
    primary's failover slots."""
    data = pair.standby_folder / embedded.DATA
    # The dbname lands in primary_conninfo: the slot sync worker needs a database to connect to.
    conninfo = f"host=127.0.0.1 port={pair.primary_port} user=postgres dbname=postgres"
    # -c fast: the backup's checkpoint is immediate (the default, spread, takes ~90 s here).
    _run([_bin("pg_basebackup"), "-D", str(data), "-R", "-X", "stream", "-S", PHYSICAL_SLOT,
          "-c", "fast", "-d", conninfo], "pg_basebackup of the primary")  # fmt: skip
    lines = ["hot_standby_feedback = on"]
    if sync_slots:
        lines.append("sync_replication_slots = on")
    with open(data / "postgresql.auto.conf", "a") as conf:
        conf.write("\n".join(lines) + "\n")


@contextmanager
def standby_pair(
    *, database: str = "source", sync_slots: bool = True, synchronized: bool = True
) -> Iterator[StandbyPair]:
    """A primary with database ``database`` and a physical standby streaming from it, started
    for the block; both are stopped and removed when it ends.

    Args:
        database: A database created on the primary before the standby is made (it reaches
            the standby physically).
        sync_slots: The standby synchronizes the primary's failover slots
            (``sync_replication_slots = on``).
        synchronized: The primary's failover slots wait for the standby to confirm the WAL
            before a consumer gets it (``synchronized_standby_slots``): a consumer then never
            holds a transaction the standby lacks. Set after the base backup, so that the
            standby does not inherit it (promoted, it would wait for a slot it does not have).

    Raises:
        AssertionError: a server could not be started, backed up, or did not come up.
    """
    primary_folder = _make_folder("dpone_primary_")
    standby_folder = _make_folder("dpone_standby_")
    try:
        server = embedded.start(primary_folder)
        pair = StandbyPair(primary_folder, standby_folder, server.port, embedded._free_port())
        with _connect(pair.primary_dsn()) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (PHYSICAL_SLOT,))
        _base_backup(pair, sync_slots=sync_slots)
        pair.start_standby()
        if synchronized:
            with _connect(pair.primary_dsn()) as conn:
                conn.execute(
                    sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(
                        sql.Literal(PHYSICAL_SLOT)
                    )
                )
                conn.execute("SELECT pg_reload_conf()")
        yield pair
    finally:
        _stop(standby_folder)
        _stop(primary_folder)
        shutil.rmtree(standby_folder, ignore_errors=True)
        shutil.rmtree(primary_folder, ignore_errors=True)
