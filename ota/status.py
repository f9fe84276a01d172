"""`python -m ota status`: the inventory from retained topics, as a table or JSON, once or
refreshed in place.

Whatever the nodes retain, every node is listed and nothing they chose reaches the terminal raw:
the table escapes each cell and passes through `safe_text.terminal`; the JSON is ASCII
(`ensure_ascii`) with no NaN or infinity (`allow_nan=False`; the records hold none)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Final, TextIO

from ota import inventory
from ota.connection import BrokerSettings
from ota.fleet import Fleet
from ota.safe_text import say, terminal

CLEAR: Final = "\x1b[H\x1b[2J"
"""ANSI: cursor home, clear screen (for --watch on a terminal)."""


def run(
    settings: BrokerSettings,
    *,
    group: str | None = None,
    as_json: bool = False,
    watch: bool = False,
    interval: float = 2.0,
    stale_after: float = inventory.DEFAULT_STALE_AFTER,
    sync_timeout: float = 10.0,
    out: TextIO = sys.stdout,
    rounds: int | None = None,
) -> int:
    """Print the inventory (with `watch`, every `interval` s until Ctrl-C or `rounds`)."""
    fleet = Fleet(settings, events=False)
    with _ended_by_interrupt(watch) as ended:
        try:
            if not fleet.sync(sync_timeout):
                say(
                    "warning: retained messages may be incomplete (no echo of the tool's marker"
                    f" on {settings.prefix}/_ota/...; nothing arrived for {sync_timeout:.0f} s)",
                    sys.stderr,
                )
            shown = 0
            while not ended.is_set():
                now = time.time()
                records = fleet.inventory.records(group)
                bridges = fleet.inventory.bridges()
                if as_json:
                    document = inventory.report(records, now, stale_after, bridges)
                    if watch:  # one document per line
                        text = json.dumps(document, separators=(",", ":"), allow_nan=False)
                    else:
                        text = json.dumps(document, indent=1, allow_nan=False)
                else:
                    heading = f"{settings.prefix}/ at {settings.address}, {inventory.iso(now)}"
                    if group is not None:
                        heading += f", group {group}"
                    body = inventory.table(records, now, stale_after, bridges)
                    if not records:
                        body = f"no node has announced itself under {settings.prefix}/"
                    text = terminal(f"{heading}\n\n{body}")
                    if watch and out.isatty():
                        text = CLEAR + text  # the tool's own sequence, after the guard
                print(text, file=out, flush=True)
                _unread(fleet)
                shown += 1
                if not watch or (rounds is not None and shown >= rounds) or ended.wait(interval):
                    return 0
            return 0
        except KeyboardInterrupt:  # once, or while not watching
            return 0
        finally:
            fleet.close()


@contextmanager
def _ended_by_interrupt(watch: bool) -> Iterator[threading.Event]:
    """While watching, Ctrl-C (SIGINT) sets the event the loop waits on instead of raising
    KeyboardInterrupt wherever the main thread happens to be: one raised inside a `with lock`
    could leave the lock held and the MQTT thread stuck at close."""
    ended = threading.Event()
    if not watch or threading.current_thread() is not threading.main_thread():
        yield ended
        return

    def interrupted(signum: int, frame: FrameType | None) -> None:
        ended.set()

    before = signal.signal(signal.SIGINT, interrupted)
    try:
        yield ended
    finally:
        signal.signal(signal.SIGINT, before)


def _unread(fleet: Fleet) -> None:
    """Say (once per new count) how many messages could not be handled at all."""
    unread = fleet.take_unread()
    if unread:
        say(f"warning: {unread} message(s) could not be read (ignored)", sys.stderr)
