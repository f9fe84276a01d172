"""Audio for tests: numbers about captured PCM, a paced PulseAudio null sink, a faulty PCM."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import alsaaudio
import numpy as np
import numpy.typing as npt

from agent.audio.device import Pcm

from .wait import wait_until


def read_pcm(path: Path) -> npt.NDArray[np.int16]:
    """16-bit little-endian mono samples from a raw capture file."""
    return np.frombuffer(path.read_bytes(), dtype="<i2").astype(np.int16)


def same_speech(a: npt.NDArray[np.int16], b: npt.NDArray[np.int16]) -> float:
    """Pearson correlation of two recordings over their common length, from their first sample:
    above 0.9 for the same voice saying the same text with the same parameters."""
    n = min(len(a), len(b))
    return float(np.corrcoef(a[:n].astype(np.float64), b[:n].astype(np.float64))[0, 1])


def located(haystack: npt.NDArray[np.int16], needle: npt.NDArray[np.int16]) -> tuple[int, float]:
    """Where `needle` lies in `haystack` (the best cross-correlation), and the Pearson
    correlation there."""
    a, b = haystack.astype(np.float64), needle.astype(np.float64)
    size = 1 << int(np.ceil(np.log2(len(a) + len(b))))
    scores = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)
    lag = int(np.argmax(scores[: len(a) - len(b) + 1]))
    return lag, float(np.corrcoef(a[lag : lag + len(b)], b)[0, 1])


def speech_stats(samples: npt.NDArray[np.int16], rate: int) -> dict[str, float]:
    """Duration, RMS level (dBFS) and the share of 20 ms frames louder than -45 dBFS."""
    audio = samples.astype(np.float64) / 32768.0
    frame = rate // 50
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    frame_db = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)
    return {
        "seconds": len(audio) / rate,
        "rms_dbfs": float(10 * np.log10(np.mean(audio**2) + 1e-12)),
        "voiced_share": float(np.mean(frame_db > -45)) if len(frames) else 0.0,
    }


class PulseNullSink:
    """A PulseAudio server with a null sink: ALSA's `pulse` device then plays in real time.

    The ALSA config it writes defines `paced_capture`: a `file` PCM over `pulse` that also keeps
    every frame written in the file named by $CAPTURE_FILE (platform notes)."""

    def __init__(
        self, workdir: Path, sink: str = "", modules: Sequence[str] = (), pcms: str = ""
    ) -> None:
        """`sink`: arguments of the null sink (e.g. `rate=22050 channels=2`); `modules`: more
        `load-module` lines (role ducking); `pcms`: more ALSA PCM definitions for clients."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = workdir / "pulse.socket"
        self.script = workdir / "null.pa"
        lines = [
            f"load-module module-null-sink sink_name=nullsink {sink}".strip(),
            *modules,
            f"load-module module-native-protocol-unix auth-anonymous=1 socket={self.socket}",
            "set-default-sink nullsink",
        ]
        self.script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.xdg = workdir / "xdg"
        (self.xdg / "alsa").mkdir(parents=True, exist_ok=True)
        (self.xdg / "alsa" / "asoundrc").write_text(
            "pcm.paced_capture {\n"
            "    type file\n"
            '    slave.pcm "pulse"\n'
            '    file { @func getenv vars [ CAPTURE_FILE ] default "capture.raw" }\n'
            '    format "raw"\n'
            "}\n" + pcms,
            encoding="utf-8",
        )
        self.log = workdir / "pulse.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._awake: subprocess.Popen[bytes] | None = None

    def env(self, capture: Path, sink: str | None = None) -> dict[str, str]:
        """Environment for a client that plays to `paced_capture` and captures to `capture`
        (on the default sink, or on `sink`)."""
        env = {
            "PULSE_SERVER": f"unix:{self.socket}",
            "XDG_CONFIG_HOME": str(self.xdg),
            "CAPTURE_FILE": str(capture),
        }
        return env if sink is None else {**env, "PULSE_SINK": sink}

    def record(
        self, path: Path, channels: int, rate: int, sink: str = "nullsink"
    ) -> subprocess.Popen[bytes]:
        """Record a sink's monitor (what every stream on it sums to, on the sound server's one
        clock) as raw S16_LE to `path`; returns once samples arrive. Terminate the process to
        stop."""
        command = ["parec", "-d", f"{sink}.monitor", "--raw", "--format=s16le"]
        command += [f"--rate={rate}", f"--channels={channels}", "--latency-msec=20"]
        with path.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, env={**os.environ, **self.env(path)})
        wait_until(lambda: path.stat().st_size > 0, 15, "the monitor recording")
        return process

    def sink_inputs(self) -> str:
        """`pactl list sink-inputs`: the streams playing now, with their properties."""
        env = {**os.environ, **self.env(self.socket.parent / "unused.raw")}
        command = ["pactl", "list", "sink-inputs"]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout

    def start(self) -> None:
        """Start the server in the foreground and wait for its socket."""
        args = ["pulseaudio", "-n", "-F", str(self.script), "--exit-idle-time=-1"]
        args += ["--daemonize=no", "--use-pid-file=no", "--system=no", "--disallow-exit"]
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HOME": str(self.xdg)},
            )
        wait_until(self.socket.exists, 15, "the PulseAudio socket")
        # A null sink that nothing records sleeps in blocks of up to 2 s and only notices a new
        # stream at the end of one: a stream started then waits up to 2 s (no sound card's sink
        # does that: those rewind). Recording its monitor at low latency keeps it awake.
        awake = ["parec", "-d", "nullsink.monitor", "--latency-msec=10", "--raw"]
        self._awake = subprocess.Popen(
            awake,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **self.env(self.socket.parent / "unused.raw")},
        )
        self._warm_up()

    def _warm_up(self) -> None:
        """Play a second of silence through ALSA's `pulse` device and wait for it: the
        first stream of a fresh server can stall for a second or more (seen in CI: a test's
        first 1.5 s of speech took that long to be consumed), which no test should measure."""
        env = {**os.environ, **self.env(self.socket.parent / "warm-up.raw")}
        command = ["aplay", "-q", "-D", "pulse", "-t", "raw", "-f", "S16_LE", "-r", "22050"]
        subprocess.run(
            [*command, "-c", "1", "-d", "1", "/dev/zero"], env=env, check=True, timeout=30
        )

    def stop(self) -> None:
        """Stop the server."""
        if self._awake is not None and self._awake.poll() is None:
            self._awake.terminate()
            self._awake.wait(10)
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)


def onsets(samples: npt.NDArray[np.int16], rate: int, quiet: float, level: int = 300) -> list[int]:
    """Indices of the first sample louder than `level` after at least `quiet` seconds of samples
    below it (the starts of sounds separated by silence)."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > level)
    if not len(loud):
        return []
    gaps = np.diff(loud) > quiet * rate
    return [int(loud[0]), *(int(i) for i in loud[1:][gaps])]


class FaultyPcm:
    """A real PCM with faults at given writes (1-based): `underrun` returns what pyalsaaudio
    returns after recovering one (-EPIPE), `lost` raises as a vanished device does."""

    def __init__(self, pcm: Pcm, faults: Mapping[int, str]) -> None:
        self._pcm, self._faults, self._writes = pcm, faults, 0

    def write(self, data: bytes) -> int:
        self._writes += 1
        fault = self._faults.get(self._writes)
        if fault == "underrun":
            return -errno.EPIPE
        if fault == "lost":
            raise alsaaudio.ALSAAudioError("No such device [hw:1,0]")
        return self._pcm.write(data)

    def drain(self) -> int:
        return self._pcm.drain()

    def close(self) -> None:
        self._pcm.close()


class TimedRecording:
    """A sink's monitor recorded to a file, with the sound server's timeline: where each sample
    lies in `time.perf_counter()` seconds, so that a publish and the first sample of what it
    made heard can be subtracted.

    `parec` writes samples to the file in small pieces as the sink renders them (`latency_ms`);
    a thread looks at the file's size every 2 ms and times each growth. The sink renders in
    real time, so sample `i` was rendered at `origin + i / rate` at the latest, where `origin`
    is the least of (time seen - samples so far / rate) over every look: the earliest any
    piece could have been there. A time read this way is late by the recording's own delivery
    delay (a few milliseconds; never early), so a latency measured with it is a little
    pessimistic; a look delayed by a busy machine only leaves `origin` as it was. parec writes
    to the file itself: nothing in this process can hold the recording back."""

    def __init__(
        self,
        sink: PulseNullSink,
        rate: int,
        path: Path,
        sink_name: str = "nullsink",
        latency_ms: int = 5,
    ) -> None:
        self.rate = rate
        self.path = path
        self._command = ["parec", "-d", f"{sink_name}.monitor", "--raw", "--format=s16le"]
        self._command += [f"--rate={rate}", "--channels=1", f"--latency-msec={latency_ms}"]
        self._env = {**os.environ, **sink.env(sink.socket.parent / "unused.raw")}
        self._origin = float("inf")
        self._size = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._watch: threading.Thread | None = None

    def start(self) -> TimedRecording:
        """Start recording; returns once samples arrive."""
        with self.path.open("wb") as out:
            self._process = subprocess.Popen(
                self._command, stdout=out, stderr=subprocess.DEVNULL, env=self._env
            )
        self._watch = threading.Thread(target=self._look, daemon=True)
        self._watch.start()
        wait_until(lambda: self.samples_so_far() > 0, 15, "the monitor recording")
        return self

    def _look(self) -> None:
        while not self._stopping.wait(0.002):
            size = self.path.stat().st_size // 2
            now = time.perf_counter()
            with self._lock:
                if size > self._size:
                    self._size = size
                    self._origin = min(self._origin, now - size / self.rate)

    def samples_so_far(self) -> int:
        """How many samples arrived."""
        with self._lock:
            return self._size

    def samples(self, start: int = 0, stop: int | None = None) -> npt.NDArray[np.int16]:
        """The samples recorded from index `start` to `stop` (the end so far)."""
        end = self.samples_so_far() if stop is None else min(stop, self.samples_so_far())
        if end <= start:
            return np.zeros(0, dtype=np.int16)
        with self.path.open("rb") as file:
            file.seek(2 * start)
            data = file.read(2 * (end - start))
        return np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2").astype(np.int16)

    def index_at(self, when: float) -> int:
        """The sample the sink rendered at perf_counter time `when` (may lie ahead of what
        arrived)."""
        with self._lock:
            return max(0, round((when - self._origin) * self.rate))

    def time_of(self, index: int) -> float:
        """The perf_counter time the sink rendered sample `index` (at the latest)."""
        with self._lock:
            return self._origin + index / self.rate

    def stop(self) -> None:
        """Stop recording (the file stays)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)
        self._stopping.set()
        if self._watch is not None:
            self._watch.join(10)


def correlation_track(
    haystack: npt.NDArray[np.int16], needle: npt.NDArray[np.int16]
) -> npt.NDArray[np.float64]:
    """The Pearson correlation of `needle` with `haystack` at every lag where it fits whole
    (by FFT; a flat stretch of `haystack` correlates 0)."""
    a, b = haystack.astype(np.float64), needle.astype(np.float64)
    n = len(b)
    if len(a) < n or n < 2:
        return np.zeros(0)
    b = b - b.mean()
    size = 1 << int(np.ceil(np.log2(len(a) + n)))
    dots = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)
    dots = dots[: len(a) - n + 1]
    sums = np.concatenate(([0.0], np.cumsum(a)))
    squares = np.concatenate(([0.0], np.cumsum(a * a)))
    window_sum = sums[n:] - sums[:-n]
    spread = (squares[n:] - squares[:-n]) - window_sum**2 / n
    scale = np.sqrt(np.maximum(spread, 0.0)) * np.sqrt(float(b @ b))
    track = np.zeros(len(dots))
    ok = scale > 1e-6 * max(1.0, float(scale.max(initial=0.0)))
    track[ok] = dots[ok] / scale[ok]
    return track


def first_match(
    haystack: npt.NDArray[np.int16], needle: npt.NDArray[np.int16], threshold: float
) -> tuple[int, float] | None:
    """The first place `needle` is heard in `haystack` (its first lag with a Pearson
    correlation above `threshold`, refined to the best lag within half a needle after it), and
    the correlation there; None if nowhere."""
    track = correlation_track(haystack, needle)
    above = np.flatnonzero(track > threshold)
    if not len(above):
        return None
    start = int(above[0])
    stop = min(len(track), start + max(1, len(needle) // 2))
    best = start + int(np.argmax(track[start:stop]))
    return best, float(track[best])


def heard_in_order(
    haystack: npt.NDArray[np.int16],
    needle: npt.NDArray[np.int16],
    piece: int,
    threshold: float = 0.8,
) -> tuple[int, int, int | None]:
    """How much of `needle` reached `haystack`, piece by piece (`piece` samples each; the
    near-silent ones skipped), each found after the last one found: (pieces found, pieces,
    where the first found lies). Silence between pieces (an underrun's) does not matter; a
    piece that is not found (cut short, lost samples in it) is counted out and the next one is
    looked for from the same place."""
    level = np.abs(needle.astype(np.int32))
    floor = 0.05 * float(level.max(initial=0))
    pieces = [
        needle[start : start + piece]
        for start in range(0, len(needle) - piece // 2, piece)
        if float(level[start : start + piece].max(initial=0)) > floor
    ]
    found, position, first = 0, 0, None
    for part in pieces:
        match = first_match(haystack[position:], part, threshold)
        if match is None:
            continue
        found += 1
        if first is None:
            first = position + match[0]
        position += match[0] + len(part) // 2
    return found, len(pieces), first
