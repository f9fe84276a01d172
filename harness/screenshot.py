"""Headless Chromium (Debian's `chromium`), driven over the DevTools protocol: `browser()` gives a
page to open URLs in and evaluate JavaScript on (tests/test_docs_browser.py reads the built site
that way); `screenshot()` opens a page, puts values in its local storage (a login), opens it
again, and takes the picture once a text shows anywhere in it (shadow roots included) and the
page has been still for a moment.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from websockets.sync.client import ClientConnection, connect

from .wait import TIMEOUT, wait_until

CHROMIUM: Final = "chromium"
"""Debian's package and program (scripts/system-packages.txt)."""
_DEVTOOLS: Final = re.compile(r"DevTools listening on (ws://[^\s]+)")
_FIND_TEXT: Final = r"""
(() => {
  const wanted = %s;
  const seen = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { seen.push(node.textContent); return; }
    if (node.nodeName === "STYLE" || node.nodeName === "SCRIPT") return;
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) walk(child);
  };
  walk(document.documentElement);
  const text = seen.join(" ").replace(/\s+/g, " ");
  return wanted === null ? location.href + " | " + text : wanted.every((w) => text.includes(w));
})()
"""
"""True once every wanted text is on the page (its shadow roots walked: Home Assistant's
frontend is web components)."""


class Page:
    """One DevTools session on a page target."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        self._socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            reply = json.loads(self._socket.recv(TIMEOUT))
            if reply.get("id") == number:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The expression's value; None while the page is between two documents."""
        try:
            answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        except RuntimeError as err:
            if "navigated" in str(err) or "context" in str(err).lower():
                return None
            raise
        return answer.get("result", {}).get("value")

    def open(self, url: str) -> None:
        """Navigate and wait until the document is complete."""
        self.call("Page.navigate", url=url)
        wait_until(lambda: self.evaluate("document.readyState") == "complete", TIMEOUT, url)

    def capture(self, out: Path) -> None:
        """A PNG of the page as it shows now."""
        shot = self.call("Page.captureScreenshot", format="png")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))


@contextlib.contextmanager
def browser(width: int, height: int) -> Iterator[Page]:
    """A headless Chromium (no background networking, no first-run run) with one page of
    the given size, stopped on the way out."""
    program = shutil.which(CHROMIUM)
    assert program is not None, f"{CHROMIUM} is not installed: scripts/setup.sh installs it"
    # Chromium's helper processes may still write the profile for a moment after it exits:
    # its removal is retried below rather than failing the caller.
    with tempfile.TemporaryDirectory(
        prefix="voice-agent-chromium-", ignore_cleanup_errors=True
    ) as profile:
        process = subprocess.Popen(
            [
                program,
                "--headless=new",
                "--no-sandbox",  # root in a container: Chromium's own sandbox cannot start
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",  # no calls home, no component updates
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stderr is not None
            browser = ""
            deadline = time.monotonic() + TIMEOUT
            while not browser and time.monotonic() < deadline:
                line = process.stderr.readline()
                if not line and process.poll() is not None:
                    raise RuntimeError(f"{CHROMIUM} exited ({process.returncode})")
                if found := _DEVTOOLS.search(line):
                    browser = found[1]
            assert browser, f"{CHROMIUM} did not say where DevTools listen"
            port = browser.split(":")[2].split("/")[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=TIMEOUT) as r:
                targets = json.loads(r.read())
            target = next(t for t in targets if t.get("type") == "page")
            with connect(target["webSocketDebuggerUrl"], max_size=64 * 2**20) as socket:
                page = Page(socket)
                page.call("Page.enable")
                page.call("Runtime.enable")
                page.call(  # the page's own size, whatever the window's frame takes
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                yield page
        finally:
            process.terminate()
            try:
                process.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(TIMEOUT)
            for _ in range(50):  # its helpers' last writes to the profile
                shutil.rmtree(profile, ignore_errors=True)
                if not Path(profile).exists():
                    break
                time.sleep(0.1)


def screenshot(
    url: str,
    out: Path,
    texts: list[str],
    storage: Mapping[str, str] | None = None,
    size: tuple[int, int] = (1280, 960),
) -> None:
    """A PNG of `url` at `size` once each of `texts` shows; `storage` is put in the origin's
    local storage first (then the page is opened again)."""
    with browser(*size) as page:
        page.open(url)
        if storage:
            for key, value in storage.items():
                page.evaluate(f"localStorage.setItem({json.dumps(key)}, {json.dumps(value)})")
            page.open(url)

        def shown() -> bool:
            return page.evaluate(_FIND_TEXT % json.dumps(texts)) is True

        try:
            wait_until(shown, TIMEOUT, f"{texts} on {url}")
        except AssertionError as err:
            seen = str(page.evaluate(_FIND_TEXT % "null"))[:1500]
            raise AssertionError(f"{err}; the page shows: {seen}") from None
        time.sleep(2.0)  # its last requests answered and drawn (values, icons, fonts)
        page.capture(out)
