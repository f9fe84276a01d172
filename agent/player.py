"""Audio out: one ALSA PCM, opened once and kept open, fed by a writer thread from a bounded buffer.

The buffer holds at most two chunks (one sentence each), so synthesis runs one chunk ahead of
playback and blocks when it is that far ahead: double buffering without an unbounded queue. The
PCM is drained at the end of each utterance, so `finished` means the last sample was played.
Allowed imports: stdlib, numpy, alsaaudio, `messages`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from .messages import Event, Reason, UtteranceEnded, UtteranceStarted

_LOGGER = logging.getLogger(__name__)

BUFFER_CHUNKS: Final = 2
"""Chunks the double buffer holds between synthesis and the ALSA writer."""
_POLL_SECONDS: Final = 0.2


@dataclass(frozen=True, slots=True)
class Chunk:
    """Audio for one utterance; `end=True` closes the utterance (with its error, if any)."""

    id: str
    pcm: npt.NDArray[np.int16] | None = None
    end: bool = False
    error: Reason | None = None
    detail: str = ""
    info: Mapping[str, object] = field(default_factory=dict)
    """With `end`: extra fields for the utterance's last event."""


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


class Player:
    """Writer thread over a kept-open PCM; reports started and ended per utterance."""

    def __init__(self, open_pcm: PcmOpener, rate: int, report: Callable[[Event], None]) -> None:
        self._open_pcm = open_pcm
        self._rate = rate
        self._report = report
        self._buffer: queue.Queue[Chunk] = queue.Queue(maxsize=BUFFER_CHUNKS)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="alsa-writer", daemon=True)
        self._pcm: Pcm | None = None
        self._period_frames = 0
        self.underruns = 0
        """Buffer underruns reported by ALSA since start."""

    def open(self) -> None:
        """Open the device now (so a start-up problem shows early); a failure is retried later."""
        self._ensure_open()

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
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._thread.is_alive():
            _LOGGER.warning("The ALSA writer did not stop; leaving the device to process exit")
            return
        if self._pcm is not None:
            self._pcm.close()
            self._pcm = None

    def _ensure_open(self) -> str | None:
        """Open the PCM if needed; returns why it cannot be, or None."""
        if self._pcm is not None:
            return None
        try:
            self._pcm, self._period_frames = self._open_pcm()
        except Exception as err:
            _LOGGER.error("Cannot open the audio device: %s", err)
            return str(err)
        return None

    def _run_blocking(self) -> None:
        current: str | None = None
        frames = 0
        error: tuple[Reason, str] | None = None
        while not self._stopping.is_set():
            try:
                chunk = self._buffer.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if chunk.id != current:
                current, frames, error = chunk.id, 0, None
            if chunk.pcm is not None and error is None:
                try:
                    frames += self._play(chunk.id, chunk.pcm, first=frames == 0)
                except Exception as err:
                    error = (Reason.AUDIO_ERROR, str(err))
            if chunk.end:
                self._end(chunk, frames, error)
                current = None

    def _play(self, request_id: str, pcm: npt.NDArray[np.int16], *, first: bool) -> int:
        problem = self._ensure_open()
        if problem is not None:
            raise OSError(problem)
        assert self._pcm is not None  # noqa: S101 - _ensure_open succeeded
        step = self._period_frames
        for start in range(0, len(pcm), step):
            if self._stopping.is_set():
                break
            self._write(pcm[start : start + step].tobytes())
            if first:
                self._report(UtteranceStarted(request_id))
                first = False
        return len(pcm)

    def _write(self, data: bytes) -> None:
        assert self._pcm is not None  # noqa: S101 - called after _ensure_open
        try:
            while data:
                written = self._pcm.write(data)
                if written < 0:  # underrun: ALSA re-prepared the stream, the data was not taken
                    self.underruns += 1
                    continue
                data = data[written * 2 :]
        except Exception:
            self._close_after_error()
            raise

    def _end(self, chunk: Chunk, frames: int, error: tuple[Reason, str] | None) -> None:
        if error is None and frames and self._pcm is not None:
            try:
                self._pcm.drain()
            except Exception as err:
                self._close_after_error()
                error = (Reason.AUDIO_ERROR, str(err))
        if error is None and chunk.error is not None:
            error = (chunk.error, chunk.detail)
        seconds = frames / self._rate
        if error is None:
            self._report(UtteranceEnded(chunk.id, seconds, info=chunk.info))
        else:
            self._report(UtteranceEnded(chunk.id, seconds, error[0], error[1], chunk.info))

    def _close_after_error(self) -> None:
        if self._pcm is not None:
            try:
                self._pcm.close()
            except Exception:
                _LOGGER.debug("Closing the failed PCM raised", exc_info=True)
            self._pcm = None
