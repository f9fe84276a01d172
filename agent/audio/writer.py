"""The ALSA writer thread: takes chunks from the lanes and writes them to the device, one period
at a time.

Between periods it applies the volume (requested x global, with the alarm floor) and notices a
cut, which it turns into a one-period fade to silence; a cut between two chunks ramps from the
last sample to silence in 5 ms. The arithmetic is numpy's float32 one done without numpy
(`formats.samples`), so a lean process plays the bytes the agent always played. Before an
utterance's first sample: its instant (a timed start, padded to the exact frame) or a lead-in
of silence for a speaker that sleeps. The PCM is drained at the end of each announcement, so
`finished` means played; an idle device is released after a while.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

from agent.audio.device import AudioUnavailableError, Device
from agent.audio.lanes import Lane, Lanes, Utterance
from agent.core.messages import UtteranceEnded, UtteranceStarted
from agent.core.reasons import Reason
from agent.core.start_clock import frame_at
from agent.core.volume import effective_volume
from agent.formats.chunk import SAMPLE_BYTES, Chunk
from agent.formats.samples import f32, pcm_of, ramp, rounded, samples_of

_LOGGER = logging.getLogger(__name__)

_POLL_SECONDS: Final = 0.05
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


class Writer:
    """The writer thread's work (`run`); `volume` and `floor` are read at every period."""

    def __init__(  # noqa: PLR0917 - the player hands over its parts
        self,
        device: Device,
        lanes: Lanes,
        rate: int,
        idle: IdlePolicy,
        stopping: threading.Event,
        wakeup: threading.Event,
    ) -> None:
        self._device = device
        self._lanes = lanes
        self._rate = rate
        self._idle = idle
        self._stopping = stopping
        self._wakeup = wakeup
        self._last_sound = time.monotonic()
        self.volume = 1.0
        """The global volume, 0 to 1."""
        self.floor = 0.0
        """The least volume of alarm and critical."""

    def run(self) -> None:
        """Play what the lanes give until the player stops."""
        while not self._stopping.is_set():
            taken = self._lanes.take()
            if taken is None:
                if self._device.pcm is None and self._device.available is False:
                    with contextlib.suppress(AudioUnavailableError):  # nothing starts till then
                        self._device.ensure_open(self._stopping.is_set)
                elif self._device.pcm is not None and self._idle_too_long():
                    _LOGGER.info("Audio device idle: released until the next announcement")
                    self._device.close()  # other programs may use a hw: device meanwhile
                continue
            lane, current, chunk = taken
            if chunk.pcm is not None and current.error is None and not current.cut:
                self._play(lane, current, chunk)
            if chunk.end:
                self._end(lane, current, chunk)

    def _idle_too_long(self) -> bool:
        release = self._idle.release_after
        return release > 0 and time.monotonic() - self._last_sound > release

    def _play(self, lane: Lane, current: Utterance, chunk: Chunk) -> None:
        assert chunk.pcm is not None  # noqa: S101 - checked by the caller
        if not self._ready(lane, current):
            return
        step = self._device.period_frames * SAMPLE_BYTES
        for start in range(0, len(chunk.pcm), step):
            if self._stopping.is_set():
                return
            volume = effective_volume(chunk.volume, self.volume, chunk.priority, self.floor)
            if self._lanes.is_cut(lane, current.job):
                current.cut = True
                if current.frames == 0:
                    return  # cut before a sample was heard: nothing to fade
            data = _period(chunk.pcm[start : start + step], volume, fade=current.cut)
            try:
                self._device.write(data)
            except AudioUnavailableError as err:
                current.error = (Reason.AUDIO_ERROR, str(err))
                return
            current.last_sample = int.from_bytes(data[-SAMPLE_BYTES:], "little", signed=True)
            if current.frames == 0:
                self._started(lane, current)
            current.frames += len(data) // SAMPLE_BYTES
            if current.cut:
                return

    def _started(self, lane: Lane, current: Utterance) -> None:
        """Report the first sample written, unless the utterance was preempted already (then
        its preemption was reported instead)."""
        started = current.start_at if current.late_ms == 0 else time.time()
        report = UtteranceStarted(current.id, current.job, started or time.time())
        with self._lanes.reporting:
            if not self._lanes.is_preempted(lane, current.job):
                lane.report(replace(report, late_ms=current.late_ms))

    def _ready(self, lane: Lane, current: Utterance) -> bool:
        """The device open and, before an utterance's first sample, its start: on its instant
        (timed) or after a lead-in (a sleeping speaker); False if it will not play."""
        try:
            self._device.ensure_open(lambda: self._given_up(lane, current))
        except AudioUnavailableError as err:
            current.error = (Reason.AUDIO_ERROR, str(err))
            return False
        if current.frames:
            return True
        if current.start_at is not None and current.late_ms is None:
            return self._wait_for_start(lane, current)
        return self._lead_in(lane, current)

    def _given_up(self, lane: Lane, current: Utterance) -> bool:
        """The player stops, or this utterance was cut."""
        return self._stopping.is_set() or self._lanes.is_cut(lane, current.job)

    def _wait_for_start(self, lane: Lane, current: Utterance) -> bool:
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
        silence = bytes(SAMPLE_BYTES * period)
        settled = round(self._buffer_seconds() * rate) + 2 * period  # full, then paced twice
        observed: deque[tuple[float, int]] = deque(maxlen=_OBSERVATIONS)
        written = 0
        try:
            while not self._given_up(lane, current):
                ahead = current.start_at - time.time()
                if not written and ahead > run_before:
                    self._wakeup.wait(min(ahead - run_before, _POLL_SECONDS))
                    self._wakeup.clear()  # a cut or a stop ends the wait; checked above
                    continue
                if not written and (ahead <= 0 or self._device.queued_frames() is None):
                    return self._start_unpadded(lane, current, ahead)
                if len(observed) >= _OBSERVATIONS // 2:
                    pad = frame_at(observed, rate, current.start_at) - written
                    if pad < period:
                        self._device.write(bytes(SAMPLE_BYTES * max(0, pad)))
                        current.late_ms = max(0.0, -pad * 1000 / rate)
                        return True
                self._device.write(silence)  # blocks while the device buffer is full: paced
                written += period
                taken = written - (self._device.queued_frames() or 0)
                if taken == written and not observed:  # took it all at once: not real time
                    return self._start_unpadded(lane, current, current.start_at - time.time())
                if written > settled:  # while it fills, where the stream is is not known
                    observed.append((time.time(), taken))
        except AudioUnavailableError as err:
            current.error = (Reason.AUDIO_ERROR, str(err))
        return False

    def _start_unpadded(self, lane: Lane, current: Utterance, ahead: float) -> bool:
        """A timed start without the stream's position: late (start now, say how late), or a
        device that cannot say what it holds (wait for the instant by the clock)."""
        assert current.start_at is not None  # noqa: S101 - checked by the caller
        while ahead > 0 and not self._given_up(lane, current):
            self._wakeup.wait(min(ahead, _POLL_SECONDS))
            self._wakeup.clear()
            ahead = current.start_at - time.time()
        current.late_ms = max(0.0, -ahead * 1000)
        return ahead <= 0

    def _buffer_seconds(self) -> float:
        frames = self._device.buffer_frames()
        return 0.0 if frames is None else frames / self._rate

    def _lead_in(self, lane: Lane, current: Utterance) -> bool:
        """Silence before the first sample when the device has been idle a while: a speaker
        that sleeps (HDMI, Bluetooth, an amplifier that mutes) wakes on it, so the first word
        is heard. False if the device failed."""
        frames = round(self._idle.lead_in * self._rate)
        if frames <= 0 or time.monotonic() - self._last_sound < self._idle.wake_after:
            return True
        period = self._device.period_frames
        try:
            for start in range(0, frames, period):  # a period at a time, as speech is written
                if self._given_up(lane, current):
                    return False
                self._device.write(bytes(SAMPLE_BYTES * min(period, frames - start)))
        except AudioUnavailableError as err:
            current.error = (Reason.AUDIO_ERROR, str(err))
            return False
        return True

    def _end(self, lane: Lane, current: Utterance, chunk: Chunk) -> None:
        if self._lanes.is_cut(lane, current.job) and not current.cut and current.error is None:
            current.cut = True  # cut between two chunks: the last one ended where it ended
            self._fade_tail(current)
        if current.error is None and current.frames and not current.cut:
            try:
                self._device.drain()
            except AudioUnavailableError as err:  # a device lost while draining
                current.error = (Reason.AUDIO_ERROR, str(err))
        preempted = self._lanes.ended(lane, current.job)
        if current.frames:  # what made no sound leaves the speaker asleep
            self._last_sound = time.monotonic()
        if preempted:
            return  # reported preempted: its owner plays it again
        error = current.error
        if error is None and chunk.error is not None:
            error = (chunk.error, chunk.detail)
        seconds = current.frames / self._rate
        reason, detail = error if error is not None else (None, "")
        lane.report(
            UtteranceEnded(
                current.id, seconds, reason, detail, chunk.info, current.job, time.time()
            )
        )

    def _fade_tail(self, current: Utterance) -> None:
        """Ramp from the last sample written to silence in 5 ms, so a cut never clicks."""
        if abs(current.last_sample) < _SILENT or self._device.pcm is None:
            return
        tail = rounded(ramp(current.last_sample, 0, max(2, self._rate // 200))[1:])
        with contextlib.suppress(AudioUnavailableError):
            self._device.write(pcm_of(tail))
            current.frames += len(tail)


def _period(pcm: bytes, volume: float, *, fade: bool) -> bytes:
    """One period as written: at `volume` (float32, as numpy did), faded to silence across it
    for a cut; at full volume and without a fade, the bytes as they came."""
    if volume == 1.0 and not fade:
        return pcm
    values: Iterable[float] = samples_of(pcm)
    if volume != 1.0:
        (gain,) = f32([volume])
        values = f32([sample * gain for sample in values])
    if fade:
        down = f32(ramp(1.0, 0.0, len(pcm) // SAMPLE_BYTES))
        values = f32([value * g for value, g in zip(values, down, strict=True)])
    return pcm_of(rounded(values))
