"""The text front end: what may reach the phonemizer, and where text may be cut. Pure.

Markup is not interpreted (the agent speaks plain text), so tags are removed rather than read
aloud; piper's `[[ phonemes ]]` escape is neutralized so message text can never inject raw
phonemes; control and invisible format characters go; white space collapses to single spaces.

Text from outside is cut by one scanner (`TextCutter`), in linear time and without backtracking
(each character is looked at once, whatever runs of punctuation, spaces or marks it holds): into
sentences as a stream arrives (the Wyoming server says each as soon as it is complete), and into
pieces of bounded length for the phonemizer (`pieces`: one espeak-ng call never gets more than
`PIECE_CHARS`). Every regular expression here runs in linear time on any input.
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Final, NamedTuple

_TAG: Final = re.compile(r"</?[A-Za-z!?][^<>]*>")
"""A markup tag: '<' then a letter, '/', '!' or '?' ("a < b" is not a tag)."""
_CONTROL: Final = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)
"""C0/C1 controls (but tab and newlines, which become spaces), soft hyphen, zero-width and
bidirectional marks, and other invisible format characters."""
_RAW_PHONEMES: Final = re.compile(r"\[\[|\]\]")
_SPACE: Final = re.compile(r"\s+")
_CHARREF_ZEROS: Final = re.compile(r"&#0+(?=[0-9])")
"""The leading zeros of a decimal character reference (`html.unescape` would convert them
all: more than 4,300 digits raise ValueError)."""
_LONG_CHARREF: Final = re.compile(r"&#[1-9][0-9]{7,};?")
"""A decimal character reference of eight digits or more: beyond the last code point."""


def clean_text(text: str) -> str:
    """Normalize message text for speech (NFKC, no tags, no controls, single spaces)."""
    text = unicodedata.normalize("NFKC", text)
    text = _CONTROL.sub("", text)
    text = _TAG.sub(" ", text)
    text = _CHARREF_ZEROS.sub("&#", text)
    text = _LONG_CHARREF.sub("\ufffd", text)  # what `html.unescape` makes of it, unconverted
    text = html.unescape(text)  # "&amp;" is "&", after tags are gone ("&lt;b&gt;" stays text)
    text = _CONTROL.sub("", text)  # unescaping may have produced some
    text = _RAW_PHONEMES.sub(" ", text)
    while "[[" in text or "]]" in text:  # "[[[" leaves "[[" after one pass
        text = _RAW_PHONEMES.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


# ---- cutting --------------------------------------------------------------------------------

SENTENCE_MARKS: Final = ".!?;:\u3002\uff01\uff1f"
"""Marks that end a sentence when white space follows them (closing quotes or brackets may
stand between): `Hello. ` ends one, `3.14` and `e.g.x` do not."""
CLOSERS: Final = "\"')]\u201d\u2019\u00bb"
"""What may follow a sentence's marks before the white space (`"Stop!" he said`)."""
CLAUSE_MARKS: Final = ",\u3001\uff0c"
"""Marks that end a clause when white space follows them: a cut there still sounds natural."""
PIECE_CHARS: Final = 160
"""Most characters one espeak-ng call is given (`pieces`): under a millisecond of phonemizing,
which holds the interpreter lock throughout (measured: 3-6 us per character, linear in the
text). It also keeps every clause espeak-ng sees short: espeak-ng (piper-tts 1.8.0) crashes the
process (SIGSEGV) on a clause of about 97 letters spelled between dots (`x.x.x.`...: 194
characters), which a 200-byte message could carry; within 160 characters it cannot."""

_NOTABLE: Final = re.compile(
    "[" + re.escape(SENTENCE_MARKS + CLOSERS + CLAUSE_MARKS) + r"]|\s", re.UNICODE
)
"""The characters the cutter looks at (a class: one character per match, no backtracking)."""
_TEXT, _MARKS, _CLOSED, _CLAUSE = range(4)
"""The cutter's states: in text, after sentence marks, after their closers, after a clause
mark."""


class Cut(NamedTuple):
    """A piece of text, and whether it ends at a sentence end (else at a clause end, a space,
    or, in a run without one, at the length bound)."""

    text: str
    sentence: bool


class TextCutter:
    """Cuts text that arrives in parts, looking at each character once.

    With `every_sentence`, a piece is cut at each sentence end (a stream said as it arrives);
    without, only where the text would grow past `max_chars` (pieces for the phonemizer). A
    text that reaches `max_chars` without a sentence end is cut at its last clause end, else at
    its last white space, else at `max_chars`: no piece is ever longer, whatever the text.
    Pieces keep their characters (white space included): joined, they are the text fed."""

    def __init__(self, max_chars: int, *, every_sentence: bool) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, not {max_chars}")
        self._max = max_chars
        self._every = every_sentence
        self._parts: list[str] = []
        """The text not cut yet (its length is `_length`, at most `max_chars`)."""
        self._length = 0
        self._state = _TEXT
        self._last_notable = -1
        """Where the last character looked at stood, from the start of the text not cut yet
        (another character since then puts the scan back in text)."""
        self._best: list[int] = [0, 0, 0]
        """The last cut after a sentence end, a clause end and a space, in the text not cut
        yet (0: none)."""

    def feed(self, text: str) -> list[Cut]:
        """Take more text; the pieces it completes."""
        out: list[Cut] = []
        base = self._length  # where `text` starts in the text not cut yet
        start = 0  # what of `text` is not in a piece yet
        for match in _NOTABLE.finditer(text):
            at = base + match.start() - start  # from the start of the text not cut yet
            while at >= self._max:  # a piece is due before this character
                cut = self._forced()
                out.append(self._take(cut, text, start, base))
                start, base = self._consumed(cut, start, base)
                at = base + match.start() - start
            if at != self._last_notable + 1:
                self._state = _TEXT  # another character stood between
            self._last_notable = at
            sentence = self._look(match.group(), at + 1)
            if sentence and self._every:
                out.append(self._take(at + 1, text, start, base))
                start, base = self._consumed(at + 1, start, base)
        while base + len(text) - start > self._max:  # a run without a notable character
            cut = self._forced()
            out.append(self._take(cut, text, start, base))
            start, base = self._consumed(cut, start, base)
        if start < len(text):
            self._parts.append(text[start:])
        self._length = base + len(text) - start
        return out

    def end(self) -> list[Cut]:
        """The text left (at most one piece, none when nothing is left)."""
        rest = "".join(self._parts)
        self._parts, self._length, self._best = [], 0, [0, 0, 0]
        self._state, self._last_notable = _TEXT, -1
        return [Cut(rest, sentence=False)] if rest else []

    def _look(self, char: str, after: int) -> bool:
        """The scan's state after one notable character (`after`: where a cut after it would
        be); True when a sentence ends there."""
        state = self._state
        ended = False
        if char in SENTENCE_MARKS:
            state = _MARKS
        elif char in CLOSERS:
            state = _CLOSED if state in (_MARKS, _CLOSED) else _TEXT
        elif char in CLAUSE_MARKS:
            state = _CLAUSE
        else:  # white space
            if state in (_MARKS, _CLOSED):
                self._best[0] = after
                ended = True
            elif state == _CLAUSE:
                self._best[1] = after
            self._best[2] = after
            state = _TEXT
        self._state = state
        return ended

    def _forced(self) -> int:
        """Where the text not cut yet, at its bound, is cut: the last sentence end, else the
        last clause end, else the last space, else the bound itself."""
        for cut in self._best:
            if 0 < cut <= self._max:
                return cut
        return self._max

    def _take(self, cut: int, text: str, start: int, base: int) -> Cut:
        """The piece of the first `cut` characters of the text not cut yet (`base` of them
        in `_parts`, the rest from `text[start:]`)."""
        sentence = cut == self._best[0]
        held = "".join(self._parts)
        if cut <= base:
            piece = held[:cut]
            self._parts = [held[cut:]] if cut < base else []
        else:
            piece = held + text[start : start + cut - base]
            self._parts = []
        return Cut(piece, sentence)

    def _consumed(self, cut: int, start: int, base: int) -> tuple[int, int]:
        """After a piece of `cut` characters: the new (start in `text`, base), and every
        position moved back by `cut`."""
        self._best = [b - cut if b > cut else 0 for b in self._best]
        self._last_notable -= cut
        if cut <= base:
            return start, base - cut
        return start + cut - base, 0


def pieces(text: str, max_chars: int = PIECE_CHARS) -> list[Cut]:
    """A text in pieces of at most `max_chars`, cut only where it must be (at its last sentence
    end, clause end or space before the bound): a text within the bound is one piece."""
    cutter = TextCutter(max_chars, every_sentence=False)
    return [*cutter.feed(text), *cutter.end()]
