"""The steps a request plays after its chime: speech, pauses and sounds (an SSML document parsed,
or a request's plain fields), and the voices they name. Pure data: `formats/ssml` makes them
from a document, `formats/program` from a request; the core checks the voices on arrival.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SayAs:
    """A `say-as` as written: its words depend on the language of the voice that reads it
    (numbers, ordinals, dates, times), so they are made when that voice is known."""

    text: str
    interpret_as: str
    format: str


@dataclass(frozen=True, slots=True)
class Speech:
    """Text to synthesize, with the voice and prosody in force where it stands."""

    text: str
    """Cleaned text (see `text.clean_text`), never empty; `sub` applied, and `say-as` in the
    language the document was parsed for (`in_language` says it in another)."""
    rate: float = 1.0
    """Speaking-rate factor, MIN_RATE to MAX_RATE (4 decimals): the speech's duration is
    divided by it (`Voice.at_rate`)."""
    volume: float = 1.0
    """Linear gain, 0 to 1 (4 decimals), applied on top of the request's and the global volume."""
    voice: str | None = None
    """Voice id from `<voice name>`; None: the request's voice."""
    speaker: str | None = None
    """Speaker of a multi-speaker voice (a name or a number, as written); None: its default."""
    said: tuple[str | SayAs, ...] = field(default=(), compare=False)
    """The text as written, with its `say-as` pieces, when it has any (else empty): what
    `in_language` says again for another voice."""
    break_before: bool = False
    """A break (any `<break>`, one of no time too, or an `s`/`p` boundary) stands just before
    it: the voice's own near-silence at its start is cut, so the break is the whole silence."""
    break_after: bool = False
    """A break stands just after it (the same at its end)."""


@dataclass(frozen=True, slots=True)
class Pause:
    """Silence: a `<break>`, or a sentence or paragraph boundary."""

    seconds: float
    """More than 0 and at most MAX_PAUSE: the silence between the speech on its sides (the
    voice's own near-silence there is cut, see `Speech.break_before`). A break of no time
    makes no Pause, only the marks on the speech beside it."""


@dataclass(frozen=True, slots=True)
class Sound:
    """A named sound (`<audio src>`): the media name as written, resolved by the player."""

    name: str
    fallback: tuple[Segment, ...] = ()
    """What to say instead when there is no such sound (the element's content)."""
    volume: float = 1.0
    """Linear gain, 0 to 1 (4 decimals), from the enclosing `prosody volume`."""
    names_only: bool = False
    """Only a name of `audio.media` (SSML's `<audio src>`), never a URL: a document cannot
    make the node download."""


Segment = Speech | Pause | Sound
"""One step of a parsed document."""


def named_voices(segments: tuple[Segment, ...]) -> frozenset[str]:
    """The voices a document switches to with `<voice name>` (to check on arrival)."""
    return frozenset(_voices(segments))


def _voices(segments: tuple[Segment, ...]) -> list[str]:
    found: list[str] = []
    for segment in segments:
        if isinstance(segment, Speech) and segment.voice is not None:
            found.append(segment.voice)
        elif isinstance(segment, Sound):
            found += _voices(segment.fallback)
    return found
