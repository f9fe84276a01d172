"""Timed synthesis: our Voice and piper-tts in this process, and piper-tts in a fresh process.

In process, both sides are timed the same way: from the call to the first chunk (sentence, or
for `streamed` the agent's clause group or decoder chunk) and to the last, with the seconds of
audio produced. The piper-tts child process loads the voice, synthesizes the given texts and
prints a marker line with its VmHWM and VmRSS, for cold start and memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from piper import PiperVoice
from piper.voice import AudioChunk

from agent.formats.chunking import (
    FIRST_FRAMES,
    FRAME_GROWTH,
    MAX_FRAMES,
    group_clauses,
    grow,
)
from agent.formats.pcm import PCM16
from agent.settings.declarations import TtsConfig
from agent.speech.voice import FramePlan, SynthesisParams, Voice, to_pcm16
from bench.agent_side import Memory
from harness import TIMEOUT

T = TypeVar("T")

MARKER: Final = "BENCH-DONE"
CHILD_TIMEOUT: Final = 10 * TIMEOUT
"""How long a piper-tts child may take for its texts before it counts as hung (a loaded
machine slows a minute of synthesis several times)."""
PIPER_CHILD: Final = """
import json, sys
from piper import PiperVoice
voice = PiperVoice.load(sys.argv[1])
for text in json.loads(sys.argv[2]):
    for _ in voice.synthesize(text):
        pass
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
pss = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)
print(
    "BENCH-DONE", status["VmHWM"].split()[0], status["VmRSS"].split()[0], pss["Pss"].split()[0],
    flush=True,
)
"""
"""Run as `python -c PIPER_CHILD MODEL TEXTS_JSON`; prints
`BENCH-DONE <VmHWM kB> <VmRSS kB> <Pss kB>`."""


PIPER_SERVER: Final = """
import json, sys
from piper import PiperVoice
voice = PiperVoice.load(sys.argv[1])
print("READY", flush=True)
for line in sys.stdin:
    samples, rate = 0, 1
    for chunk in voice.synthesize(json.loads(line)):
        samples += len(chunk.audio_float_array)
        rate = chunk.sample_rate
    print("DONE", samples / rate, flush=True)
"""
"""Run as `python -c PIPER_SERVER MODEL`: one long-lived piper-tts process; each line of stdin
a JSON text, synthesized whole (every chunk consumed), answered `DONE <seconds of audio>`."""


class PiperServer:
    """A long-lived piper-tts process on the voice (as a node that keeps piper loaded has it):
    its CPU time per text is read from /proc (`process_tree`), like the agent's."""

    def __init__(self, model: Path, stderr_log: Path) -> None:
        self._errors = stderr_log.open("ab")
        self._child = subprocess.Popen(
            [sys.executable, "-c", PIPER_SERVER, str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        self._line("READY")

    @property
    def pid(self) -> int:
        return self._child.pid

    def speak(self, text: str) -> float:
        """Synthesize a text; seconds of audio."""
        assert self._child.stdin is not None  # noqa: S101 - made with a pipe
        self._child.stdin.write(json.dumps(text) + "\n")
        self._child.stdin.flush()
        return float(self._line("DONE").split()[1])

    def _line(self, marker: str) -> str:
        watchdog = threading.Timer(CHILD_TIMEOUT, self._child.kill)  # a hung child ends it
        watchdog.start()
        try:
            assert self._child.stdout is not None  # noqa: S101 - made with a pipe
            for line in self._child.stdout:
                if line.startswith(marker):
                    return line
        finally:
            watchdog.cancel()
        raise RuntimeError(f"the piper-tts server exited with {self._child.wait()} before {marker}")

    def stop(self) -> None:
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        self._errors.close()


@dataclass(frozen=True)
class StreamTiming:
    """One synthesis: seconds to the first chunk, to the last, and seconds of audio."""

    first: float
    total: float
    audio: float

    @property
    def speed(self) -> float:
        """Seconds of audio per second of compute."""
        return self.audio / self.total


Synth = Callable[[str], StreamTiming]
"""Synthesizes a text, timed."""
PLAN: Final = (FIRST_FRAMES, FRAME_GROWTH, MAX_FRAMES)
"""The agent's decoder chunks: first chunk, growth, largest chunk (frames)."""


def time_stream(start: Callable[[], Iterable[T]], seconds_of: Callable[[T], float]) -> StreamTiming:
    """Consume a chunk stream, timing the first chunk and the end."""
    began = time.perf_counter()
    first: float | None = None
    audio = 0.0
    for chunk in start():
        if first is None:
            first = time.perf_counter() - began
        audio += seconds_of(chunk)
    total = time.perf_counter() - began
    return StreamTiming(total if first is None else first, total, audio)


def ours(voice: Voice) -> Synth:
    """Our voice with its default parameters (from the voice JSON)."""
    rate = voice.sample_rate

    def seconds(pcm: PCM16) -> float:
        return len(pcm) / rate

    return lambda text: time_stream(lambda: voice.synthesize(text), seconds)


def agent_chunks(
    voice: Voice, text: str, params: SynthesisParams, plan: tuple[int, int, int] = PLAN
) -> Iterator[PCM16]:
    """The audio chunks the agent's synthesizer makes for an uncached text, in this thread.

    The same plan as `agent.speech.synthesizer` with the default `tts` settings: each sentence in
    clause groups, small first; on a split voice each group's latent frames in decoder chunks,
    small first and growing (`agent.formats.chunking.frame_chunks`; `plan`: first chunk, growth,
    largest chunk, in frames); on a whole voice each group whole.
    """
    tts = TtsConfig()
    first_frames, growth, cap = plan
    budget, frames = tts.first_chunk_phonemes, FramePlan(first_frames, cap, growth)
    for sentence in voice.sentences(text):
        groups = group_clauses([len(clause) for clause in sentence], budget, tts.max_chunk_phonemes)
        for group in groups:
            ids = voice.ids(sentence[group.start : group.stop])
            for audio in voice.stream(ids, params, frames):
                yield to_pcm16(audio)
        budget = grow(budget, tts.max_chunk_phonemes, len(groups))


def streamed(voice: Voice, params: SynthesisParams | None = None) -> Synth:
    """Our voice as the agent streams it (`agent_chunks`), with its default parameters unless
    given."""
    rate = voice.sample_rate

    def seconds(pcm: PCM16) -> float:
        return len(pcm) / rate

    chosen = params or voice.default_params
    return lambda text: time_stream(lambda: agent_chunks(voice, text, chosen), seconds)


def piper(voice: PiperVoice) -> Synth:
    """piper-tts with its defaults."""

    def seconds(chunk: AudioChunk) -> float:
        return len(chunk.audio_float_array) / chunk.sample_rate

    return lambda text: time_stream(lambda: voice.synthesize(text), seconds)


@dataclass(frozen=True)
class ChildRun:
    """A piper-tts child: spawn-to-marker seconds and its memory at the end."""

    seconds: float
    memory: Memory


def run_piper_child(model: Path, texts: Sequence[str], stderr_log: Path) -> ChildRun:
    """Spawn a fresh Python that loads the voice with piper-tts and synthesizes texts."""
    args = [sys.executable, "-c", PIPER_CHILD, str(model), json.dumps(list(texts))]
    with stderr_log.open("ab") as errors:
        spawned = time.perf_counter()
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errors, text=True)
        watchdog = threading.Timer(CHILD_TIMEOUT, child.kill)  # a hung child ends the read
        watchdog.start()
        try:
            line = _marker_line(child)
            elapsed = time.perf_counter() - spawned
            child.wait(TIMEOUT)
        finally:
            watchdog.cancel()
            if child.poll() is None:
                child.kill()
                child.wait()
    _, peak_kib, rss_kib, pss_kib = line.split()
    return ChildRun(elapsed, Memory.from_kib(peak_kib, rss_kib, pss_kib))


def _marker_line(child: subprocess.Popen[str]) -> str:
    if child.stdout is None:
        raise RuntimeError("the piper-tts child has no stdout pipe")
    for line in child.stdout:
        if line.startswith(MARKER):
            return line
    raise RuntimeError(f"the piper-tts child exited with {child.wait()} before {MARKER}")
