"""The media source with the real decoder child: sounds made ready from arrival on its own
threads, a higher class stopping a lower decode, a cut ending the synthesizer's wait at once,
and what is held reported and let go."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest

from agent.core.egress import EgressPolicy
from agent.core.messages import AudioClip, Event, MediaHeld, Priority, SpeakRequest
from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.formats.media import MAX_AUDIO_SECONDS, MAX_DECODE_SAMPLES, DecodedAudio
from agent.speech.media_decoder import MediaDecoder
from agent.speech.media_source import FetchLimits, MediaSource
from agent.speech.phrase_cache import PhraseCache
from harness import wait_until
from tests.media_files import decode_bomb, long_work, wav_tone
from tests.release_server import ReleaseServer
from tests.test_media_decoder import cpu_seconds

RATE: Final = 22050


class OpenDecoder(MediaDecoder):
    """The real decoder child with the work bound opened: `heavy` takes seconds of CPU, long
    enough to cut in while it decodes."""

    def decode(
        self,
        data: bytes,
        rate: int,
        *,
        max_bytes: int,
        max_seconds: float = MAX_AUDIO_SECONDS,
        max_samples: int = MAX_DECODE_SAMPLES,
    ) -> DecodedAudio:
        return super().decode(
            data, rate, max_bytes=max_bytes, max_seconds=10.0**6, max_samples=10**11
        )


class Rig:
    def __init__(self, tmp_path: Path, decoder: MediaDecoder) -> None:
        sounds = tmp_path / "sounds"
        sounds.mkdir()
        (sounds / "bell.wav").write_bytes(wav_tone(0.5, 44_100))
        (sounds / "heavy.flac").write_bytes(long_work())
        (sounds / "bomb.flac").write_bytes(decode_bomb())
        files = {"bell": sounds / "bell.wav", "heavy": sounds / "heavy.flac"}
        files["bomb"] = sounds / "bomb.flac"
        self.decoder = decoder
        self.events: queue.Queue[Event] = queue.Queue()
        cache = PhraseCache(tmp_path / "phrases", 10**7, 10**8)
        self.source = MediaSource(
            files, RATE, cache, FetchLimits(10**7, 5, 5), decoder, self.events.put
        )

    def held(self) -> list[MediaHeld]:
        found = []
        while not self.events.empty():
            event = self.events.get()
            assert isinstance(event, MediaHeld)
            found.append(event)
        return found

    def busy(self) -> None:
        """Wait until the child is at work on a sound (beyond its imports' ~0.3 s of CPU)."""
        wait_until(lambda: self.decoder.pid is not None, what="a child")
        pid = self.decoder.pid
        assert pid is not None
        wait_until(lambda: cpu_seconds(pid) > 0.6, what="the child at work")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path, OpenDecoder())
    made.source.start()
    yield made
    made.source.stop()


def request(request_id: str, priority: Priority, **fields: object) -> SpeakRequest:
    return SpeakRequest(request_id, "", priority=priority, **fields)  # type: ignore[arg-type]


def test_a_higher_class_stops_a_lower_decode_and_is_served_first(rig: Rig) -> None:
    rig.source.prepare(request("chat", Priority.CHAT, sound="heavy"))
    rig.busy()
    rig.source.prepare(request("fire", Priority.CRITICAL, sound="bell"))
    bell = rig.source.get("fire", Priority.CRITICAL, "bell")
    assert len(bell) == RATE // 2
    assert rig.decoder.replaced == 1  # the chat's decode was killed for it
    not_yet = threading.Event()
    not_yet.set()
    with pytest.raises(Refused) as caught:  # its decode starts again, after the bell
        rig.source.get("chat", Priority.CHAT, "heavy", not_yet)
    assert caught.value.detail == "cancelled"
    rig.source.let_go("chat")


def test_a_cut_ends_the_wait_for_a_decode_at_once(rig: Rig) -> None:
    rig.source.prepare(request("chat", Priority.CHAT, sound="heavy"))
    cut = threading.Event()
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            rig.source.get("chat", Priority.CHAT, "heavy", cut)
        except Refused as err:
            outcome.append(err)

    waiting = threading.Thread(target=wait)
    waiting.start()
    rig.busy()
    cut.set()
    rig.source.wake()  # what the synthesizer's cancel does
    waiting.join(30)
    assert [str(e) for e in outcome] == ["sound_unavailable: cancelled"]
    assert rig.decoder.replaced == 0  # abandoned by the synthesizer: the decode goes on
    rig.source.let_go("chat")  # its request ended: now it is killed
    wait_until(lambda: rig.decoder.replaced == 1, what="the decode killed")


def test_the_bomb_is_refused_from_its_header_by_name(tmp_path: Path) -> None:
    rig = Rig(tmp_path, MediaDecoder())
    rig.source.start()
    try:
        rig.source.prepare(request("b", Priority.INFO, sound="bomb"))
        with pytest.raises(Refused) as caught:
            rig.source.get("b", Priority.INFO, "bomb")
        assert caught.value.reason is Reason.TOO_LARGE
        assert rig.decoder.replaced == 0
    finally:
        rig.source.stop()


def test_what_a_request_holds_is_reported_and_let_go(rig: Rig) -> None:
    raw = wav_tone(1.0, 44_100, 2)
    rig.source.prepare(request("clip", Priority.INFO, audio=AudioClip(raw)))
    pcm = rig.source.clip("clip")
    assert len(pcm) == RATE
    wait_until(lambda: rig.source.held() == pcm.nbytes, what="only the samples held")
    reports = rig.held()
    print(reports)
    assert reports[0] == MediaHeld("clip", len(raw))  # as it came
    assert reports[-1] == MediaHeld("clip", pcm.nbytes)  # decoded: the recording let go
    rig.source.prepare(request("named", Priority.INFO, sound="bell"))
    rig.source.get("named", Priority.INFO, "bell")
    assert rig.source.held() == pcm.nbytes  # the operator's sounds are not counted
    rig.source.let_go("clip")
    assert rig.source.held() == 0
    with pytest.raises(Refused) as caught:
        rig.source.clip("clip")
    assert caught.value.reason is Reason.SOUND_UNAVAILABLE
    assert np.any(pcm)


class HeldDecoder(MediaDecoder):
    """The real decoder child, each decode held until `go` is set (a slow decoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.waiting = 0

    def decode(self, *args: Any, **kwargs: Any) -> DecodedAudio:
        self.waiting += 1
        self.go.wait(60)
        return super().decode(*args, **kwargs)


def test_downloads_wait_for_a_slow_decoder_unless_more_urgent(tmp_path: Path) -> None:
    """However slow the decoder, undecoded downloads hold at most two downloads' bytes: the one
    decoding and one waiting; a higher class is fetched past them, and the rest follow."""
    served = tmp_path / "served"
    served.mkdir()
    for name in ("a", "b", "c", "fire"):
        (served / f"{name}.wav").write_bytes(wav_tone(1.0, 44_100, 2))
    size = len((served / "a.wav").read_bytes())
    server = ReleaseServer(served).start()
    decoder = HeldDecoder()
    hosts = EgressPolicy.parse(["127.0.0.1:*"], "audio.media_hosts")
    cache = PhraseCache(tmp_path / "phrases", 10**7, 10**8)
    source = MediaSource({}, RATE, cache, FetchLimits(10**7, 5, 5, hosts), decoder)
    source.start()
    try:
        for name in ("a", "b", "c"):
            source.prepare(request(name, Priority.INFO, sound=f"{server.url}{name}.wav"))
        wait_until(lambda: server.behaviour.sent == 2 * size, what="two downloads")
        wait_until(lambda: decoder.waiting == 1, what="the first at the decoder")
        time.sleep(1.0)  # room for a third download, which must not begin
        assert [path for path, _ in server.behaviour.requests] == ["a.wav", "b.wav"]
        source.prepare(request("fire", Priority.CRITICAL, sound=f"{server.url}fire.wav"))
        wait_until(lambda: server.behaviour.sent == 3 * size, what="the alarm's download")
        decoder.go.set()
        for name in ("fire", "a", "b", "c"):
            pcm = source.get(name, Priority.INFO, f"{server.url}{name}.wav")
            assert len(pcm) == RATE
        assert [path for path, _ in server.behaviour.requests][2:] == ["fire.wav", "c.wav"]
    finally:
        decoder.go.set()
        source.stop()
        server.stop()
