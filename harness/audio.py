"""Audio for tests: numbers about captured PCM, a paced PulseAudio null sink, a faulty PCM."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import alsaaudio
import numpy as np
import numpy.typing as npt

from agent.player import Pcm

from .wait import wait_until


def read_pcm(path: Path) -> npt.NDArray[np.int16]:
    """16-bit little-endian mono samples from a raw capture file."""
    return np.frombuffer(path.read_bytes(), dtype="<i2").astype(np.int16)


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

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = workdir / "pulse.socket"
        self.script = workdir / "null.pa"
        self.script.write_text(
            "load-module module-null-sink sink_name=nullsink\n"
            f"load-module module-native-protocol-unix auth-anonymous=1 socket={self.socket}\n"
            "set-default-sink nullsink\n",
            encoding="utf-8",
        )
        self.xdg = workdir / "xdg"
        (self.xdg / "alsa").mkdir(parents=True, exist_ok=True)
        (self.xdg / "alsa" / "asoundrc").write_text(
            "pcm.paced_capture {\n"
            "    type file\n"
            '    slave.pcm "pulse"\n'
            '    file { @func getenv vars [ CAPTURE_FILE ] default "capture.raw" }\n'
            '    format "raw"\n'
            "}\n",
            encoding="utf-8",
        )
        self.log = workdir / "pulse.log"
        self._process: subprocess.Popen[bytes] | None = None

    def env(self, capture: Path) -> dict[str, str]:
        """Environment for a client that plays to `paced_capture` and captures to `capture`."""
        return {
            "PULSE_SERVER": f"unix:{self.socket}",
            "XDG_CONFIG_HOME": str(self.xdg),
            "CAPTURE_FILE": str(capture),
        }

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
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)


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
