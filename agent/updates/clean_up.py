"""What an interrupted update left, cleaned up at start: slots neither active nor previous (an
install that never switched) and temporary state files go; staged downloads stay a while, so
offering the release again resumes them, but not for ever (STAGING_MAX_AGE, STAGING_MAX_FILES).
A link or a special file (a FIFO, a device, a directory where a file belongs) where the updater
keeps its own is removed, never followed, and so is a staged file over
`update_store.MAX_SLOT_FILE_BYTES`."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path
from typing import Final

from agent.updates import update_store as store
from agent.updates.update_store import UpdateState

_LOGGER = logging.getLogger(__name__)

STAGING_MAX_AGE: Final = 7 * 86400.0
"""Staged downloads of a release that was never installed are removed at start after this long
(seconds): long enough for an operator to offer it again and resume."""
STAGING_MAX_FILES: Final = 8
"""At most this many staged files are kept at start (the newest)."""


def clean_up(directory: Path, state: UpdateState) -> list[str]:
    """Clean up the update directory for `state`; returns what was unsafe (a link or a special
    file, removed). A disk that refuses is logged: a start never fails for it."""
    unsafe: list[str] = []
    try:
        if directory.is_dir():
            _root(directory, unsafe)
            _staging(directory, unsafe)
            _slots(directory, {state.active, state.previous}, unsafe)
    except OSError as err:
        _LOGGER.error("Cleaning up %s failed: %s", directory, err)
    return unsafe


def _root(directory: Path, unsafe: list[str]) -> None:
    with store.directory(directory) as root:
        for name, info in store.entries(root):
            if name.endswith(".partial"):
                store.remove(root, name)
            elif name in {"staging", "slots"} and not stat.S_ISDIR(info.st_mode):
                unsafe.append(f"{name} was {store.kind_of(info)}")
                store.remove(root, name)


def _staging(directory: Path, unsafe: list[str]) -> None:
    if not (directory / "staging").is_dir():
        return
    with store.directory(directory, "staging") as staging:
        staged: list[tuple[float, str]] = []
        for name, info in store.entries(staging):
            if stat.S_ISREG(info.st_mode) and info.st_size <= store.MAX_SLOT_FILE_BYTES:
                staged.append((info.st_mtime, name))
            else:
                unsafe.append(f"staging/{name} was {_what(info)}")
                store.remove(staging, name)
        now = time.time()
        for rank, (mtime, name) in enumerate(sorted(staged, reverse=True)):
            if rank >= STAGING_MAX_FILES or now - mtime > STAGING_MAX_AGE:
                _LOGGER.info("Removing the staged download %s of a release never installed", name)
                store.remove(staging, name)


def _slots(directory: Path, keep: set[str | None], unsafe: list[str]) -> None:
    if not (directory / "slots").is_dir():
        return
    with store.directory(directory, "slots") as slots:
        for name, info in store.entries(slots):
            if name not in keep:
                _LOGGER.info("Removing the unused slot %s", name)
                store.remove(slots, name)
            elif not stat.S_ISDIR(info.st_mode):
                unsafe.append(f"slots/{name} was {store.kind_of(info)}")
                store.remove(slots, name)
            else:
                with store.directory(directory, "slots", name) as slot:
                    for inner, kind in store.entries(slot):
                        if not stat.S_ISREG(kind.st_mode):
                            unsafe.append(f"slots/{name}/{inner} was {store.kind_of(kind)}")
                            store.remove(slot, inner)


def _what(info: os.stat_result) -> str:
    """What a staged entry that is not kept is: a special file, or a file too large to be
    any release's (a sparse file of terabytes would hold its hashing for hours)."""
    if stat.S_ISREG(info.st_mode):
        return f"a file of {info.st_size} bytes, over {store.MAX_SLOT_FILE_BYTES}"
    return store.kind_of(info)
