"""The synthesis worker on the tiny voice (run whole) and a VITS-shaped one (decoded in chunks),
a real phrase cache and real ALSA (file PCM)."""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from agent.audio.device import alsa_opener
from agent.audio.player import Player
from agent.core.messages import Event, SpeakRequest, SynthesisDone, UtteranceEnded
from agent.formats.chunk import Chunk
from agent.formats.chunking import FIRST_FRAMES
from agent.formats.pcm import PCM16
from agent.speech.phrase_cache import PhraseCache
from agent.speech.synthesizer import Synthesizer, VoiceChoice
from agent.speech.voice import Cancellation, FramePlan, SynthesisParams, Voice
from harness import read_pcm, wait_until
from tests.test_voice import HOP, PARAMS, write_vits_like_voice

RATE = 22050
LONG = (
    "Attention please, the delivery van has arrived at the loading dock, and someone from "
    "receiving should come and sign for the pallets, before the driver leaves. Thank you."
)


@dataclass
class Rig:
    voice: Voice
    synthesizer: Synthesizer
    events: queue.Queue[Event]
    capture: Path
    player: Player
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))

    def say(self, request: SpeakRequest, job: int = 0, cancel: bool = False) -> UtteranceEnded:
        """Speak one request as activation `job` (cancelled at once if asked); wait until it
        has been played."""
        start = len(read_pcm(self.capture)) if self.capture.exists() else 0
        self.synthesizer.submit(request, job)
        if cancel:
            self.synthesizer.cancel(job)
            self.player.cut(job)
        ended: UtteranceEnded | None = None
        done = False
        while ended is None or not done:
            event = self.events.get(timeout=30)
            if isinstance(event, UtteranceEnded):
                ended = event
            done = done or isinstance(event, SynthesisDone)
        played = read_pcm(self.capture) if self.capture.exists() else np.zeros(0, np.int16)
        self.last = played[start:]
        return ended


def make_rig(
    tiny_voice: Path,
    tmp_path: Path,
    cache: PhraseCache,
    phrases: tuple[str, ...] = (),
    *,
    start: bool = True,
) -> Rig:
    voice = Voice.load(tiny_voice, threads=1, cache_dir=None)
    events: queue.Queue[Event] = queue.Queue()
    capture = tmp_path / f"capture-{id(cache)}.raw"
    player = Player(alsa_opener(f"file:FILE={capture},FORMAT=raw", RATE, 20, 4), RATE, events.put)
    choice = VoiceChoice("default", voice, voice.default_params)
    synthesizer = Synthesizer({"default": choice}, cache, (20, 80), player.put, events.put, phrases)
    player.start()
    if start:
        synthesizer.start()
    return Rig(voice, synthesizer, events, capture, player)


@pytest.fixture
def rig(tiny_voice: Path, tmp_path: Path) -> Iterator[Rig]:
    made = make_rig(tiny_voice, tmp_path, PhraseCache(tmp_path / "phrases", 10**7, 10**8))
    yield made
    made.synthesizer.stop()
    made.player.stop()


def test_a_long_sentence_streams_in_clause_chunks_that_add_up(rig: Rig) -> None:
    ended = rig.say(SpeakRequest("a", LONG))
    assert ended.error is None
    assert ended.info["sentences"] == 2
    assert ended.info["cached_sentences"] == 0
    assert isinstance(ended.info["synthesis_seconds"], float)
    assert rig.voice.inferences > 2  # the first sentence went out in several chunks
    assert len(rig.last) == round(ended.audio_seconds * RATE)


def test_cached_playback_does_not_call_the_engine(rig: Rig) -> None:
    first = rig.say(SpeakRequest("a", LONG))
    runs = rig.voice.inferences
    second = rig.say(SpeakRequest("b", LONG))
    assert rig.voice.inferences == runs
    assert second.info == {"sentences": 2, "cached_sentences": 2}  # no synthesis_seconds
    assert second.audio_seconds == first.audio_seconds


def test_volume_scales_the_cached_samples(rig: Rig) -> None:
    rig.say(SpeakRequest("a", "The door is open."))
    full = rig.last
    rig.say(SpeakRequest("b", "The door is open.", volume=0.5))
    assert np.array_equal(rig.last, np.round(full.astype(np.float32) * 0.5).astype(np.int16))
    rig.say(SpeakRequest("c", "The door is open.", volume=0.0))
    assert not rig.last.any()


def test_a_corrupt_cache_entry_is_synthesized_again(
    tiny_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "phrases"
    first = make_rig(tiny_voice, tmp_path, PhraseCache(directory, 10**7, 10**8))
    try:
        original = first.say(SpeakRequest("a", "The door is open."))
    finally:
        first.synthesizer.stop()
        first.player.stop()
    (entry,) = directory.glob("*/*.pcm")
    entry.write_bytes(entry.read_bytes()[:-100])  # truncated, as after a power cut
    second = make_rig(tiny_voice, tmp_path, PhraseCache(directory, 10**7, 10**8))
    try:
        with caplog.at_level(logging.WARNING):
            again = second.say(SpeakRequest("b", "The door is open."))
    finally:
        second.synthesizer.stop()
        second.player.stop()
    assert second.voice.inferences > 0
    assert (again.info["sentences"], again.info["cached_sentences"]) == (1, 0)
    assert again.audio_seconds == original.audio_seconds
    assert "corrupt" in caplog.text


def test_configured_phrases_are_rendered_in_the_background(
    tiny_voice: Path, tmp_path: Path
) -> None:
    phrases = ("Fire alarm. Leave now.", "Gas leak in hall two.")
    made = make_rig(tiny_voice, tmp_path, PhraseCache(None, 10**7, 0), phrases)
    try:
        wait_until(lambda: made.voice.inferences == 3, 30, "three phrase sentences rendered")
        ended = made.say(SpeakRequest("a", "Fire alarm. Leave now."))
        assert made.voice.inferences == 3
        assert ended.info == {"sentences": 2, "cached_sentences": 2}
    finally:
        made.synthesizer.stop()
        made.player.stop()


def test_a_late_cancel_of_an_earlier_activation_does_not_skip_the_next(rig: Rig) -> None:
    first = rig.say(SpeakRequest("w", LONG), job=1)
    rig.synthesizer.cancel(1)  # arrives after that activation ended (preempted while playing)
    rig.player.cut(1)
    again = rig.say(SpeakRequest("w", LONG), job=2)
    assert again.job == 2
    assert again.error is None
    assert again.audio_seconds == first.audio_seconds  # played in full, not skipped
    assert len(rig.last) == round(again.audio_seconds * RATE)


def test_a_cancel_during_synthesis_ends_the_activation_quickly(rig: Rig) -> None:
    ended = rig.say(SpeakRequest("x", LONG * 3), job=5, cancel=True)
    assert (ended.id, ended.job, ended.error) == ("x", 5, None)
    assert ended.audio_seconds < 1.0  # stopped early: at most a chunk reached the device
    assert rig.say(SpeakRequest("y", "Next one."), job=6).audio_seconds > 0.3


class _WatchedCache(PhraseCache):
    """A memory-only cache that calls `on_phrase` on the worker thread when the first configured
    phrase has been stored, and records how many phrases still wait when a request's sentence
    is stored."""

    def __init__(self) -> None:
        super().__init__(None, 10**8, 0)
        self.on_phrase: Callable[[], None] | None = None
        self.waiting: Callable[[], int] = lambda: -1
        self.waiting_at_request: list[int] = []
        self.phrases_stored = 0

    def put(self, key: str, pcm: PCM16, sample_rate: int, *, pinned: bool = False) -> None:
        super().put(key, pcm, sample_rate, pinned=pinned)
        if not pinned:
            self.waiting_at_request.append(self.waiting())
            return
        self.phrases_stored += 1
        if self.on_phrase is not None:
            hook, self.on_phrase = self.on_phrase, None
            hook()


def test_a_request_does_not_wait_for_the_phrases(tiny_voice: Path, tmp_path: Path) -> None:
    phrases = tuple(f"Phrase number {n}, which is long enough to take a while." for n in range(40))
    cache = _WatchedCache()
    made = make_rig(tiny_voice, tmp_path, cache, phrases, start=False)
    cache.waiting = lambda: len(made.synthesizer._phrases)
    # the request arrives while the phrases render: when the first one has been stored
    cache.on_phrase = lambda: made.synthesizer.submit(SpeakRequest("now", "Evacuate now."), 1)
    try:
        made.synthesizer.start()
        ended = made.events.get(timeout=60)
        while not isinstance(ended, UtteranceEnded):
            ended = made.events.get(timeout=60)
        assert (ended.id, ended.error) == ("now", None)
        assert cache.waiting_at_request == [len(phrases) - 1]  # spoken before any other phrase
        # the list empties when the last phrase is taken, before it is stored: wait for the store
        wait_until(lambda: cache.phrases_stored == len(phrases), 60, "all phrases rendered later")
        assert not made.synthesizer._phrases
    finally:
        made.synthesizer.stop()
        made.player.stop()


def split_rig(tmp_path: Path, split: bool = True) -> tuple[Rig, list[Chunk]]:
    """A rig on the VITS-shaped test voice (split: decoded in chunks, unless `split` is false);
    also returns every chunk handed to the player."""
    voice = Voice.load(write_vits_like_voice(tmp_path), threads=1, cache_dir=None, split=split)
    assert voice.chunked == split
    events: queue.Queue[Event] = queue.Queue()
    capture = tmp_path / f"capture-split-{split}.raw"
    player = Player(alsa_opener(f"file:FILE={capture},FORMAT=raw", RATE, 20, 4), RATE, events.put)
    handed: list[Chunk] = []

    def put(chunk: Chunk) -> bool:
        handed.append(chunk)
        return player.put(chunk)

    choice = VoiceChoice("default", voice, PARAMS)
    cache = PhraseCache(None, 10**7, 0)
    synthesizer = Synthesizer({"default": choice}, cache, (20, 80), put, events.put)
    player.start()
    synthesizer.start()
    return Rig(voice, synthesizer, events, capture, player), handed


def test_a_split_voice_streams_decoder_chunks_small_first_and_caches_the_sentence(
    tmp_path: Path,
) -> None:
    rig, handed = split_rig(tmp_path)
    whole, _ = split_rig(tmp_path, split=False)
    try:
        ended = rig.say(SpeakRequest("a", LONG))
        speech = [np.frombuffer(c.pcm, "<i2") for c in handed if c.pcm is not None]
        assert ended.info["sentences"] == 2
        groups = rig.voice.inferences  # one prior run per clause group
        assert len(speech) > groups  # groups were decoded in several chunks
        spec = rig.voice.stream_spec
        assert spec is not None
        assert len(speech[0]) == FIRST_FRAMES * HOP - spec.lag  # the first chunk is small
        assert np.array_equal(rig.last, np.concatenate(speech))
        whole.say(SpeakRequest("a", LONG))  # the same clause groups, each decoded whole
        assert whole.voice.inferences == groups
        assert len(rig.last) == len(whole.last)
        assert np.abs(rig.last.astype(np.int32) - whole.last).max() <= 1

        handed.clear()
        again = rig.say(SpeakRequest("b", LONG))
        assert rig.voice.inferences == groups  # played from the cache
        assert again.info == {"sentences": 2, "cached_sentences": 2}
        assert np.array_equal(rig.last, np.concatenate(speech))  # the cache kept every chunk
        assert len([c for c in handed if c.pcm is not None]) == 2  # one chunk per sentence
    finally:
        for made in (rig, whole):
            made.synthesizer.stop()
            made.player.stop()


def test_a_cancel_stops_a_split_voice_between_decoder_chunks(tmp_path: Path) -> None:
    voice = Voice.load(write_vits_like_voice(tmp_path), threads=1, cache_dir=None)
    events: queue.Queue[Event] = queue.Queue()
    handed: list[Chunk] = []
    decoded: list[int] = []
    stream = voice.stream

    def counting_stream(
        ids: list[int],
        params: SynthesisParams,
        plan: FramePlan | None = None,
        cancel: Cancellation | None = None,
    ) -> Generator[npt.NDArray[np.float32], None, None]:
        for audio in stream(ids, params, plan, cancel):
            decoded.append(len(audio))
            yield audio

    voice.stream = counting_stream  # type: ignore[method-assign]
    synthesizer: Synthesizer | None = None

    def put(chunk: Chunk) -> bool:
        handed.append(chunk)
        if chunk.pcm is not None and synthesizer is not None:
            synthesizer.cancel(chunk.job)  # cut while the first chunk plays
        return True

    choice = VoiceChoice("default", voice, PARAMS)
    cache = PhraseCache(None, 10**7, 0)
    synthesizer = Synthesizer({"default": choice}, cache, (20, 80), put, events.put)
    synthesizer.start()
    try:
        synthesizer.submit(SpeakRequest("x", LONG * 3), 5)
        done = events.get(timeout=30)
        assert isinstance(done, SynthesisDone)
        assert done.job == 5
        assert len(decoded) == 1  # nothing decoded after the cut
        assert [c.pcm is not None for c in handed] == [True, False]  # one chunk, then the end
        assert handed[-1].end
        assert handed[-1].error is None
    finally:
        synthesizer.stop()
