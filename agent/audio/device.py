"""The ALSA playback device: a PCM opened for 16-bit mono at the voice's rate and kept open, opened
again with backoff (tenacity) when it cannot be or fails, reported available or not; its writes
count and recover underruns. Used by the player's writer thread only."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Final, Protocol

from agent.core.messages import AudioStatus, Event

_LOGGER = logging.getLogger(__name__)

_REOPEN_MAX_SECONDS: Final = 10.0


class Pcm(Protocol):
    """The part of an ALSA playback PCM the player uses (pyalsaaudio's PCM has it)."""

    def write(self, data: bytes) -> int:
        """Write frames; returns frames written, or a negative errno after an underrun."""

    def drain(self) -> int:
        """Block until every written frame has been played."""

    def close(self) -> None:
        """Release the device."""


PcmOpener = Callable[[], tuple[Pcm, int]]
"""Opens the PCM; returns it with its period size in frames."""


class AudioUnavailableError(OSError):
    """The device cannot be opened or failed while in use."""


def alsa_opener(device: str, rate: int, period_ms: int, periods: int) -> PcmOpener:
    """Open `device` for 16-bit mono playback at `rate` with the given period geometry."""

    def open_pcm() -> tuple[Pcm, int]:
        import alsaaudio  # noqa: PLC0415 - the C extension is loaded by the edge that needs it

        pcm = alsaaudio.PCM(
            type=alsaaudio.PCM_PLAYBACK,
            mode=alsaaudio.PCM_NORMAL,
            device=device,
            rate=rate,
            channels=1,
            format=alsaaudio.PCM_FORMAT_S16_LE,
            periodsize=max(1, rate * period_ms // 1000),
            periods=periods,
        )
        info = pcm.info()
        _LOGGER.info(
            "Opened ALSA PCM %s: %d Hz, period %d frames, buffer %d frames",
            device,
            info["rate"],
            info["period_size"],
            info["buffer_size"],
        )
        return pcm, int(info["period_size"])

    return open_pcm


class Device:
    """One PCM, as `open_pcm` makes it; `report` hears when it becomes available or not, and
    `wakeup` (set by a cut or a stop) ends a wait between two attempts at once."""

    def __init__(
        self, open_pcm: PcmOpener, report: Callable[[Event], object], wakeup: threading.Event
    ) -> None:
        self._open_pcm = open_pcm
        self._report = report
        self._wakeup = wakeup
        self.pcm: Pcm | None = None
        """The open PCM, None while closed."""
        self.period_frames = 0
        self.available: bool | None = None
        """Whether it opened last time it was tried (None: never tried)."""
        self.underruns = 0
        """Buffer underruns reported by ALSA since start (each was recovered)."""

    def open(self) -> None:
        """Open it now (a failure is reported, and raised as AudioUnavailableError)."""
        try:
            self.pcm, self.period_frames = self._open_pcm()
        except Exception as err:
            self._set_available(False, str(err))
            raise AudioUnavailableError(str(err)) from err
        with contextlib.suppress(Exception):  # a device that cannot drain yet is no failure
            self.pcm.drain()  # idle until written: a sound server sees no stream playing
        self._set_available(True)

    def ensure_open(self, give_up: Callable[[], bool]) -> None:
        """Open the PCM if needed, retrying with backoff until it opens or `give_up` says so
        (then AudioUnavailableError)."""
        if self.pcm is not None:
            return
        # tenacity loads with the first reopen, not with the process
        from tenacity import Retrying, retry_if_exception_type, wait_exponential  # noqa: PLC0415

        retrying = Retrying(
            wait=wait_exponential(multiplier=0.5, max=_REOPEN_MAX_SECONDS),
            retry=retry_if_exception_type(AudioUnavailableError),
            stop=lambda _state: give_up(),
            sleep=self._sleep,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                self.open()

    def write(self, data: bytes) -> None:
        """Write all of `data` (blocks while the device buffer is full); a failure closes the
        device, reports it and raises AudioUnavailableError."""
        assert self.pcm is not None  # noqa: S101 - called once it is open
        try:
            while data:
                written = self.pcm.write(data)
                if written < 0:  # underrun: ALSA re-prepared the stream, the data was not taken
                    self.underruns += 1
                    _LOGGER.warning("Audio underrun (%d so far); recovered", self.underruns)
                    continue
                data = data[written * 2 :]
        except Exception as err:
            self.lost(str(err))
            raise AudioUnavailableError(str(err)) from err

    def drain(self) -> None:
        """Wait until every frame written has been played (AudioUnavailableError if it fails)."""
        if self.pcm is None:
            return
        try:
            self.pcm.drain()
        except Exception as err:
            self.lost(str(err))
            raise AudioUnavailableError(str(err)) from err

    def queued_frames(self) -> int | None:
        """Frames written to the device and not yet taken by it (None: it cannot say)."""
        avail = getattr(self.pcm, "avail", None)
        info = getattr(self.pcm, "info", None)
        if avail is None or info is None:
            return None
        try:
            return max(0, int(info()["buffer_size"]) - int(avail()))
        except Exception:  # noqa: BLE001 - a device that cannot tell
            return None

    def buffer_frames(self) -> int | None:
        """The device buffer's size in frames (None: it cannot say)."""
        info = getattr(self.pcm, "info", None)
        if info is None:
            return None
        try:
            return int(info()["buffer_size"])
        except Exception:  # noqa: BLE001 - a device that cannot tell
            return None

    def lost(self, detail: str) -> None:
        """The device failed: closed, and reported unavailable."""
        self.close()
        self._set_available(False, detail)

    def close(self) -> None:
        if self.pcm is not None:
            try:
                self.pcm.close()
            except Exception:
                _LOGGER.debug("Closing the PCM raised", exc_info=True)
            self.pcm = None

    def _sleep(self, seconds: float) -> None:
        self._wakeup.wait(seconds)  # cut() and stop() end the wait at once
        self._wakeup.clear()

    def _set_available(self, available: bool, detail: str = "") -> None:
        if self.available == available:
            return
        self.available = available
        if available:
            _LOGGER.info("Audio device available")
        else:
            _LOGGER.error("Audio device unavailable: %s", detail)
        self._report(AudioStatus(available, detail))
