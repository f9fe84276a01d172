"""The step marker: which step of which announcement's work the synthesis thread is in, kept in
a small file beside the journal, so that the next start knows what the agent was doing when it
died.

A step is a piece of work in this process that a message's content could make fatal: reading
its text into phonemes (espeak-ng), one inference (a clause group). Sounds are decoded in the
decoder child (`media_decoder`), whose death refuses the sound and spares the agent. Around
each step, the
marker is written (`enter`) and cleared (`leave`) with a plain `pwrite` into a file kept open,
no fsync: a process that dies (SIGKILL, a segfault, the OOM killer, the watchdog) leaves the
page cache behind, so the next start reads what it was doing. A power cut may lose the last
writes, which can only leave a death uncounted (the error is on the side of "no poison"); and
each record carries the machine's boot id, so a death across a restart of the machine is never
counted against a message. Each process writes its own token: one death is counted once,
however often it is read (a start that dies before it clears the marker).

The file holds one record at offset 0: b"S", the CRC-32 of the rest (8 hex digits), a space,
a JSON list [boot id, token, request id, step] and a newline. Leaving a step writes b"-" over
the "S"; entering the same step again writes the "S" back (one byte each way). Measured: see
docs/delivery.md (a few microseconds a step).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.guarded import nofollow

_LOGGER = logging.getLogger(__name__)

FAULT_ENV: Final = "VOICE_AGENT_FAULT_AT"
"""Test hook (the updater's too): `step:<request id>:<kind>[#n]` makes the agent kill itself
(SIGKILL) inside the n-th distinct step (default the first) of that kind (`phonemize`,
`infer`) of that request, in every process started with it: a message that kills the
agent each time the same piece of it is worked on."""
BOOT_ID: Final = Path("/proc/sys/kernel/random/boot_id")
_MAX_RECORD: Final = 4096


@dataclass(frozen=True, slots=True)
class Death:
    """What the previous process was doing when it died: inside `step` of request `id`."""

    id: str
    step: str
    token: str
    """The process's token (a death is counted once)."""
    same_boot: bool
    """The machine did not restart since (a restart, e.g. a power cut, never counts)."""


class StepMarker:
    """The marker file of one node (used from the synthesis thread; `clear` before it runs)."""

    def __init__(
        self, directory: Path | None, name: str, environ: Mapping[str, str] | None = None
    ) -> None:
        """Open (or create) `name` in `directory` without following links, and read what the
        previous process left (`last`). Anything but a regular file of at most a record's
        bound in its place (a link, a FIFO, a directory, a device, a huge file) is removed,
        never read, and a new marker made (`problem` says what was found). Without a
        directory, or when it cannot be used, the marker does nothing (`problem` says why)."""
        self.boot_id = _boot_id()
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.last: Death | None = None
        self.problem: str | None = None
        self._fd: int | None = None
        self._record: tuple[str, str] | None = None  # what follows the "S" in the file now
        self._fault = _fault((environ if environ is not None else os.environ).get(FAULT_ENV))
        self._seen: dict[str, list[str]] = {}
        if directory is not None:
            try:
                self._open(directory, name)
            except OSError as err:
                self.problem = f"step marker: {err}"
                _LOGGER.warning(
                    "The step marker cannot be kept (%s): crash loops are not seen", err
                )

    def _open(self, directory: Path, name: str) -> None:
        folder = nofollow.open_directory(directory)
        try:
            try:
                self.last = _parsed(nofollow.read_file(folder, name, _MAX_RECORD), self.boot_id)
            except FileNotFoundError:
                pass
            except nofollow.FileRefusedError as err:  # planted: never followed, read or kept
                self.problem = f"step marker {name} was {err.found}: replaced"
                _LOGGER.warning("The %s", self.problem)
                nofollow.remove(folder, name)
            self._fd = nofollow.open_regular(folder, name, os.O_RDWR | os.O_CREAT)
        finally:
            os.close(folder)

    @contextlib.contextmanager
    def step(self, request_id: str, step: str) -> Iterator[None]:
        """Mark the work inside as `step` of request `request_id`."""
        self.enter(request_id, step)
        try:
            yield
        finally:
            self.leave()

    def enter(self, request_id: str, step: str) -> None:
        """The synthesis thread begins `step` of request `request_id`."""
        if self._fd is not None:
            if self._record == (request_id, step):
                self._write(b"S")
            else:
                payload = json.dumps([self.boot_id, self.token, request_id, step]).encode()
                crc = zlib.crc32(payload)
                self._write(b"S%08x %s\n" % (crc, payload))
                self._record = (request_id, step)
        if self._fault is not None:
            self._maybe_die(request_id, step)

    def leave(self) -> None:
        """The step is over (done, or failed with an exception: the process lives on)."""
        if self._fd is not None:
            self._write(b"-")

    def clear(self) -> None:
        """Forget what the previous process left (its death is counted in the journal)."""
        self.leave()

    def close(self) -> None:
        """Close the file (the marker says "in no step")."""
        if self._fd is not None:
            self.leave()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _write(self, data: bytes) -> None:
        assert self._fd is not None  # noqa: S101 - checked by the callers
        try:
            os.pwrite(self._fd, data, 0)
        except OSError as err:  # the card failed: the breaker only loses its memory of steps
            _LOGGER.warning("The step marker cannot be written (%s): crash loops are not seen", err)
            self.problem = f"step marker: {err}"
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _maybe_die(self, request_id: str, step: str) -> None:
        assert self._fault is not None  # noqa: S101 - checked by the caller
        wanted_id, kind, nth = self._fault
        if request_id != wanted_id or step.split(" ", 1)[0] != kind:
            return
        seen = self._seen.setdefault(kind, [])
        if step not in seen:  # a step is entered again for each chunk it yields
            seen.append(step)
        if len(seen) == nth and seen[-1] == step:
            _LOGGER.warning("Fault injection: killed in step %r of %s", step, request_id)
            os.kill(os.getpid(), signal.SIGKILL)


def read_marker(path: Path) -> Death | None:
    """What a marker file says now (for inspection and tests): the step a process is in, or
    was in when it died; None when it is in none."""
    folder = nofollow.open_directory(path.parent, create=False)
    try:
        return _parsed(nofollow.read_file(folder, path.name, _MAX_RECORD), _boot_id())
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)


def _parsed(data: bytes, boot_id: str) -> Death | None:
    """The death a record tells of, or None (in no step, or not a whole record)."""
    line = data.split(b"\n", 1)[0]
    if line[:1] != b"S" or len(line) < 11 or line[9:10] != b" ":
        return None
    payload = line[10:]
    try:
        if int(line[1:9], 16) != zlib.crc32(payload):
            return None
        boot, token, request_id, step = json.loads(payload)
    except (ValueError, TypeError, RecursionError):
        return None
    if not all(isinstance(v, str) for v in (boot, token, request_id, step)):
        return None
    return Death(request_id, step, token, boot == boot_id)


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _fault(value: str | None) -> tuple[str, str, int] | None:
    """The injected fault `step:<request id>:<kind>[#n]`, if the hook names one."""
    if value is None or not value.startswith("step:"):
        return None
    request_id, _, kind = value[5:].rpartition(":")
    kind, _, nth = kind.partition("#")
    return request_id, kind, int(nth or 1)
