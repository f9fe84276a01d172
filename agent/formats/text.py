"""The text front end: what may reach the phonemizer. Pure.

Markup is not interpreted (the agent speaks plain text), so tags are removed rather than read
aloud; piper's `[[ phonemes ]]` escape is neutralized so message text can never inject raw
phonemes; control and invisible format characters go; white space collapses to single spaces.
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Final

_TAG: Final = re.compile(r"</?[A-Za-z!?][^<>]*>")
"""A markup tag: '<' then a letter, '/', '!' or '?' ("a < b" is not a tag)."""
_CONTROL: Final = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)
"""C0/C1 controls (but tab and newlines, which become spaces), soft hyphen, zero-width and
bidirectional marks, and other invisible format characters."""
_RAW_PHONEMES: Final = re.compile(r"\[\[|\]\]")
_SPACE: Final = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Normalize message text for speech (NFKC, no tags, no controls, single spaces)."""
    text = unicodedata.normalize("NFKC", text)
    text = _CONTROL.sub("", text)
    text = _TAG.sub(" ", text)
    text = html.unescape(text)  # "&amp;" is "&", after tags are gone ("&lt;b&gt;" stays text)
    text = _CONTROL.sub("", text)  # unescaping may have produced some
    text = _RAW_PHONEMES.sub(" ", text)
    while "[[" in text or "]]" in text:  # "[[[" leaves "[[" after one pass
        text = _RAW_PHONEMES.sub(" ", text)
    return _SPACE.sub(" ", text).strip()
