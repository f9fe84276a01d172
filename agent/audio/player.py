"""Audio out: one ALSA PCM, opened once and kept open, fed by a writer thread from a bounded buffer.

The buffer holds at most two chunks (a chime, or a group of clauses), so synthesis runs one chunk
ahead of playback and blocks when it is that far ahead: double buffering without an unbounded
queue. Samples are written one period at a time; between periods the writer applies the
volume (requested x global, with the alarm floor) and notices a cut, which it turns into a
one-period fade to silence. The PCM is drained at the end of each announcement, so `finished`
means played. An underrun is recovered and counted; a device that fails or cannot be opened is
closed and opened again with backoff (tenacity), reported as unavailable meanwhile; the
announcement it broke fails with `audio_error`, later ones wait.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from agent.audio.device import AudioUnavailableError, Device, PcmOpener
from agent.core.messages import Event, UtteranceEnded, UtteranceStarted
from agent.core.reasons import Reason
from agent.core.start_clock import frame_at
from agent.core.volume import effective_volume
from agent.formats.pcm import Chunk

_LOGGER = logging.getLogger(__name__)

BUFFER_CHUNKS: Final = 2
"""Chunks the double buffer holds between synthesis and the ALSA writer."""
_POLL_SECONDS: Final = 0.05
_REOPEN_MAX_SECONDS: Final = 10.0
RUN_BEFORE_SECONDS: Final = 0.3
"""A timed utterance's device runs on silence from this long (plus its buffer, plus the periods
it takes to see where the stream is: `start_clock`) before the instant."""
_OBSERVATIONS: Final = 40
"""The most recent (time, frames taken) pairs kept while running on silence (half of them
are needed before the start is placed)."""
_SILENT: Final = 64
"""A sample this small (about -54 dBFS) ends a sound without an audible click."""


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """What the player does about an idle device (seconds; 0 turns each off)."""

    lead_in: float = 0.0
    """Silence before an announcement whenever the device was idle longer than `wake_after`."""
    wake_after: float = 30.0
    release_after: float = 0.0
    """Close the device after this long idle (reopened for the next announcement)."""


@dataclass(slots=True)
class _Utterance:
    """What the writer knows about the announcement it is playing."""

    id: str
    job: int = 0
    frames: int = 0
    error: tuple[Reason, str] | None = None
    cut: bool = False
    last_sample: int = 0
    """The last sample written: a cut between chunks ramps from it to silence."""
    start_at: float | None = None
    """A timed utterance's instant (Unix seconds): its first sample plays then."""
    late_ms: float | None = None
    """How late its first sample played, for a timed utterance (0: on time)."""


class Player:
    """Writer thread over a kept-open PCM; reports started, ended and device availability."""

    def __init__(  # noqa: PLR0917 - the composition root passes every setting
        self,
        open_pcm: PcmOpener,
        rate: int,
        report: Callable[[Event], object],
        volume: float = 1.0,
        floor: float = 0.0,
        idle: IdlePolicy | None = None,
    ) -> None:
        self._idle = idle or IdlePolicy()
        self._last_sound = time.monotonic()
        self._rate = rate
        self._report = report
        self._buffer: queue.Queue[Chunk] = queue.Queue(maxsize=BUFFER_CHUNKS)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="alsa-writer", daemon=True)
        self._lock = threading.Lock()
        self._cuts: set[int] = set()
        self._wakeup = threading.Event()
        self._volume = float(volume) if _valid_volume(volume) else 1.0
        self._floor = floor
        self._device = Device(open_pcm, report, self._wakeup)

    # ---- any thread -------------------------------------------------------------------------

    @property
    def volume(self) -> float:
        """The global volume, 0 to 1."""
        return self._volume

    @volume.setter
    def volume(self, value: float) -> None:
        """Set the global volume; anything but a number from 0 to 1 is refused (logged) and the
        volume stays as it was, so the writer never meets it."""
        if not _valid_volume(value):
            _LOGGER.warning("Volume %.40r refused: expected a number from 0 to 1", value)
            return
        self._volume = float(value)  # read by the writer at each period: applies at once

    def cut(self, job: int) -> None:
        """Fade out this activation at the next period boundary and drop the rest of it."""
        with self._lock:
            self._cuts.add(job)
        self._wakeup.set()  # a wait for the device gives up at once

    def open(self) -> None:
        """Open the device now, so a problem shows at start; a failure is retried later."""
        with contextlib.suppress(AudioUnavailableError):  # reported unavailable
            self._device.open()

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def put(self, chunk: Chunk) -> bool:
        """Queue audio, blocking while the buffer is full; False once the player is stopping."""
        while not self._stopping.is_set():
            try:
                self._buffer.put(chunk, timeout=_POLL_SECONDS)
            except queue.Full:
                continue
            return True
        return False

    def stop(self) -> None:
        """Stop the writer (audio not yet played is dropped) and close the device."""
        self._stopping.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._thread.is_alive():
            _LOGGER.warning("The ALSA writer did not stop; leaving the device to process exit")
            return
        self._device.close()

    @property
    def underruns(self) -> int:
        """Buffer underruns reported by ALSA since start (each was recovered)."""
        return self._device.underruns

    # ---- the writer thread ------------------------------------------------------------------

    def _run_blocking(self) -> None:
        current: _Utterance | None = None
        while not self._stopping.is_set():
            try:
                chunk = self._buffer.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._device.pcm is None and self._device.available is False:
                    with contextlib.suppress(AudioUnavailableError):  # nothing starts till then
                        self._device.ensure_open(self._stopping.is_set)
                elif self._device.pcm is not None and self._idle_too_long():
                    _LOGGER.info("Audio device idle: released until the next announcement")
                    self._device.close()  # other programs may use a hw: device meanwhile
                continue
            if current is None or current.job != chunk.job:
                current = _Utterance(chunk.id, chunk.job, start_at=chunk.start_at)
                with self._lock:  # cuts of earlier activations can no longer matter
                    self._cuts = {job for job in self._cuts if job >= chunk.job}
            if chunk.pcm is not None and current.error is None and not current.cut:
                self._play(current, chunk)
            if chunk.end:
                self._end(current, chunk)
                current = None

    def _idle_too_long(self) -> bool:
        release = self._idle.release_after
        return release > 0 and time.monotonic() - self._last_sound > release

    def _is_cut(self, job: int) -> bool:
        with self._lock:
            return job in self._cuts

    def _play(self, current: _Utterance, chunk: Chunk) -> None:
        assert chunk.pcm is not None  # noqa: S101 - checked by the caller
        if not self._ready(current):
            return
        step = self._device.period_frames
        for start in range(0, len(chunk.pcm), step):
            if self._stopping.is_set():
                return
            period = chunk.pcm[start : start + step].astype(np.float32)
            period *= effective_volume(chunk.volume, self._volume, chunk.priority, self._floor)
            if self._is_cut(current.job):
                current.cut = True
                if current.frames == 0:
                    return  # cut before a sample was heard: nothing to fade
                period *= np.linspace(1.0, 0.0, len(period), dtype=np.float32)  # no click
            samples = np.round(period).astype(np.int16)
            try:
                self._device.write(samples.tobytes())
            except AudioUnavailableError as err:
                current.error = (Reason.AUDIO_ERROR, str(err))
                return
            current.last_sample = int(samples[-1]) if len(samples) else 0
            if current.frames == 0:
                started = current.start_at if current.late_ms == 0 else time.time()
                report = UtteranceStarted(current.id, current.job, started or time.time())
                self._report(replace(report, late_ms=current.late_ms))
            current.frames += len(period)
            if current.cut:
                return

    def _ready(self, current: _Utterance) -> bool:
        """The device open and, before an utterance's first sample, its start: on its instant
        (timed) or after a lead-in (a sleeping speaker); False if it will not play."""
        try:
            self._device.ensure_open(lambda: self._stopping.is_set() or self._is_cut(current.job))
        except AudioUnavailableError as err:
            current.error = (Reason.AUDIO_ERROR, str(err))
            return False
        if current.frames:
            return True
        if current.start_at is not None and current.late_ms is None:
            return self._wait_for_start(current)
        return self._lead_in(current)

    def _wait_for_start(self, current: _Utterance) -> bool:
        """Hold a timed utterance until its instant: shortly before it, run the device on
        silence, note where the stream is (`start_clock`), and pad to the exact frame that
        plays at `start_at` on this machine's clock. Late: start at once and say by how much.
        False if it was cut (or the player stops) while it waited."""
        assert current.start_at is not None  # noqa: S101 - checked by the caller
        rate, period = self._rate, self._device.period_frames
        observing = (_OBSERVATIONS // 2 + 2) * period / rate  # after the buffer fills: paced
        run_before = (
            max(RUN_BEFORE_SECONDS, self._idle.lead_in) + self._buffer_seconds() + observing
        )
        silence = bytes(2 * period)
        settled = round(self._buffer_seconds() * rate) + 2 * period  # full, then paced twice
        observed: deque[tuple[float, int]] = deque(maxlen=_OBSERVATIONS)
        written = 0
        try:
            while not (self._stopping.is_set() or self._is_cut(current.job)):
                ahead = current.start_at - time.time()
                if not written and ahead > run_before:
                    self._wakeup.wait(min(ahead - run_before, _POLL_SECONDS))
                    self._wakeup.clear()  # a cut or a stop ends the wait; checked above
                    continue
                if not written and (ahead <= 0 or self._device.queued_frames() is None):
                    return self._start_unpadded(current, ahead)
                if len(observed) >= _OBSERVATIONS // 2:
                    pad = frame_at(observed, rate, current.start_at) - written
                    if pad < period:
                        self._device.write(bytes(2 * max(0, pad)))
                        current.late_ms = max(0.0, -pad * 1000 / rate)
                        return True
                self._device.write(silence)  # blocks while the device buffer is full: paced
                written += period
                taken = written - (self._device.queued_frames() or 0)
                if taken == written and not observed:  # took it all at once: not real time
                    return self._start_unpadded(current, current.start_at - time.time())
                if written > settled:  # while it fills, where the stream is is not known
                    observed.append((time.time(), taken))
        except AudioUnavailableError as err:
            current.error = (Reason.AUDIO_ERROR, str(err))
        return False

    def _start_unpadded(self, current: _Utterance, ahead: float) -> bool:
        """A timed start without the stream's position: late (start now, say how late), or a
        device that cannot say what it holds (wait for the instant by the clock)."""
        assert current.start_at is not None  # noqa: S101 - checked by the caller
        while ahead > 0 and not (self._stopping.is_set() or self._is_cut(current.job)):
            self._wakeup.wait(min(ahead, _POLL_SECONDS))
            self._wakeup.clear()
            ahead = current.start_at - time.time()
        current.late_ms = max(0.0, -ahead * 1000)
        return ahead <= 0

    def _buffer_seconds(self) -> float:
        frames = self._device.buffer_frames()
        return 0.0 if frames is None else frames / self._rate

    def _lead_in(self, current: _Utterance) -> bool:
        """Silence before the first sample when the device has been idle a while: a speaker
        that sleeps (HDMI, Bluetooth, an amplifier that mutes) wakes on it, so the first word
        is heard. False if the device failed."""
        frames = round(self._idle.lead_in * self._rate)
        if frames <= 0 or time.monotonic() - self._last_sound < self._idle.wake_after:
            return True
        period = self._device.period_frames
        try:
            for start in range(0, frames, period):  # a period at a time, as speech is written
                if self._is_cut(current.job) or self._stopping.is_set():
                    return False
                self._device.write(bytes(2 * min(period, frames - start)))
        except AudioUnavailableError as err:
            current.error = (Reason.AUDIO_ERROR, str(err))
            return False
        return True

    def _end(self, current: _Utterance, chunk: Chunk) -> None:
        if self._is_cut(current.job) and not current.cut and current.error is None:
            current.cut = True  # cut between two chunks: the last one ended where it ended
            self._fade_tail(current)
        if current.error is None and current.frames and not current.cut:
            try:
                self._device.drain()
            except AudioUnavailableError as err:  # a device lost while draining
                current.error = (Reason.AUDIO_ERROR, str(err))
        with self._lock:
            self._cuts.discard(current.job)
        if current.frames:  # what made no sound leaves the speaker asleep
            self._last_sound = time.monotonic()
        error = current.error
        if error is None and chunk.error is not None:
            error = (chunk.error, chunk.detail)
        seconds = current.frames / self._rate
        reason, detail = error if error is not None else (None, "")
        self._report(
            UtteranceEnded(
                current.id, seconds, reason, detail, chunk.info, current.job, time.time()
            )
        )

    def _fade_tail(self, current: _Utterance) -> None:
        """Ramp from the last sample written to silence in 5 ms, so a cut never clicks."""
        if abs(current.last_sample) < _SILENT or self._device.pcm is None:
            return
        ramp = np.linspace(current.last_sample, 0, max(2, self._rate // 200))[1:]
        with contextlib.suppress(AudioUnavailableError):
            self._device.write(np.round(ramp).astype(np.int16).tobytes())
            current.frames += len(ramp)


def announce_role(device: str, role: str | None, environ: MutableMapping[str, str]) -> None:
    """Give the audio stream its role (`media.role`) through the environment that the ALSA
    `pulse` and `pipewire` plugins read when they open a stream: the sound server's ducking
    then lowers other streams while the agent speaks."""
    if role is None or not device.startswith(("pulse", "pipewire", "paced")):
        return
    environ.setdefault("PULSE_PROP", f"media.role={role}")
    environ.setdefault("PIPEWIRE_PROPS", f"{{ media.role = {role} }}")


def _valid_volume(value: object) -> bool:
    """A number from 0 to 1 (not a boolean, not NaN; an integer of any size is compared
    exactly)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0 <= value <= 1  # NaN compares false
