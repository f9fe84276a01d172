"""The optimized-model cache (`<cache>/models`) checked at start for files someone planted.

Everything in it is the agent's: optimized copies (`.onnx`), their weights (`.onnx.data`) and
seals (`.onnx.seal`), split records (`.json`), remembered digests (`digest-…`), a build's work
directories (`.build-…`) and the INT8 tier's folders (`….int8`, checked by their own reader).
Someone who can write beside it could put a symbolic link, a FIFO (whose plain open blocks), a
device, a directory where a file goes, or a sparse file of terabytes there. The readers refuse
each of them when they meet it (`nofollow`: never followed, opened without blocking, refused by
its kind or size before a byte is read) and build the copy again; this sweep removes them once,
at start, before the voices load, and says what it removed, for the log and the state's
`storage`. Damaged content (a truncated or garbage copy) is not its business: the seal finds it
and the copy is built again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import Final

from agent.guarded import nofollow

_LOGGER = logging.getLogger(__name__)

FILE_SUFFIXES: Final = (".onnx", ".data", ".seal", ".json")
"""Names of the cache's files (a directory of such a name is planted)."""
DIGEST_PREFIX: Final = "digest-"
MAX_CACHED_BYTES: Final = 1 << 31
"""The largest file the cache holds (2 GiB: an optimized Piper voice is 20-120 MB); a larger
one was planted."""


def sweep_models(models: Path) -> list[str]:
    """Remove what was planted in the model cache `models` (see the module): a link, a FIFO, a
    device or a socket; a directory where a file goes; a file over MAX_CACHED_BYTES. Returns
    what was removed (for the state); a cache that is missing or refused is left to its
    readers (nothing to say here)."""
    try:
        folder = nofollow.open_directory(models, create=False)
    except OSError:
        return []
    removed = []
    try:
        for name, info in nofollow.entries(folder):
            found = _planted(name, info)
            if found is None:
                continue
            try:
                nofollow.remove(folder, name)
            except OSError as err:
                _LOGGER.warning("Model cache: %s is %s and cannot be removed: %s", name, found, err)
                continue
            _LOGGER.warning("Model cache: %s was %s: removed, never followed", name, found)
            removed.append(f"model cache: {name} was {found}: removed")
    finally:
        with contextlib.suppress(OSError):
            os.close(folder)
    return removed


def _planted(name: str, info: os.stat_result) -> str | None:
    """What an entry of the cache is if it was planted (in words), None if it may be ours."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return None if info.st_size <= MAX_CACHED_BYTES else f"{info.st_size} bytes"
    if stat.S_ISDIR(mode):
        is_file_name = name.endswith(FILE_SUFFIXES) or name.startswith(DIGEST_PREFIX)
        return nofollow.describe(mode) if is_file_name else None
    return nofollow.describe(mode)
