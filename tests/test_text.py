"""The text front end on hostile input: nothing but plain, speakable text gets through; and
every splitter of untrusted text in the agent, on pathological runs, cuts correctly and in
linear time."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from xml.sax.saxutils import escape as xml_escape

import pytest
from wyoming.event import Event

from agent.core.admission import Admission, Timing
from agent.core.catalog import Catalog, VoiceFacts
from agent.core.messages import Rejection, SpeakRequest
from agent.formats.markup import is_ssml
from agent.formats.ssml import SsmlError, parse_ssml, spoken_text
from agent.formats.text import PIECE_CHARS, Cut, TextCutter, clean_text, pieces
from agent.link.wyoming.framing import LINE_LIMIT, read_event
from agent.link.wyoming.server import ClientError, Intake
from agent.protocol.hermes import parse_say as hermes_say
from agent.protocol.payloads import SpeakLimits, parse_say, parse_speak
from agent.speech.voice import TooManyPhonemesError, Voice
from tests.hostile import PATHOLOGICAL_CHARS, pathological_texts

T = TypeVar("T")


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("The door is open.", "The door is open."),
        ("<speak>Hello <break time='1s'/> world</speak>", "Hello world"),
        ('<p class="x">Fire</p> <!-- comment --> alarm', "Fire alarm"),
        ("if a < b and c > d", "if a < b and c > d"),
        ("Tom &amp; Jerry", "Tom & Jerry"),
        ("&lt;b&gt;bold&lt;/b&gt;", "<b>bold</b>"),
        ("say [[ hɛloʊ ]] now", "say hɛloʊ now"),
        ("[[[nested]]] and ]][[", "[nested ] and"),
        ("bell\x07 null\x00 esc\x1b[31m red", "bell null esc[31m red"),
        ("zero\u200bwidth\ufeff and soft\u00adhyphen", "zerowidth and softhyphen"),
        ("right\u202eto left", "rightto left"),
        ("ﬁre ＦＩＲＥ ①", "fire FIRE 1"),
        ("line one\nline two\r\n\tthree", "line one line two three"),
        ("   ", ""),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


def test_ten_thousand_newlines_collapse() -> None:
    assert clean_text("a" + "\n" * 10_000 + "b") == "a b"


def test_a_megabyte_of_hostile_text_is_cleaned() -> None:
    unit = "<b>x</b>[[ɑ]]\x00\u200b &amp; <" + "y" * 20 + "\n"
    text = unit * (1_000_000 // len(unit))
    cleaned = clean_text(text)
    assert "<b>" not in cleaned
    assert "[[" not in cleaned
    assert "]]" not in cleaned
    assert "\x00" not in cleaned
    assert "\u200b" not in cleaned
    assert "\n" not in cleaned
    assert cleaned.count("x ɑ & <") == text.count("<b>x</b>")


def test_tags_cannot_be_rebuilt_from_pieces_of_raw_phoneme_escapes() -> None:
    assert "[[" not in clean_text("[<i>[ ɑ ]</i>]")
    assert "[[" not in clean_text("[" * 1001)


# ---- every splitter of untrusted text, on pathological runs (issue 33.4) -------------------

DEADLINE = 20.0
"""Seconds one splitter may take on one 120,000-character text on a busy 2-core machine: a
linear one takes well under a second; the backtracking Wyoming regex took 7 s on 16,000 dots,
so about 400 s on these (and the SSML spacing regex 3.7 s on 20,000 spaces: 130 s)."""
TEXTS = pathological_texts()


def _timed(work: Callable[[], T]) -> T:
    began = time.monotonic()
    result = work()
    took = time.monotonic() - began
    assert took < DEADLINE, f"{took:.1f} s"
    return result


def _stream(text: str, chunk: int, max_chars: int) -> list[Cut]:
    cutter = TextCutter(max_chars, every_sentence=True)
    out: list[Cut] = []
    for start in range(0, len(text), chunk):
        out += cutter.feed(text[start : start + chunk])
    return out + cutter.end()


@pytest.mark.parametrize(("chunk", "size"), [(PATHOLOGICAL_CHARS, PATHOLOGICAL_CHARS), (7, 20_000)])
def test_a_stream_is_cut_in_linear_time_into_its_own_characters(chunk: int, size: int) -> None:
    """The Wyoming stream's cutter, fed whole, and a few characters at a time: the pieces are
    the text, in order, none over the bound, a sentence end cut at once."""
    for name, whole in TEXTS.items():
        text = whole[:size]
        cuts = _timed(lambda t=text: _stream(t, chunk, 5000))  # type: ignore[misc]
        assert "".join(c.text for c in cuts) == text, name
        assert all(0 < len(c.text) <= 5000 for c in cuts), name
    cuts = _stream("One. Two! Three? Four; five: six, seven", chunk, 5000)
    assert [c.text for c in cuts] == ["One. ", "Two! ", "Three? ", "Four; ", "five: ", "six, seven"]


def test_pieces_for_the_phonemizer_are_cut_in_linear_time_where_they_must_be() -> None:
    for name, text in TEXTS.items():
        cuts = _timed(lambda t=text: pieces(t))  # type: ignore[misc]
        assert "".join(c.text for c in cuts) == text, name
        assert all(0 < len(c.text) <= PIECE_CHARS for c in cuts), name
    assert pieces("Short. Text, whole.") == [Cut("Short. Text, whole.", sentence=False)]
    long = "A sentence, with a clause. " * 40
    cut = pieces(long)
    assert cut[0].sentence
    assert cut[0].text.endswith("clause. ")


def test_cleaning_takes_any_text_in_linear_time() -> None:
    for name, text in TEXTS.items():
        cleaned = _timed(lambda t=text: clean_text(t))  # type: ignore[misc]
        assert "[[" not in cleaned, name
        assert "  " not in cleaned, name
        assert cleaned == cleaned.strip(), name
    assert clean_text("&#" + "0" * 9000 + "65;") == "A"  # 4,300+ digits raised ValueError
    assert clean_text("&#" + "9" * 9000 + ";") == "\ufffd"


def test_phonemizing_takes_any_text_in_bounded_pieces(tiny_voice: Path) -> None:
    """espeak-ng is given pieces of at most PIECE_CHARS characters (cut as the test above
    shows on 120,000 characters; 20,000 of each text here), none of which crashes it (a clause
    of ~97 letters between dots did: `alternation: dot x`), and a text whose phonemes pass
    the bound stops there (as the synthesizer asks: ~2,700 phonemes for 120 s)."""
    voice = Voice.describe(tiny_voice, None)
    for name, whole in TEXTS.items():
        text = whole[:20_000]

        def phonemize(t: str = text) -> int:
            try:
                return sum(len(c) for s in voice.sentences(t, 2700) for c in s)
            except TooManyPhonemesError:
                return -1

        count = _timed(phonemize)
        assert count <= 2700, name


def test_the_speak_and_say_parsers_take_any_text_in_linear_time() -> None:
    limits = SpeakLimits(max_bytes=4 * PATHOLOGICAL_CHARS, max_text_chars=4 * PATHOLOGICAL_CHARS)
    for name, text in TEXTS.items():
        payload = json.dumps({"text": text}).encode()
        spoken = _timed(lambda p=payload: parse_speak(p, limits, lambda: "x"))  # type: ignore[misc]
        assert isinstance(spoken, SpeakRequest | Rejection), name
        said = _timed(lambda t=text: parse_say(t.encode(), limits, lambda: "x"))  # type: ignore[misc]
        assert isinstance(said, SpeakRequest | Rejection), name
        hermes = json.dumps({"text": text, "siteId": "default"}).encode()
        heard = _timed(lambda p=hermes: hermes_say(p, "default", limits, lambda: "x"))  # type: ignore[misc]
        assert heard is not None, name


def test_ssml_takes_any_text_in_linear_time() -> None:
    for text in TEXTS.values():
        body = xml_escape(text[:60_000])
        document = (
            f"<speak><s>{body}</s><say-as interpret-as='cardinal'>{body[:64]}</say-as></speak>"
        )
        assert is_ssml(document)

        def parse(d: str = document) -> str:
            try:
                return spoken_text(parse_ssml(d))
            except SsmlError as err:
                return err.reason

        _timed(parse)


def test_the_wyoming_reader_takes_any_text_in_linear_time() -> None:
    """A `synthesize` whose data part carries the text: read by the framing reader, and its
    request decided by the Wyoming intake (the speak rules)."""
    catalog = Catalog({"default": VoiceFacts("en_US")})
    intake = Intake(Admission(catalog, Timing()), SpeakLimits(10**6, 10**6), lambda: "x" * 32)
    for name, text in TEXTS.items():
        data = json.dumps({"text": text}).encode()
        frame = json.dumps({"type": "synthesize", "data_length": len(data)}).encode()

        async def read(raw: bytes = frame + b"\n" + data) -> object:
            reader = asyncio.StreamReader(limit=LINE_LIMIT)
            reader.feed_data(raw)
            reader.feed_eof()
            return await read_event(reader)

        event = _timed(lambda r=read: asyncio.run(r()))  # type: ignore[misc]
        assert isinstance(event, Event), name

        def decide(e: Event = event) -> object:
            try:
                return intake.request(e.data["text"], intake.asked(e.data))
            except ClientError as err:
                return err.reason

        _timed(decide)
