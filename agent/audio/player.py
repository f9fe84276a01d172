"""Audio out: one ALSA PCM, opened once and kept open, fed by a writer thread from two lanes.

The normal lane carries announcements, the urgent lane alarms, which always go first
(`lanes`); each is a buffer of at most two chunks (a chime, or a group of clauses), so its
producer runs one chunk ahead of playback and blocks when it is that far ahead: double
buffering without an unbounded queue. Lanes are served between chunks: an alarm gets in within
a period by `preempt_normal`, which cuts the normal lane's utterance (a fade) and reports it
preempted, so its owner requeues it. The writer (`writer`) plays a period at a time, with the
volume and a cut's fade applied between periods. An underrun is recovered and counted; a
device that fails or cannot be opened is closed and opened again with backoff (tenacity),
reported as unavailable meanwhile; the announcement it broke fails with `audio_error`, later
ones wait. Nothing here imports numpy: the process that plays alarms starts lean.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, MutableMapping

from agent.audio.device import AudioUnavailableError, Device, PcmOpener
from agent.audio.lanes import BUFFER_CHUNKS, Lanes
from agent.audio.writer import RUN_BEFORE_SECONDS, IdlePolicy, Writer
from agent.core.messages import Event, NormalPreempted
from agent.formats.chunk import Chunk

__all__ = [
    "BUFFER_CHUNKS",
    "RUN_BEFORE_SECONDS",
    "IdlePolicy",
    "Player",
    "announce_role",
]

_LOGGER = logging.getLogger(__name__)


class Player:
    """Writer thread over a kept-open PCM, fed by a normal and an urgent lane; reports started,
    ended, preempted and device availability."""

    def __init__(  # noqa: PLR0917 - the composition root passes every setting
        self,
        open_pcm: PcmOpener,
        rate: int,
        report: Callable[[Event], object],
        volume: float = 1.0,
        floor: float = 0.0,
        idle: IdlePolicy | None = None,
        report_urgent: Callable[[Event], object] | None = None,
    ) -> None:
        """`report` hears the normal lane (started, ended, preempted) and the device's
        availability; `report_urgent` (default: `report`) hears the urgent lane (started,
        ended), and the device's availability too."""
        self._report = report
        self._report_urgent = report_urgent or report
        self._lanes = Lanes(report, self._report_urgent)
        self._stopping = threading.Event()
        self._wakeup = threading.Event()
        """Set by a cut or a stop: a wait for the device or for an instant gives up at once."""
        self._device = Device(open_pcm, self._report_status, self._wakeup)
        self._writer = Writer(
            self._device, self._lanes, rate, idle or IdlePolicy(), self._stopping, self._wakeup
        )
        self._writer.volume = float(volume) if _valid_volume(volume) else 1.0
        self._writer.floor = floor
        self._thread = threading.Thread(target=self._writer.run, name="alsa-writer", daemon=True)

    @property
    def volume(self) -> float:
        """The global volume, 0 to 1."""
        return self._writer.volume

    @volume.setter
    def volume(self, value: float) -> None:
        """Set the global volume; anything but a number from 0 to 1 is refused (logged) and the
        volume stays as it was, so the writer never meets it."""
        if not _valid_volume(value):
            _LOGGER.warning("Volume %.40r refused: expected a number from 0 to 1", value)
            return
        self._writer.volume = float(value)  # read by the writer at each period: applies at once

    def put(self, chunk: Chunk) -> bool:
        """Queue audio on the normal lane, blocking while its buffer is full; False once the
        player is stopping."""
        return self._lanes.put(self._lanes.normal, chunk, self._stopping)

    def put_urgent(self, chunk: Chunk) -> bool:
        """Queue audio on the urgent lane (played before anything of the normal lane), blocking
        while its buffer is full; False once the player is stopping."""
        return self._lanes.put(self._lanes.urgent, chunk, self._stopping)

    def cut(self, job: int, urgent: bool = False) -> None:
        """Fade out this activation of the normal lane (of the urgent one with `urgent`) at the
        next period boundary and drop the rest of it; its end is reported as usual."""
        self._lanes.cut(self._lanes.urgent if urgent else self._lanes.normal, job)
        self._wakeup.set()  # a wait for the device gives up at once

    def cut_urgent(self, job: int) -> None:
        """`cut(job, urgent=True)`: the urgent lane's owner numbers its jobs on its own."""
        self.cut(job, urgent=True)

    def preempt_normal(self, by: str) -> None:
        """Cut the normal lane's current utterance (the one whose first chunk was taken and
        whose end was not, else the one whose chunks wait in its buffer, none of them heard)
        as `cut` does, drop it to its end chunk without reporting it ended, and report
        `NormalPreempted` once, so its owner requeues it: after its `UtteranceStarted` if that
        was reported, and then no `UtteranceStarted` of it follows. Nothing current: nothing
        happens."""
        with self._lanes.reporting:  # after its start, if that was reported; else instead
            preempted = self._lanes.preempt_normal()
            if preempted is not None:
                self._report(NormalPreempted(*preempted, by))
        self._wakeup.set()

    def hold_normal(self, on: bool) -> None:
        """While on, nothing is taken from the normal lane: its chunks wait in its buffer (an
        utterance it had started waits between two chunks)."""
        self._lanes.hold_normal(on)

    def open(self) -> None:
        """Open the device now, so a problem shows at start; a failure is retried later."""
        with contextlib.suppress(AudioUnavailableError):  # reported unavailable
            self._device.open()

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the writer (audio not yet played is dropped) and close the device."""
        self._stopping.set()
        self._lanes.wake()
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

    def _report_status(self, event: Event) -> None:
        """The device's availability, to both lanes' listeners."""
        self._report(event)
        if self._report_urgent is not self._report:
            self._report_urgent(event)


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
