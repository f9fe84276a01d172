"""SSML to a flat sequence of segments the synthesizer can run: speech, pauses, named sounds.

Pure: no I/O, no clock, no threads. The subset read: `speak` (the root), `break`, `prosody`
(rate, volume), `say-as`, `sub`, `p`, `s`, `voice`, `audio`. Any other element is read for its
text, except `desc`, `meta`, `metadata` and `lexicon`, which are silent (`phoneme` is read for
its text, never its `ph`; `mark` says nothing). Parsing goes through defusedxml with DTDs, entity
declarations and external references forbidden, and the work is bounded (document size, nesting
depth, elements, attributes), so hostile input fails fast with bounded memory. Text inside the
document goes through `text.clean_text` like plain text, so espeak never interprets SSML or raw
`[[ phonemes ]]` itself. Every problem raises one `SsmlError` (reason `invalid_ssml`) with a
position.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import Enum
from typing import Final
from xml.etree.ElementTree import ParseError
from xml.parsers import expat

from defusedxml import DefusedXmlException, DTDForbidden, EntitiesForbidden
from defusedxml.ElementTree import DefusedXMLParser

from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.core.segments import Pause, SayAs, Segment, Sound, Speech
from agent.formats.text import clean_text

MAX_SSML_CHARS: Final = 65_536
"""Longest document accepted (characters); longer ones are refused before parsing."""
MAX_DEPTH: Final = 64
"""Deepest element nesting accepted (the root is depth 1)."""
MAX_ELEMENTS: Final = 2_000
"""Most elements in one document."""
MAX_ATTRIBUTES: Final = 16
"""Most attributes on one element."""
MAX_ATTRIBUTE_CHARS: Final = 256
"""Longest attribute value (characters)."""
MAX_PAUSE: Final = 10.0
"""Longest pause one break (or one run of breaks) makes (seconds); longer times are capped."""
SENTENCE_PAUSE: Final = 0.25
"""Pause at an `<s>` boundary (seconds): about what a full stop gives."""
PARAGRAPH_PAUSE: Final = 0.5
"""Pause at a `<p>` boundary (seconds)."""
MIN_RATE: Final = 0.5
"""Slowest speaking-rate factor a segment gets (the same bounds as a JSON request's `rate`)."""
MAX_RATE: Final = 2.0
"""Fastest speaking-rate factor a segment gets."""
MAX_SAY_AS_CHARS: Final = 256
"""Longest `say-as` content that is converted; longer content is read as it is (characters)."""
MAX_NUMBER_DIGITS: Final = 15
"""Longest whole part read as one number; longer numbers are read digit by digit."""

BREAK_STRENGTHS: Final[Mapping[str, float]] = {
    "none": 0.0,
    "x-weak": 0.1,
    "weak": 0.2,
    "medium": 0.4,
    "strong": 0.7,
    "x-strong": 1.0,
}
"""Pause of a `<break strength=...>` without `time` (seconds); `<break/>` alone is medium.
Strong is a bit more than a sentence's end, x-strong twice a paragraph's."""
RATE_WORDS: Final[Mapping[str, float]] = {
    "x-slow": 0.5,
    "slow": 0.75,
    "medium": 1.0,
    "default": 1.0,
    "fast": 1.25,
    "x-fast": 1.5,
}
"""Speaking-rate factor of each `prosody rate` keyword (1 is the voice's own rate)."""
VOLUME_WORDS: Final[Mapping[str, float]] = {
    "silent": 0.0,
    "x-soft": 10 ** (-12 / 20),
    "soft": 10 ** (-6 / 20),
    "medium": 1.0,
    "default": 1.0,
    "loud": 10 ** (6 / 20),
    "x-loud": 10 ** (12 / 20),
}
"""Linear gain of each `prosody volume` keyword: 6 dB steps around medium (1). The gain a
segment gets is capped at 1, so loud only undoes an enclosing soft."""

_SILENT_ELEMENTS: Final = frozenset({"desc", "meta", "metadata", "lexicon"})
_NUMBER: Final = r"(?:\d{1,6}(?:\.\d{1,6})?|\.\d{1,6})"
_TIME: Final = re.compile(rf"({_NUMBER})\s*(ms|s)", re.ASCII)
_PERCENT: Final = re.compile(rf"([+-]?)({_NUMBER})%", re.ASCII)
_DECIBELS: Final = re.compile(rf"([+-]?)({_NUMBER})\s*dB", re.ASCII)
_FACTOR: Final = re.compile(_NUMBER, re.ASCII)
_GAIN_RANGE: Final = (0.0, 1e3)
_RATE_RANGE: Final = (1e-3, 1e3)
"""Bounds kept on nested products before the final clamp (no overflow however deep)."""
_SPACE_BEFORE_PUNCTUATION: Final = re.compile(r"\s+(?=[.,!?;:])")
_MONTHS: Final = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_CARDINAL: Final = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,12}))?", re.ASCII)
_ORDINAL: Final = re.compile(r"(\d+)(?:st|nd|rd|th|\.)?", re.IGNORECASE | re.ASCII)
_CLOCK: Final = re.compile(
    r"(\d{1,2})[:.h](\d{2})(?:[:.](\d{2}))?\s*(?:([ap])\.?\s*m\.?)?", re.IGNORECASE | re.ASCII
)
_DATE_PARTS: Final = re.compile(r"[-/.\s]+")


class SsmlError(Refused[Reason]):
    """A document that cannot be spoken: malformed, hostile, too big, or a bad attribute (reason
    `invalid_ssml`, the detail `line L, column C: what`)."""

    def __init__(self, problem: str, line: int, column: int) -> None:
        super().__init__(Reason.INVALID_SSML, f"line {line}, column {column}: {problem}")
        self.problem = problem
        self.line = line
        """1-based."""
        self.column = column
        """1-based, in characters."""


# ---- public functions ---------------------------------------------------------------------


def parse_ssml(
    document: str, *, lang: str = "en", max_chars: int = MAX_SSML_CHARS
) -> tuple[Segment, ...]:
    """The segments of an SSML document, in order (empty when it says nothing): parsed once, on
    arrival. `lang` is the language `say-as` is said in (e.g. `en`, `de_DE`: numbers, dates,
    times); `in_language` says it in a voice's own language later. Raises SsmlError.
    """
    if len(document) > max_chars:
        raise SsmlError(f"{len(document)} characters, at most {max_chars} allowed", 1, 1)
    body = document.lstrip(" \t\r\n\ufeff")
    prefix = document[: len(document) - len(body)]
    try:
        data = body.encode("utf-8")
    except UnicodeEncodeError as err:
        line, column = _position_of(body, err.start)
        raise _shifted(SsmlError("a lone surrogate character", line, column), prefix) from None
    builder = _Builder()
    parser = DefusedXMLParser(
        target=builder, encoding="utf-8", forbid_dtd=True, forbid_entities=True
    )
    builder.parser = parser.parser
    try:
        parser.feed(data)
        parser.close()
    except SsmlError as err:
        raise _shifted(err, prefix) from None
    except ParseError as err:
        line, column = err.position
        detail = expat.ErrorString(err.code) if isinstance(err.code, int) else str(err)
        raise _shifted(SsmlError(str(detail), line, column + 1), prefix) from None
    except (DefusedXmlException, expat.ExpatError) as err:
        line, column = builder.where()
        raise _shifted(SsmlError(_defused_detail(err), line, column), prefix) from None
    return in_language(builder.segments(), lang)


def in_language(segments: tuple[Segment, ...], lang: str) -> tuple[Segment, ...]:
    """The segments with every `say-as` said in `lang` (the language of the voice that reads
    them): the only thing a voice's choice changes in a parsed document."""
    numbers = _number_lang(lang)
    out: list[Segment] = []
    for segment in segments:
        if isinstance(segment, Speech) and segment.said:
            out.append(replace(segment, text=_said(segment.said, numbers) or segment.text))
        elif isinstance(segment, Sound) and segment.fallback:
            out.append(replace(segment, fallback=in_language(segment.fallback, lang)))
        else:
            out.append(segment)
    return tuple(out)


def spoken_text(segments: tuple[Segment, ...]) -> str:
    """The words of the segments as one text (for logs, the journal and events): speech, and
    what stands for each sound."""
    words: list[str] = []
    for segment in segments:
        if isinstance(segment, Speech):
            words.append(segment.text)
        elif isinstance(segment, Sound):
            words.append(spoken_text(segment.fallback))
    return " ".join(word for word in words if word)


# ---- parsing ------------------------------------------------------------------------------


class _Mode(Enum):
    SPEAK = "speak"
    CAPTURE = "capture"
    """Inside `say-as`: text is collected, then converted as a whole."""
    MUTE = "mute"
    """Inside `sub` (the alias is said instead) or a silent element."""


@dataclass(frozen=True, slots=True)
class _Style:
    rate: float = 1.0
    volume: float = 1.0
    voice: str | None = None
    speaker: str | None = None


@dataclass(slots=True)
class _Frame:
    name: str
    style: _Style
    mode: _Mode
    boundary: float = 0.0
    """Pause at its start and end (`s`, `p`)."""
    say_as: tuple[str, str] | None = None
    """(interpret-as, format) of the `say-as` that collects text into `captured`."""
    captured: list[str] = field(default_factory=list)
    sound: str | None = None
    """The name of the `audio` whose content is the fallback being collected."""


class _Output:
    """Segments being built: text is buffered until its style changes or a pause or a sound
    comes, pauses wait until something follows them."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._text: list[str | SayAs] = []
        self._style = _Style()
        self._break: float | None = None
        """The explicit breaks waiting (None: none, 0: a break of no time)."""
        self._boundary = 0.0
        self._after_break = False
        """The next speech follows a break (its start is marked)."""

    def add_text(self, text: str | SayAs, style: _Style) -> None:
        if not self._text and isinstance(text, str) and not text.strip():
            return
        if self._text and style != self._style:
            self.flush_text()
        if not self._text:
            self._emit_pause()
            self._style = style
        self._text.append(text)

    def add_break(self, seconds: float) -> None:
        self.flush_text()
        self._break = min(MAX_PAUSE, (self._break or 0.0) + seconds)

    def add_boundary(self, seconds: float) -> None:
        self.flush_text()
        if self.segments:  # a boundary before anything was said separates nothing
            self._boundary = max(self._boundary, seconds)

    def add_segment(self, segment: Segment) -> None:
        self.flush_text()
        self._emit_pause()
        self.segments.append(segment)
        self._after_break = False

    def flush_text(self) -> None:
        pieces = tuple(self._text)
        self._text.clear()
        text = _said(pieces, None)  # `say-as` as written until a language is given
        if text:
            style = self._style
            rate = round(min(MAX_RATE, max(MIN_RATE, style.rate)), 4)
            volume = round(min(1.0, style.volume), 4)
            said = pieces if any(isinstance(p, SayAs) for p in pieces) else ()
            speech = Speech(text, rate, volume, style.voice, style.speaker, said)
            self.segments.append(replace(speech, break_before=self._after_break))
            self._after_break = False

    def finish(self) -> tuple[Segment, ...]:
        self.flush_text()
        if self._break is not None:  # an explicit break at the end is kept, a boundary is not
            self._emit_pause()
        return tuple(self.segments)

    def _emit_pause(self) -> None:
        """The waiting breaks and boundary, before what comes next: a Pause of the longest
        (none for a break of no time), the speech on either side marked."""
        if self._break is None and self._boundary <= 0:
            return
        seconds = min(MAX_PAUSE, max(self._break or 0.0, self._boundary))
        self._break, self._boundary = None, 0.0
        if self.segments and isinstance(last := self.segments[-1], Speech):
            self.segments[-1] = replace(last, break_after=True)
        self._after_break = True
        if seconds <= 0:
            return
        if self.segments and isinstance(last := self.segments[-1], Pause):
            self.segments[-1] = Pause(min(MAX_PAUSE, last.seconds + seconds))
        else:
            self.segments.append(Pause(seconds))


class _Builder:
    """The parser's target: turns element and text events into segments as they come."""

    def __init__(self) -> None:
        self.parser: expat.XMLParserType | None = None
        self._frames: list[_Frame] = []
        self._outputs: list[_Output] = [_Output()]
        self._elements = 0
        self._result: tuple[Segment, ...] | None = None

    def where(self) -> tuple[int, int]:
        """Where the parser is (1-based line and column)."""
        if self.parser is None:
            return 1, 1
        return self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1

    def fail(self, detail: str) -> SsmlError:
        return SsmlError(detail, *self.where())

    def segments(self) -> tuple[Segment, ...]:
        if self._result is None:
            raise self.fail("no <speak> element")
        return self._result

    # -- parser target interface --

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = tag.rpartition("}")[2]
        self._check_limits(name, attrib)
        attrs = {key.rpartition("}")[2]: value.strip() for key, value in attrib.items()}
        if not self._frames:
            if name != "speak":
                raise self.fail(f"the root element must be <speak>, not <{name[:40]}>")
            self._frames.append(_Frame(name, _Style(), _Mode.SPEAK))
            return
        parent = self._frames[-1]
        frame = _Frame(name, parent.style, parent.mode)
        self._frames.append(frame)
        speaking = frame.mode is _Mode.SPEAK
        match name:
            case "break" if speaking:
                self._output.add_break(self._break_seconds(attrs))
            case "prosody":
                frame.style = self._prosody(frame.style, attrs)
            case "voice":
                frame.style = self._voice(frame.style, attrs)
            case "say-as" if speaking:
                frame.mode = _Mode.CAPTURE
                frame.say_as = (attrs.get("interpret-as", ""), attrs.get("format", ""))
            case "sub":
                alias = self._required(name, attrs, "alias")
                self.data(f" {alias} ")
                frame.mode = _Mode.MUTE
            case "s" | "p" if speaking:
                frame.boundary = SENTENCE_PAUSE if name == "s" else PARAGRAPH_PAUSE
                self._output.add_boundary(frame.boundary)
            case "audio":
                source = self._required(name, attrs, "src")
                if speaking:
                    self._output.flush_text()
                    frame.sound = source
                    self._outputs.append(_Output())
            case _ if name in _SILENT_ELEMENTS:
                frame.mode = _Mode.MUTE

    def _check_limits(self, name: str, attrib: Mapping[str, str]) -> None:
        self._elements += 1
        if self._elements > MAX_ELEMENTS:
            raise self.fail(f"more than {MAX_ELEMENTS} elements")
        if len(self._frames) >= MAX_DEPTH:
            raise self.fail(f"elements nested more than {MAX_DEPTH} deep")
        if len(attrib) > MAX_ATTRIBUTES:
            raise self.fail(f"<{name[:40]}> has more than {MAX_ATTRIBUTES} attributes")
        for key, value in attrib.items():
            if len(value) > MAX_ATTRIBUTE_CHARS:
                local = key.rpartition("}")[2][:40]
                raise self.fail(f"{local} of <{name[:40]}>: longer than {MAX_ATTRIBUTE_CHARS}")

    def end(self, tag: str) -> None:
        frame = self._frames.pop()
        if frame.say_as is not None:
            self._said_as(SayAs("".join(frame.captured), *frame.say_as))
        if frame.boundary:
            self._output.add_boundary(frame.boundary)
        if frame.sound is not None:
            fallback = self._outputs.pop().finish()
            volume = round(min(1.0, frame.style.volume), 4)
            self._output.add_segment(Sound(frame.sound, fallback, volume, names_only=True))
        if not self._frames:
            self._result = self._outputs[0].finish()

    def data(self, text: str) -> None:
        if not self._frames:
            return
        frame = self._frames[-1]
        if frame.mode is _Mode.SPEAK:
            self._output.add_text(text, frame.style)
        elif frame.mode is _Mode.CAPTURE:
            capturing = next(f for f in reversed(self._frames) if f.say_as is not None)
            capturing.captured.append(text)

    def close(self) -> None:
        """Called by the parser at the end of the document."""

    def _said_as(self, said: SayAs) -> None:
        """A `say-as` ended: kept as written where speech goes on (said in the voice's
        language later); inside another one's text, said in English there."""
        if not self._frames:
            return
        frame = self._frames[-1]
        if frame.mode is _Mode.SPEAK:
            self._output.add_text(said, frame.style)
        elif frame.mode is _Mode.CAPTURE:
            self.data(f" {_said((said,), _number_lang('en'))} ")

    # -- attributes --

    @property
    def _output(self) -> _Output:
        return self._outputs[-1]

    def _required(self, element: str, attrs: Mapping[str, str], name: str) -> str:
        value = attrs.get(name, "")
        if not value or not value.isprintable():
            raise self.fail(f"<{element}> needs a {name} attribute of printable characters")
        return value

    def _break_seconds(self, attrs: Mapping[str, str]) -> float:
        if "time" in attrs:
            match = _TIME.fullmatch(attrs["time"])
            if match is None:
                raise self.fail(f"break time {_shown(attrs['time'])}: expected e.g. 500ms or 2s")
            seconds = float(match[1]) / (1000 if match[2] == "ms" else 1)
            return min(MAX_PAUSE, seconds)
        strength = attrs.get("strength", "medium")
        if strength not in BREAK_STRENGTHS:
            raise self.fail(
                f"break strength {_shown(strength)}: expected {', '.join(BREAK_STRENGTHS)}"
            )
        return BREAK_STRENGTHS[strength]

    def _prosody(self, style: _Style, attrs: Mapping[str, str]) -> _Style:
        rate, volume = style.rate, style.volume
        if "rate" in attrs:
            rate = _bounded(rate * self._rate_factor(attrs["rate"]), _RATE_RANGE)
        if "volume" in attrs:
            volume = _bounded(volume * self._gain(attrs["volume"]), _GAIN_RANGE)
        return replace(style, rate=rate, volume=volume)

    def _rate_factor(self, value: str) -> float:
        factor: float | None = RATE_WORDS.get(value)
        if factor is None and (percent := _PERCENT.fullmatch(value)):
            factor = _percent(percent)
        elif factor is None and _FACTOR.fullmatch(value):
            factor = float(value)
        if factor is None or factor <= 0:
            expected = f"{', '.join(RATE_WORDS)}, a percentage or a factor such as 0.8"
            raise self.fail(f"prosody rate {_shown(value)}: expected {expected}")
        return factor

    def _gain(self, value: str) -> float:
        gain: float | None = VOLUME_WORDS.get(value)
        if gain is None and (percent := _PERCENT.fullmatch(value)):
            gain = _percent(percent)
        elif gain is None and (decibels := _DECIBELS.fullmatch(value)):
            sign = -1.0 if decibels[1] == "-" else 1.0
            gain = 10 ** (sign * min(float(decibels[2]), 120.0) / 20)
        if gain is None or gain < 0:
            expected = f"{', '.join(VOLUME_WORDS)}, +NdB, -NdB or a percentage"
            raise self.fail(f"prosody volume {_shown(value)}: expected {expected}")
        return gain

    def _voice(self, style: _Style, attrs: Mapping[str, str]) -> _Style:
        """`name="voice"`, `name="voice#speaker"`, `name="#speaker"` and/or `speaker="..."`:
        a new voice starts with its default speaker unless one is given."""
        voice, speaker = style.voice, style.speaker
        if "name" in attrs:
            named, hash_sign, numbered = attrs["name"].partition("#")
            if named:
                voice, speaker = self._name("voice name", named), None
            if hash_sign:
                speaker = self._name("voice speaker", numbered)
        if "speaker" in attrs:
            speaker = self._name("voice speaker", attrs["speaker"])
        return replace(style, voice=voice, speaker=speaker)

    def _name(self, what: str, value: str) -> str:
        if 0 < len(value) <= 64 and value.isprintable():
            return value
        raise self.fail(f"{what} {_shown(value)}: expected 1-64 printable characters")


def _shown(value: str) -> str:
    """An attribute value quoted in a message: at most 40 characters of it."""
    return repr(value if len(value) <= 40 else f"{value[:40]}...")


def _percent(match: re.Match[str]) -> float:
    """`NN%` is a factor of NN/100; `+NN%` and `-NN%` change by that much (SSML 1.0)."""
    value = float(match[2]) / 100
    if match[1] == "+":
        return 1 + value
    if match[1] == "-":
        return 1 - value
    return value


def _bounded(value: float, bounds: tuple[float, float]) -> float:
    return min(bounds[1], max(bounds[0], value))


def _position_of(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _shifted(err: SsmlError, prefix: str) -> SsmlError:
    """The error's position in the document before leading white space was stripped."""
    if not prefix:
        return err
    line = err.line + prefix.count("\n")
    column = err.column + len(prefix) - (prefix.rfind("\n") + 1) if err.line == 1 else err.column
    return SsmlError(err.problem, line, column)


def _defused_detail(err: Exception) -> str:
    if isinstance(err, DTDForbidden):
        return "document type declarations (DTDs) are not allowed"
    if isinstance(err, EntitiesForbidden):
        return "entity declarations are not allowed"
    if isinstance(err, DefusedXmlException):
        return "external references are not allowed"
    return str(err)[:200]


# ---- say-as -------------------------------------------------------------------------------


def _said(pieces: tuple[str | SayAs, ...], numbers: str | None) -> str:
    """Text pieces and `say-as` as one cleaned text, the `say-as` said in the num2words
    language `numbers` (None: as written)."""
    text = "".join(
        piece
        if isinstance(piece, str)
        else f" {_say_as(piece.text, piece.interpret_as, piece.format, lang=numbers)} "
        for piece in pieces
    )
    return _SPACE_BEFORE_PUNCTUATION.sub("", clean_text(text))


def _number_lang(lang: str) -> str | None:
    """The num2words language for a voice language (`de_DE` -> `de`), None when unsupported."""
    from num2words import CONVERTER_CLASSES  # noqa: PLC0415 - only SSML with say-as needs it

    for candidate in (lang, lang.replace("-", "_"), lang[:2].lower()):
        if candidate in CONVERTER_CLASSES:
            return candidate
    return None


def _say_as(text: str, interpret_as: str, format_: str, *, lang: str | None) -> str:
    """The words for `say-as` content; content that does not fit its type is read as it is."""
    text = " ".join(text.split())
    convert = _SAY_AS.get(interpret_as)
    if convert is None or not text or len(text) > MAX_SAY_AS_CHARS:
        return text
    return convert(text, format_, lang) or text


def _characters(text: str, _format: str, _lang: str | None) -> str:
    return " ".join(char for char in text if not char.isspace())


def _digits(text: str, _format: str, lang: str | None) -> str:
    return " ".join(_digit(char, lang) for char in text if not char.isspace())


def _words(number: int | Decimal, lang: str | None, to: str = "cardinal") -> str:
    if lang is None:
        return str(number)
    from num2words import num2words  # noqa: PLC0415 - only SSML with say-as needs it

    try:
        words = str(num2words(number, lang=lang, to=to))
    except Exception:  # noqa: BLE001 - a language module's failure: espeak reads the digits
        return str(number)
    return words.replace(",", "")  # "one thousand, two hundred": no pause inside a number


def _digit(char: str, lang: str | None) -> str:
    return _words(int(char), lang) if "0" <= char <= "9" else char


def _cardinal(text: str, _format: str, lang: str | None) -> str | None:
    match = _CARDINAL.fullmatch(text)
    if match is None:
        return None
    sign, whole, fraction = match[1], match[2].replace(",", ""), match[3]
    if len(whole) > MAX_NUMBER_DIGITS:
        return " ".join(_digit(char, lang) for char in text)
    number = Decimal(f"{sign}{whole}.{fraction}") if fraction else int(f"{sign}{whole}")
    return _words(number, lang)


def _ordinal(text: str, _format: str, lang: str | None) -> str | None:
    match = _ORDINAL.fullmatch(text)
    if match is None or len(match[1]) > MAX_NUMBER_DIGITS:
        return None
    return _words(int(match[1]), lang, "ordinal")


def _date(text: str, format_: str, lang: str | None) -> str | None:
    """`format` is the order of the fields (ymd, dmy, mdy, ym, my, md, dm, y, m, d); without one,
    only year-month-day (ISO) is understood. Read out as e.g. "March fifth, twenty twenty-four"
    in English; other languages get the day's ordinal, the month's number and the year."""
    parts = [part for part in _DATE_PARTS.split(text) if part]
    order = format_.lower() or ("ymd" if parts and len(parts[0]) == 4 else "")
    if (
        not order
        or len(order) != len(parts)
        or len(set(order)) != len(order)
        or not set(order) <= set("ymd")
        or not all(part.isascii() and part.isdigit() and len(part) <= 4 for part in parts)
    ):
        return None
    fields = dict(zip(order, (int(part) for part in parts), strict=True))
    year, month, day = fields.get("y"), fields.get("m"), fields.get("d")
    if (month is not None and not 1 <= month <= 12) or (day is not None and not 1 <= day <= 31):
        return None
    if year is not None and month is not None and day is not None:
        try:
            dt.date(year, month, day)
        except ValueError:
            return None
    said_year = None if year is None else _words(year, lang, "year")
    said_day = None if day is None else _words(day, lang, "ordinal")
    if lang is not None and lang.startswith("en"):
        said_month = None if month is None else _MONTHS[month - 1]
        head = " ".join(word for word in (said_month, said_day) if word)
        return ", ".join(word for word in (head, said_year) if word)
    said_month = None if month is None else _words(month, lang)
    return " ".join(word for word in (said_day, said_month, said_year) if word)


def _time(text: str, _format: str, lang: str | None) -> str | None:
    """hh:mm or hh:mm:ss, with an optional am/pm: "two oh five PM", "fourteen hundred"."""
    match = _CLOCK.fullmatch(text)
    if match is None:
        return None
    hour, minute = int(match[1]), int(match[2])
    second = int(match[3]) if match[3] else 0
    half = match[4].upper() if match[4] else ""
    if hour > (12 if half else 23) or minute > 59 or second > 59:
        return None
    said = [_words(hour, lang)]
    english = lang is not None and lang.startswith("en")
    if minute == 0 and english:
        said.append("hundred" if not half and (hour == 0 or hour > 12) else "o'clock")
    elif minute < 10 and english:
        said += ["oh", _words(minute, lang)]
    elif minute:
        said.append(_words(minute, lang))
    if second:
        said += ["and", _words(second, lang), "seconds" if english else ""]
    if half:
        said.append(f"{half} M")
    return " ".join(word for word in said if word)


def _telephone(text: str, _format: str, lang: str | None) -> str:
    """Digit by digit, a short pause (a comma) between the number's groups."""
    groups = [group for group in re.split(r"[\s\-./()]+", text) if group]
    said = []
    for group in groups:
        lead = "plus " if group.startswith("+") and lang and lang.startswith("en") else ""
        said.append(lead + " ".join(_digit(char, lang) for char in group.lstrip("+")))
    return ", ".join(said)


_SAY_AS: Final[Mapping[str, Callable[[str, str, str | None], str | None]]] = {
    "characters": _characters,
    "spell-out": _characters,
    "verbatim": _characters,
    "digits": _digits,
    "cardinal": _cardinal,
    "number": _cardinal,
    "ordinal": _ordinal,
    "date": _date,
    "time": _time,
    "telephone": _telephone,
}
"""Converters by `interpret-as`: (content, format, num2words language) -> words, or None when
the content does not fit (it is then read as it is). Other values read the content as it is."""
