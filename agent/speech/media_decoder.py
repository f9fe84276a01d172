"""The agent's side of the decoder child (`media_child`): one process that decodes every
untrusted sound, started when the first sound is fetched, kept warm while sounds come and ended
after `DecoderLimits.idle_s` without one (its ~17 MB are the node's only while it works:
docs/memory.md); killed and replaced when it dies, overruns or is aborted.

`MediaDecoder.decode` sends a sound's bytes to the child and waits for its samples, within a
wall-clock deadline; the child limits its own CPU time and address space. Its answer is checked
before it is believed (a JSON header of bounded size, then exactly as many samples as it
announced, never more than the sound's bounds allow). A decode can be aborted from any thread
(`abort`: a higher class needs the decoder, or the request is gone): the child is killed at
once. A child that died, overran its deadline, answered nonsense or was aborted is replaced by a
new one, started at once so that the next sound finds it warm (a cold start costs ~0.3 s of
interpreter and imports here), and ended in turn when idle. One decode at a time (one caller
thread).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Final

import numpy as np

from agent.core.reasons import Reason
from agent.formats.media import (
    MAX_AUDIO_SECONDS,
    MAX_DECODE_SAMPLES,
    MEDIA_REASONS,
    DecodedAudio,
    MediaError,
)
from agent.speech.media_child import FRAME, MAX_HEADER_BYTES

_LOGGER = logging.getLogger(__name__)

CHILD_ENVIRONMENT: Final = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "1",
}
"""One thread and one malloc arena: a small address space for its limit."""
_READ_BYTES: Final = 1 << 20
_DETAIL_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class DecoderLimits:
    """Bounds of the decoder child."""

    memory_mb: int = 384
    """Address space (RLIMIT_AS): measured peaks 129-177 MiB virtual (the imports ~105 MiB;
    60 s of 48 kHz stereo WAV, MP3 (read at once) or Ogg, or of 8-channel FLAC, decoded to
    22,050 or 48,000 Hz), 55-102 MiB resident, with one thread."""
    cpu_seconds: float = 10.0
    """CPU time per sound (RLIMIT_CPU): the work bound's 24 M samples take ~0.3 s here."""
    deadline_s: float = 30.0
    """Wall-clock time per sound, the child's start included: it runs at a lower priority, so
    a busy CPU slows it down (synthesis goes first)."""
    niceness: int = 10
    """How much lower than the agent's its CPU priority is."""
    sounds_per_child: int = 64
    """A child is replaced after this many sounds (what it may have accumulated is let go)."""
    idle_s: float = 60.0
    """A child that decoded nothing for this long is ended (the next sound starts another, ~0.3
    s of CPU): a sound by name is decoded once and then played from the phrase cache, so a
    child kept for good would hold ~17 MB (its own pages; docs/memory.md) for nothing."""


class DecodeAbortedError(Exception):
    """The decode was aborted (`MediaDecoder.abort`): the sound is neither good nor bad."""


class _Child:
    """One decoder process and its pipes."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its words never reach the agent's log
            env={**os.environ, **CHILD_ENVIRONMENT},
            start_new_session=True,
            close_fds=True,
        )
        assert self.process.stdin is not None  # noqa: S101 - asked for above
        assert self.process.stdout is not None  # noqa: S101
        self.stdin = self.process.stdin.fileno()
        self.stdout = self.process.stdout.fileno()
        os.set_blocking(self.stdin, False)
        os.set_blocking(self.stdout, False)
        self.ready = False
        self.last = False
        """It said it ends after its answer."""
        self.sounds = 0
        self.started = time.monotonic()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def close(self) -> None:
        """Kill it, reap it, close its pipes."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


class _ChildFailedError(Exception):
    """The child died, overran, or answered something that is no answer."""


class MediaDecoder:
    """Decodes sound files in a child process that can be killed."""

    def __init__(
        self, limits: DecoderLimits | None = None, command: list[str] | None = None
    ) -> None:
        """`command`: the child's command line (default: `python -m agent.speech.media_child` with
        the limits)."""
        self._limits = limits or DecoderLimits()
        self._command = command or [
            sys.executable,
            "-m",
            "agent.speech.media_child",
            "--memory-mb",
            str(self._limits.memory_mb),
            "--nice",
            str(self._limits.niceness),
        ]
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._aborted = False
        self._abort_next = False
        self._busy = False
        self._stopped = False
        self._idle: threading.Timer | None = None
        self.replaced = 0
        """Children killed and replaced so far (after a failure, an overrun or an abort)."""

    @property
    def pid(self) -> int | None:
        """The current child's process id (None before it starts)."""
        with self._lock:
            return None if self._child is None else self._child.process.pid

    def start(self) -> None:
        """Start the child now, so that the next sound finds it warm (any thread); it ends
        after `idle_s` if no sound comes."""
        with self._lock:
            if self._child is None and not self._stopped:
                self._child = _Child(self._command)
                self._arm(self._child)

    def stop(self) -> None:
        """Kill the child; later decodes are refused."""
        with self._lock:
            self._stopped = True
            child, self._child = self._child, None
            self._disarm()
        if child is not None:
            child.close()

    def _arm(self, child: _Child) -> None:
        """End `child` once it has been idle for `idle_s` (under the lock)."""
        self._disarm()
        timer = threading.Timer(self._limits.idle_s, self._end_idle, (child, child.sounds))
        timer.daemon = True
        timer.name = "decoder-idle"
        self._idle = timer
        timer.start()

    def _disarm(self) -> None:
        """Cancel the idle timer (under the lock)."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _end_idle(self, child: _Child, sounds: int) -> None:
        """The idle timer: end the child if it is still the idle one it was armed for."""
        with self._lock:
            if self._child is not child or self._busy or child.sounds != sounds:
                return
            self._child = None
            self._idle = None
        _LOGGER.debug(
            "Decoder child %d ended after %g s idle", child.process.pid, self._limits.idle_s
        )
        child.close()

    def abort(self) -> None:
        """Kill the decode in progress (any thread): `decode` raises DecodeAbortedError. Asked
        between two decodes (the caller's next one is about to start), the next one is refused
        before it starts."""
        with self._lock:
            if not self._busy or self._child is None:
                self._abort_next = True
                return
            self._aborted = True
            self._child.kill()

    def decode(
        self,
        data: bytes,
        rate: int,
        *,
        max_bytes: int,
        max_seconds: float = MAX_AUDIO_SECONDS,
        max_samples: int = MAX_DECODE_SAMPLES,
    ) -> DecodedAudio:
        """A sound's bytes as mono 16-bit PCM at `rate`, decoded in the child. Raises
        MediaError (the sound is refused) or DecodeAbortedError."""
        if len(data) > max_bytes:  # refused before it is even sent
            detail = f"{len(data)} bytes, at most {max_bytes} allowed"
            raise MediaError(Reason.TOO_LARGE, detail)
        job = {
            "rate": rate,
            "max_bytes": max_bytes,
            "max_seconds": max_seconds,
            "max_samples": max_samples,
            "cpu_seconds": self._limits.cpu_seconds,
        }
        most = math.ceil(max_seconds * rate) + rate  # the resampler's tail: far less than 1 s
        child = self._take()
        deadline = time.monotonic() + self._limits.deadline_s
        try:
            answer, pcm = _exchange(child, [json.dumps(job).encode(), data], most, deadline)
        except (_ChildFailedError, OSError) as err:
            if self._replace(child):
                raise DecodeAbortedError from None
            raise self._failure(child, err, deadline) from None
        finally:
            self._done(child)
        return DecodedAudio(
            np.frombuffer(pcm, dtype="<i2").astype(np.int16, copy=False),
            rate,
            _text(answer.get("format")),
            _text(answer.get("subtype")),
            _number(answer.get("source_rate")),
            _number(answer.get("source_channels")),
        )

    def _take(self) -> _Child:
        """The child for the next sound: the warm one, or a new one if it ended."""
        with self._lock:
            if self._stopped or self._abort_next:
                self._abort_next = False
                raise DecodeAbortedError
            ended = self._child if self._child and self._child.process.poll() is not None else None
            if ended is not None:  # it ended after its last answer (out of memory) or idle
                self._child = None
            if self._child is None:
                self._child = _Child(self._command)
            child = self._child
            self._busy, self._aborted = True, False
            self._disarm()
        if ended is not None:
            ended.close()
        return child

    def _done(self, child: _Child) -> None:
        """One sound served (or refused): the child is kept, or replaced once it served its
        share or said it ends (a failed one was replaced already)."""
        child.sounds += 1
        with self._lock:
            self._busy = False
            if self._child is not child:
                return
            if child.sounds < self._limits.sounds_per_child and not child.last:
                self._arm(child)
                return
            self._child = None if self._stopped else _Child(self._command)
            if self._child is not None:
                self._arm(self._child)
        child.close()

    def _replace(self, child: _Child) -> bool:
        """Kill a child that failed and start its successor; whether it had been aborted."""
        with self._lock:
            aborted = self._aborted
            self._busy = self._aborted = False
            if self._child is child:
                self._child = None if self._stopped else _Child(self._command)
                if self._child is not None:
                    self._arm(self._child)
            self.replaced += 1
        child.close()
        return aborted or self._stopped

    def _failure(self, child: _Child, err: Exception, deadline: float) -> MediaError:
        """Why the sound is refused, from how its child ended."""
        code = child.process.returncode
        if time.monotonic() >= deadline:
            detail = f"not decoded within {self._limits.deadline_s:g} s"
            reason = Reason.TOO_LARGE
        elif code == -signal.SIGXCPU:
            detail = f"more than {self._limits.cpu_seconds:g} s of CPU to decode"
            reason = Reason.TOO_LARGE
        elif code is not None and code < 0:
            detail = f"the decoder died ({signal.Signals(-code).name})"
            reason = Reason.UNSUPPORTED_AUDIO
        else:
            detail = f"the decoder failed: {str(err)[:_DETAIL_CHARS]}"
            reason = Reason.UNSUPPORTED_AUDIO
        _LOGGER.warning("Decoder child %d replaced: %s", child.process.pid, detail)
        return MediaError(reason, detail)


def _exchange(
    child: _Child, frames: list[bytes], most: int, deadline: float
) -> tuple[dict[str, object], bytearray]:
    """Send a sound to the child, read its answer and samples (at most `most`); raises
    MediaError for its refusal, _ChildFailedError (or OSError) for anything that is none."""
    if not child.ready:
        ready = _answer(_read_frame(child, MAX_HEADER_BYTES, deadline))
        child.ready = ready.get("ready") is True
        if not child.ready:
            raise _ChildFailedError("it did not start")
    _write(child, frames, deadline)
    answer = _answer(_read_frame(child, MAX_HEADER_BYTES, deadline))
    if answer.get("ok") is not True:
        child.last = answer.get("last") is True  # it ends after this answer
        raise _refusal(answer)
    samples = answer.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples <= most:
        raise _ChildFailedError(f"it announced {samples!r} samples")
    pcm = _read_frame(child, 2 * samples, deadline)
    if len(pcm) != 2 * samples:
        raise _ChildFailedError("its samples are not what it announced")
    return answer, pcm


def _refusal(answer: dict[str, object]) -> MediaError:
    """The child's refusal of a sound, as a MediaError (a reason it cannot name is no answer)."""
    reason = next((r for r in MEDIA_REASONS if r == answer.get("reason")), None)
    if reason is None:
        raise _ChildFailedError("it gave no reason")
    return MediaError(reason, _text(answer.get("detail")))


def _answer(frame: bytearray) -> dict[str, object]:
    try:
        value = json.loads(frame)
    except (ValueError, RecursionError):
        raise _ChildFailedError("its answer is no JSON") from None
    if not isinstance(value, dict):
        raise _ChildFailedError("its answer is no JSON object")
    return value


def _text(value: object) -> str:
    """A string from the child, printable and short."""
    text = value if isinstance(value, str) else ""
    return "".join(c if c.isprintable() else "?" for c in text[:_DETAIL_CHARS])


def _number(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _write(child: _Child, bodies: list[bytes], deadline: float) -> None:
    """Frames to the child, within the deadline."""
    for body in bodies:
        for part in (FRAME.pack(len(body)), body):
            view = memoryview(part)
            while view:
                _wait(child.stdin, deadline, write=True)
                view = view[os.write(child.stdin, view) :]


def _read_frame(child: _Child, most: int, deadline: float) -> bytearray:
    """One frame from the child, of at most `most` bytes, within the deadline."""
    (length,) = FRAME.unpack(_read(child, FRAME.size, deadline))
    if length > most:
        raise _ChildFailedError(f"a frame of {length} bytes, at most {most} expected")
    return _read(child, length, deadline)


def _read(child: _Child, count: int, deadline: float) -> bytearray:
    """Exactly `count` bytes from the child (into one buffer of that size: no copies)."""
    buffer = bytearray(count)
    view, got = memoryview(buffer), 0
    while got < count:
        _wait(child.stdout, deadline, write=False)
        read = os.readv(child.stdout, [view[got : got + _READ_BYTES]])
        if not read:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=1)  # dead: its status says how
            raise _ChildFailedError("it ended")
        got += read
    view.release()
    return buffer


def _wait(fd: int, deadline: float, *, write: bool) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _ChildFailedError("deadline")
    ready = select.select([], [fd], [], left) if write else select.select([fd], [], [], left)
    if not any(ready):
        raise _ChildFailedError("deadline")
