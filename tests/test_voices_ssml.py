"""Many voices, rates and speakers, and SSML, through the real synthesis worker and real ALSA
(file PCM): every element is checked on the audio it produces. The tiny voices make one tone
per phoneme (256 samples each, a pitch per speaker), so pauses, speakers, rates and phoneme
counts can be read back from the capture exactly; speaking rate needs the real voice."""

from __future__ import annotations

import json
import queue
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from agent.audio.device import alsa_opener
from agent.audio.player import Player
from agent.core.catalog import Catalog, VoiceFacts
from agent.core.egress import EgressPolicy
from agent.core.messages import (
    Delivery,
    Event,
    Notify,
    Rejection,
    SpeakReceived,
    SpeakRequest,
    SynthesisDone,
    Synthesize,
    UtteranceEnded,
)
from agent.core.reasons import Reason
from agent.core.scheduler import SpeakCore
from agent.formats.ssml import parse_ssml
from agent.protocol.payloads import SpeakLimits, parse_speak
from agent.speech.phrase_cache import PhraseCache
from agent.speech.synthesizer import Synthesizer, VoiceChoice
from agent.speech.voice import SynthesisParams, Voice, bundled_voice
from harness import read_pcm
from tests.tiny_voice import SAMPLES_PER_ID, Language, speaker_frequency, write_tiny_voice

RATE = 22050
LIMITS = SpeakLimits(65536, 5000)


@dataclass
class Rig:
    """Voices by id, a synthesizer and a player on a file PCM at the default voice's rate."""

    voices: dict[str, Voice]
    synthesizer: Synthesizer
    player: Player
    events: queue.Queue[Event]
    capture: Path
    rate: int

    def say(self, request: SpeakRequest) -> tuple[UtteranceEnded, npt.NDArray[np.int16]]:
        """Play one request; how it ended and the samples it played."""
        start = len(read_pcm(self.capture)) if self.capture.exists() else 0
        self.synthesizer.submit(request, hash(request.id) % 10**6)
        ended: UtteranceEnded | None = None
        done = False
        while ended is None or not done:
            event = self.events.get(timeout=60)
            ended = event if isinstance(event, UtteranceEnded) else ended
            done = done or isinstance(event, SynthesisDone)
        return ended, read_pcm(self.capture)[start:]


def make_rig(voices: dict[str, Voice], tmp_path: Path) -> Rig:
    rate = voices["default"].sample_rate
    events: queue.Queue[Event] = queue.Queue()
    capture = tmp_path / "capture.raw"
    opener = alsa_opener(f"file:FILE={capture},FORMAT=raw", rate, 20, 4)
    player = Player(opener, rate, events.put)
    choices = {vid: VoiceChoice(vid, v, replace_noise(v)) for vid, v in voices.items()}
    cache = PhraseCache(tmp_path / "phrases", 10**7, 10**8)
    synthesizer = Synthesizer(choices, cache, (20, 80), player.put, events.put)
    player.start()
    synthesizer.start()
    return Rig(voices, synthesizer, player, events, capture, rate)


def replace_noise(voice: Voice) -> SynthesisParams:
    """The voice's parameters without noise: the same durations every time."""
    return SynthesisParams(0.0, voice.default_params.length_scale, 0.0)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A German two-speaker tiny voice at 16 kHz (not the device's rate)."""
    return write_tiny_voice(
        tmp_path_factory.mktemp("pair"),
        "pair.onnx",
        speakers=["alice", "bob"],
        rate=16000,
        language=Language("de_DE", "German", "Germany"),
        dataset="tiny_pair",
        espeak_voice="de",
    )


@pytest.fixture
def rig(tiny_voice: Path, tiny_pair: Path, tmp_path: Path) -> Iterator[Rig]:
    voices = {
        "default": Voice.load(tiny_voice, 1, None),
        "pair": Voice.load(tiny_pair, 1, None),
    }
    made = make_rig(voices, tmp_path)
    yield made
    made.synthesizer.stop()
    made.player.stop()


def dominant_hz(samples: npt.NDArray[np.int16], rate: int) -> float:
    padded = 16 * len(samples)  # zero-padded: the peak to a few hertz in a short window
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(len(samples)), padded))
    return float(np.argmax(spectrum) * rate / padded)


def pitches(samples: npt.NDArray[np.int16], rate: int, window: float = 0.03) -> list[float]:
    """The dominant pitch of each window that has sound in it."""
    size = round(window * rate)
    out = []
    for start in range(0, len(samples) - size, size):
        part = samples[start : start + size]
        if np.abs(part).max() > 20:
            out.append(dominant_hz(part, rate))
    return out


def near(value: float, target: float, tolerance: float = 0.08) -> bool:
    return abs(value - target) <= tolerance * target


def ssml(rig: Rig, document: str, **fields: object) -> tuple[UtteranceEnded, np.ndarray]:
    parsed = parse_ssml(document)  # on arrival, as `payloads` does
    request = SpeakRequest("s", document, ssml=True, document=parsed, **fields)  # type: ignore[arg-type]
    return rig.say(request)


# ---- speakers and rates -----------------------------------------------------------------------


@pytest.mark.parametrize(("speaker", "index"), [("alice", 0), ("bob", 1), ("1", 1)])
def test_a_speaker_of_a_multi_speaker_voice_is_chosen_by_name_or_number(
    rig: Rig, speaker: str, index: int
) -> None:
    ended, played = rig.say(SpeakRequest("a", "Guten Tag.", voice="pair", speaker=speaker))
    assert ended.error is None
    heard = pitches(played, rig.rate)
    expected = speaker_frequency(index, 16000)  # a 16 kHz voice, played at 22,050 Hz
    print(f"speaker {speaker}: {np.median(heard):.1f} Hz (expected {expected:.1f})")
    assert heard
    assert all(near(hz, expected) for hz in heard), heard


def test_two_voices_of_different_rates_in_one_announcement_through_voice(rig: Rig) -> None:
    document = '<speak>Hello there. <voice name="pair#bob">Guten Morgen.</voice> Bye.</speak>'
    ended, played = ssml(rig, document)
    assert ended.error is None
    default_hz = speaker_frequency(0, RATE)
    bob_hz = speaker_frequency(1, 16000)
    heard = pitches(played, rig.rate)
    kinds = [
        "default" if near(hz, default_hz) else "bob" if near(hz, bob_hz) else "?" for hz in heard
    ]
    runs = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    print(f"pitch runs: {runs}; default {default_hz:.0f} Hz, bob {bob_hz:.0f} Hz")
    assert runs == ["default", "bob", "default"]


def test_a_voice_at_another_rate_keeps_its_length_when_resampled(rig: Rig) -> None:
    ended, played = rig.say(SpeakRequest("a", "Guten Tag.", voice="pair"))
    phonemes = len(rig.voices["pair"].ids(rig.voices["pair"].sentences("Guten Tag.")[0]))
    seconds = phonemes * SAMPLES_PER_ID / 16000
    print(f"{len(played) / RATE:.4f} s played for {seconds:.4f} s of 16 kHz speech")
    assert ended.error is None
    assert abs(len(played) / RATE - seconds) < 0.005


# ---- SSML elements, measured ------------------------------------------------------------------


QUIET = 10 ** (-45 / 20) * 32767
"""How a break's silence is measured: from the last sample louder than -45 dBFS before it to
the first one after it (docs/sounds.md)."""


def silences(samples: npt.NDArray[np.int16], rate: int) -> list[float]:
    """The runs of samples at or below -45 dBFS between loud ones (seconds), longest first."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > QUIET)
    return sorted((float(n) / rate for n in np.diff(loud) - 1 if n > 0), reverse=True)


def test_a_break_is_the_silence_between_the_speech_on_its_sides(rig: Rig) -> None:
    _, played = ssml(rig, '<speak>One. <break time="700ms"/> Two.</speak>')
    _, joined = ssml(rig, '<speak>One. <break time="0ms"/> Two.</speak>')
    gap, none = silences(played, RATE)[0], silences(joined, RATE)
    print(f"tiny voice: a 700 ms break is {gap * 1000:.1f} ms of silence, 0 ms {none[:1]}")
    assert abs(gap - 0.7) <= 0.002
    assert none[0] <= 0.030  # the tones' own zero crossings: no silence longer than them


@pytest.fixture(scope="module")
def joe_rig(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Rig]:
    """The real voice (en_US-joe-medium) through the synthesizer, noise off."""
    voice = Voice.load(bundled_voice(), 2, cache_dir)
    made = make_rig({"default": voice}, tmp_path_factory.mktemp("joe"))
    yield made
    made.synthesizer.stop()
    made.player.stop()


@pytest.mark.voice
@pytest.mark.parametrize(
    ("document", "seconds"),
    [
        ('One. <break time="700ms"/> Two.', 0.7),
        ('One. <break time="300ms"/> Two.', 0.3),
        ('One <break time="0ms"/> two.', 0.0),
        ('Turn left <break time="1s"/> at the lights.', 1.0),  # inside a sentence
        ('One. <break strength="strong"/> Two.', 0.7),
        ("<s>One</s><s>two</s>", 0.25),  # a sentence's boundary
        ('<break time="500ms"/>One.', None),  # at the start: the speech's lead is cut
    ],
)
def test_a_break_on_the_real_voice_is_the_silence_it_asks_for(
    joe_rig: Rig, document: str, seconds: float | None
) -> None:
    ended, played = ssml(joe_rig, f"<speak>{document}</speak>")
    assert ended.error is None
    if seconds is None:  # the first loud sample half a second in
        first = np.flatnonzero(np.abs(played.astype(np.int32)) > QUIET)[0] / RATE
        print(f"{document}: speech starts at {first * 1000:.1f} ms")
        assert abs(first - 0.5) <= 0.030
        return
    gap = silences(played, RATE)[0]
    print(f"{document}: {gap * 1000:.1f} ms of silence")
    assert abs(gap - seconds) <= 0.030
    _, again = ssml(joe_rig, f"<speak>{document}</speak>")  # from the phrase cache: the same
    assert np.array_equal(again, played)


def test_prosody_volume_is_a_gain(rig: Rig) -> None:
    _, plain = ssml(rig, "<speak>Volume test.</speak>")
    _, soft = ssml(rig, '<speak><prosody volume="-6dB">Volume test.</prosody></speak>')
    change = 20 * np.log10(np.abs(soft).astype(float).mean() / np.abs(plain).astype(float).mean())
    print(f"prosody volume -6dB: {change:+.2f} dB")
    assert abs(change + 6.0) <= 0.3


def test_say_as_changes_the_phonemes(rig: Rig) -> None:
    _, word = ssml(rig, "<speak>cat</speak>")
    _, letters = ssml(rig, '<speak><say-as interpret-as="characters">cat</say-as></speak>')
    _, number = ssml(rig, '<speak><say-as interpret-as="cardinal">1234</say-as></speak>')
    _, digits = ssml(rig, '<speak><say-as interpret-as="digits">1234</say-as></speak>')
    counts = [len(x) // SAMPLES_PER_ID for x in (word, letters, number, digits)]
    print(f"phonemes: cat {counts[0]}, c a t {counts[1]}, 1234 {counts[2]}, 1 2 3 4 {counts[3]}")
    assert counts[1] > counts[0]
    assert counts[2] != counts[3]


def test_sub_says_its_alias(rig: Rig) -> None:
    _, alias = ssml(rig, '<speak><sub alias="World Wide Web Consortium">W3C</sub></speak>')
    _, spelled = ssml(rig, "<speak>World Wide Web Consortium</speak>")
    assert np.array_equal(alias, spelled)


def test_sentences_and_paragraphs_are_paused(rig: Rig) -> None:
    _, run_on = ssml(rig, "<speak>One two</speak>")
    _, sentences = ssml(rig, "<speak><s>One</s><s>two</s></speak>")
    _, paragraphs = ssml(rig, "<speak><p>One</p><p>two</p></speak>")
    gaps = [(len(x) - len(run_on)) / RATE for x in (sentences, paragraphs)]
    print(f"<s> adds {gaps[0] * 1000:.0f} ms, <p> {gaps[1] * 1000:.0f} ms")
    assert 0.2 <= gaps[0] < gaps[1]


def test_audio_plays_a_named_sound_or_says_its_content(tiny_voice: Path, tmp_path: Path) -> None:
    from agent.speech.media_source import FetchLimits, MediaSource  # noqa: PLC0415 - only here
    from tests.test_chimes import write_wav  # noqa: PLC0415

    tone = (np.sin(2 * np.pi * 1000 * np.arange(RATE // 5) / RATE) * 10000).astype(np.int16)
    sound = tmp_path / "beep.wav"
    write_wav(sound, tone, RATE, 1)
    voice = Voice.load(tiny_voice, 1, None)
    events: queue.Queue[Event] = queue.Queue()
    capture = tmp_path / "capture.raw"
    player = Player(alsa_opener(f"file:FILE={capture},FORMAT=raw", RATE, 20, 4), RATE, events.put)
    cache = PhraseCache(tmp_path / "phrases", 10**7, 10**8)
    media = MediaSource({"beep": sound}, RATE, cache, FetchLimits(10**6, 5, 5))
    choice = VoiceChoice("default", voice, replace_noise(voice))
    synthesizer = Synthesizer(
        {"default": choice}, cache, (20, 80), player.put, events.put, media=media
    )
    rig = Rig({"default": voice}, synthesizer, player, events, capture, RATE)
    media.start()
    player.start()
    synthesizer.start()
    try:
        _, played = ssml(rig, '<speak><audio src="beep">a beep</audio></speak>')
        assert np.array_equal(played, tone)
        _, fallback = ssml(rig, '<speak><audio src="missing">a beep</audio></speak>')
        _, said = ssml(rig, "<speak>a beep</speak>")
        assert np.array_equal(fallback, said)
        ended, _ = ssml(rig, '<speak><audio src="missing"/></speak>')
        assert ended.error in {Reason.NO_SPEECH, Reason.UNKNOWN_SOUND}
        # a URL is no name: its content is said, and nothing is downloaded (port 9: discard)
        _, instead = ssml(
            rig, '<speak><audio src="http://127.0.0.1:9/beep.wav">a beep</audio></speak>'
        )
        assert np.array_equal(instead, said)
        ended, _ = ssml(rig, '<speak><audio src="http://127.0.0.1:9/beep.wav"/></speak>')
        assert (ended.error, ended.detail) == (
            Reason.UNKNOWN_SOUND,
            "SSML <audio src> takes a name of audio.media, not a URL",
        )
    finally:
        synthesizer.stop()
        player.stop()
        media.stop()


@pytest.mark.voice
@pytest.mark.parametrize(
    "text",
    [
        "Please bring the garden cushions inside before the rain starts this afternoon.",
        "Attention, please.",
    ],
)
def test_prosody_rate_changes_the_duration_by_its_factor(joe_rig: Rig, text: str) -> None:
    _, normal = ssml(joe_rig, f"<speak>{text}</speak>")
    for rate, factor in [("50%", 0.5), ("slow", 0.75), ("fast", 1.25), ("x-fast", 1.5), ("2", 2)]:
        _, played = ssml(joe_rig, f'<speak><prosody rate="{rate}">{text}</prosody></speak>')
        duration = len(played) / len(normal)
        print(f"{text[:20]} rate {rate}: x{duration:.3f} of the duration (x{1 / factor:.3f})")
        assert abs(duration * factor - 1) <= 0.03


# ---- on arrival: the core and the parser --------------------------------------------------------


def core_with_voices() -> SpeakCore:
    catalog = Catalog(
        {
            "default": VoiceFacts("en_US"),
            "pair": VoiceFacts("de_DE", ("alice", "bob"), 2),
            "fr": VoiceFacts("fr_FR"),
        },
        frozenset({"ding"}),
        frozenset({"doorbell"}),
        EgressPolicy.parse(["example.org"], "audio.media_hosts"),
    )
    return SpeakCore(8, 50, catalog=catalog)


def admitted(core: SpeakCore, request: SpeakRequest) -> SpeakRequest | Rejection:
    actions = core.handle(SpeakReceived(request, Delivery(1, 1)), 0.0)
    notes = [a for a in actions if isinstance(a, Notify)]
    if notes[0].event == "rejected":
        details = dict(notes[0].details)
        return Rejection(request.id, Reason(str(details["reason"])), str(details["detail"]))
    synth = [a for a in actions if isinstance(a, Synthesize)]
    return synth[0].request


@pytest.mark.parametrize(
    ("lang", "voice"),
    [("de", "pair"), ("de-DE", "pair"), ("de_AT", "pair"), ("fr", "fr"), ("en-GB", "default")],
)
def test_lang_chooses_the_voice_that_speaks_it(lang: str, voice: str) -> None:
    chosen = admitted(core_with_voices(), SpeakRequest("a", "Hallo.", lang=lang))
    assert isinstance(chosen, SpeakRequest)
    assert chosen.voice == voice


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"lang": "ja"}, Reason.UNKNOWN_LANGUAGE),
        ({"voice": "pair", "speaker": "carol"}, Reason.UNKNOWN_SPEAKER),
        ({"voice": "pair", "speaker": "2"}, Reason.UNKNOWN_SPEAKER),
        ({"speaker": "bob"}, Reason.UNKNOWN_SPEAKER),  # the default voice has one speaker
        ({"sound": "fanfare"}, Reason.UNKNOWN_SOUND),
        ({"sound_after": "fanfare"}, Reason.UNKNOWN_SOUND),
    ],
)
def test_what_the_node_cannot_play_is_rejected_on_arrival(
    fields: dict[str, str], reason: Reason
) -> None:
    refused = admitted(core_with_voices(), SpeakRequest("a", "Hallo.", **fields))  # type: ignore[arg-type]
    assert isinstance(refused, Rejection)
    assert refused.reason == reason


def test_an_ssml_voice_the_node_does_not_have_is_rejected_on_arrival() -> None:
    document = '<speak>Hi <voice name="klingon">Qapla</voice></speak>'
    request = SpeakRequest("a", document, ssml=True, document=parse_ssml(document))
    refused = admitted(core_with_voices(), request)
    assert isinstance(refused, Rejection)
    assert refused.reason == Reason.UNKNOWN_VOICE


def test_a_url_sound_and_known_names_are_accepted() -> None:
    ok = admitted(core_with_voices(), SpeakRequest("a", "", sound="https://example.org/a.ogg"))
    assert isinstance(ok, SpeakRequest)
    ok = admitted(core_with_voices(), SpeakRequest("c", "", sound_after="http://Example.ORG/b"))
    assert isinstance(ok, SpeakRequest)
    request = SpeakRequest("b", "Hi.", sound="doorbell", sound_after="doorbell")
    ok = admitted(core_with_voices(), request)
    assert isinstance(ok, SpeakRequest)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"ssml": "<speak>Hi <break time=\\"x\\"/></speak>"}', "ssml"),
        (b'{"text": "<speak>Hi <b></speak>"}', "text"),
        (b'{"ssml": "<speak><unclosed></speak>"}', "ssml"),
    ],
)
def test_invalid_ssml_is_rejected_with_its_position(payload: bytes, field: str) -> None:
    parsed = parse_speak(payload, LIMITS, lambda: "gen")
    assert isinstance(parsed, Rejection)
    assert (parsed.reason, parsed.field) == (Reason.INVALID_SSML, field)
    assert "line 1, column" in parsed.detail


HOSTILE = {
    "billion laughs": (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        + "".join(
            f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
            for i in range(1, 10)
        )
        + "]><speak>&lol9;</speak>"
    ),
    "external entity": (
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<speak>&x;</speak>"
    ),
    "10,000 nested elements": "<speak>" + "<s>" * 10_000 + "hi" + "</s>" * 10_000 + "</speak>",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_ssml_is_rejected_with_bounded_memory(name: str) -> None:
    payload = ('{"id": "x", "ssml": ' + json.dumps(HOSTILE[name]) + "}").encode()
    tracemalloc.start()
    try:
        parsed = parse_speak(payload, SpeakLimits(1 << 20, 5000), lambda: "gen")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"{name}: {len(payload)} bytes, peak {peak / 1e6:.1f} MB, {parsed}")
    assert isinstance(parsed, Rejection)
    assert parsed.reason == Reason.INVALID_SSML
    assert peak < 20e6
