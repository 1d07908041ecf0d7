"""Regenerates the pictures of docs/metadata.md and docs/replication.md: the Dagster UI on the
demo, headless Chromium.

Run from the repository root after ``bash demo/run`` (or let this script run it)::

    .venv/bin/python docs/screenshots.py            # runs the demo first
    .venv/bin/python docs/screenshots.py --no-demo  # uses the runs already in .dagster_home
    .venv/bin/python docs/screenshots.py --no-demo --only replication_lag  # just these shots

The replication group's plots need its two runs of ``demo/replication.py`` (the initial copy,
then the changes): ``bash demo/run`` leaves them, as it leaves the other shots' runs.

It starts ``dagster-webserver`` on the demo's instance (``$DAGSTER_HOME``, by default
``.dagster_home``) on a free port, drives Debian's ``chromium`` (``apt-get install chromium``)
over the DevTools protocol, waits for each page to show what it is about (never a fixed sleep),
and writes the PNGs under ``docs/img/``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img"
WIDTH, HEIGHT = 1400, 900


@dataclass(frozen=True)
class Shot:
    """One picture: the page, the text that shows it has rendered, and an optional click."""

    name: str
    path: str
    ready_text: str
    clicks: tuple[str, ...] = ()
    scroll_to_text: str | None = None
    height: int = HEIGHT


SHOTS = [
    Shot(
        "backfill_partitions",
        "/assets/events/page_views?view=partitions&partition=2026-01-15",
        "dpone/rows_per_second",
    ),
    Shot("column_schema", "/assets/shop/orders", "PRIMARY KEY (id)"),
    Shot(
        "materialization_metadata",
        "/assets/shop/orders?view=events",
        "dagster/column_schema",
        height=1500,
    ),
    Shot(
        "metadata_plots",
        "/assets/shop/customers",
        "dpone/rows_per_second",
        clicks=("Plots",),
        scroll_to_text="Table",
        height=1800,
    ),
    Shot(
        "backfill_plots",
        "/assets/events/page_views",
        "dpone/rows_per_second",
        clicks=("Plots", "Events"),  # the partition's figures over time
        scroll_to_text="Table",
        height=1800,
    ),
    Shot("lineage", "/assets/shop/orders?view=lineage&lineageScope=neighbors", "sources"),
    # The stream's checks: dpone_fresh (its lag against the policy its schedule implies).
    Shot("stream_freshness", "/assets/shop/stock?view=checks", "dpone_fresh"),
    # A replicated table's slot lag, run over run (the demo's initial copy, then its changes).
    Shot(
        "replication_lag",
        "/assets/live/orders",
        "dpone/lag_bytes",
        clicks=("Plots",),
        height=1450,  # its plots are in alphabetical order: dpone/lag_bytes and lag_seconds first
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float = 120) -> Any:
    """The JSON ``url`` answers, once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.load(response)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A background process (its own session), ended with its children."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


class Page:
    """One Chromium tab, driven over the DevTools protocol."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        return result.get("result", {}).get("value")

    def wait_for_text(self, text: str, timeout: float = 60, *, shown: bool = True) -> None:
        """Waits until the page shows ``text`` (or, ``shown=False``, no longer shows it): the
        UI's own state, never a fixed sleep."""
        deadline = time.monotonic() + timeout
        probe = f"!!document.body && document.body.innerText.includes({json.dumps(text)})"
        while self.evaluate(probe) is not shown:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never {'showed' if shown else 'cleared'} {text!r}")
            time.sleep(0.2)

    def wait_for_charts(self, timeout: float = 60) -> None:
        """Waits until the page has drawn charts and they stopped animating: their pixels are
        the same in two reads in a row."""
        pixels = "[...document.querySelectorAll('canvas')].map(c => c.toDataURL()).join()"
        deadline = time.monotonic() + timeout
        previous = None
        while True:
            current = self.evaluate(pixels)
            if current and current == previous:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the charts never settled")
            previous = current
            time.sleep(0.5)

    def click_text(self, text: str) -> None:
        """Clicks the last button or tab whose text is exactly ``text`` (a view's own toggle
        comes after the page's tabs of the same name)."""
        script = f"""(() => {{
            const all = [...document.querySelectorAll('button, [role=tab], a')];
            const hit = all.reverse().find(e => e.innerText.trim() === {json.dumps(text)});
            if (hit) {{ hit.click(); return true; }}
            return false;
        }})()"""
        if not self.evaluate(script):
            raise RuntimeError(f"nothing to click named {text!r}")

    def scroll_to(self, text: str) -> None:
        """Scrolls the button named ``text`` to the top of its scrolling pane."""
        self.evaluate(f"""(() => {{
            const all = [...document.querySelectorAll('button')];
            const hit = all.find(e => e.innerText.trim() === {json.dumps(text)});
            if (hit) hit.scrollIntoView({{block: 'start'}});
        }})()""")

    def settle(self) -> None:
        """Waits for two animation frames, so the last render is painted."""
        self.evaluate(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))"
        )

    def screenshot(self, shot: Shot, base: str) -> bytes:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=WIDTH, height=shot.height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        self.call("Page.navigate", url=base + shot.path)
        self.wait_for_text(shot.ready_text)
        self.wait_for_text("Loading", shown=False)
        for text in shot.clicks:
            self.click_text(text)
        if shot.clicks:
            self.wait_for_charts()
        if shot.scroll_to_text:
            self.scroll_to(shot.scroll_to_text)
        self.settle()
        data = self.call("Page.captureScreenshot", format="png")["data"]
        return base64.b64decode(data)


def take(base: str, shots: list[Shot], profile: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is missing: apt-get install -y chromium")
    port = free_port()
    argv = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--remote-debugging-port={port}", f"--user-data-dir={profile}", "about:blank",
    ]  # fmt: skip
    with process(argv, dict(os.environ), profile.parent / "chromium.log"):
        wait_http(f"http://127.0.0.1:{port}/json/version")
        [target] = [
            t for t in wait_http(f"http://127.0.0.1:{port}/json/list") if t["type"] == "page"
        ]
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            page = Page(ws)
            page.call("Page.enable")
            OUT.mkdir(parents=True, exist_ok=True)
            for shot in shots:
                (OUT / f"{shot.name}.png").write_bytes(page.screenshot(shot, base))
                print(f"docs/img/{shot.name}.png")


def graphql(base: str, query: str) -> Any:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-demo", action="store_true", help="use the runs already recorded")
    names = [shot.name for shot in SHOTS]
    parser.add_argument(
        "--only", nargs="+", choices=names, metavar="NAME", help=f"take these shots: {names}"
    )
    args = parser.parse_args()
    shots = [shot for shot in SHOTS if args.only is None or shot.name in args.only]
    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", str(ROOT / ".dagster_home"))
    if not args.no_demo:
        subprocess.run(["bash", str(ROOT / "demo" / "run")], env=env, check=True)
    port = free_port()
    webserver = Path(sys.executable).parent / "dagster-webserver"
    argv = [str(webserver), "-w", "workspace.yaml", "-p", str(port), "-h", "127.0.0.1"]
    with (
        tempfile.TemporaryDirectory() as scratch,
        process(argv, env, Path(scratch) / "webserver.log"),
    ):
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/server_info")
        # The first visit shows a newsletter dialog; the instance records it as seen.
        graphql(base, "mutation { setNuxSeen }")
        take(base, shots, Path(scratch) / "profile")


if __name__ == "__main__":
    main()
