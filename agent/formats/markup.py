"""Whether a text is an SSML document: the cheap look that decides whether the SSML parser
(`formats/ssml`, with its XML parser and number words) is needed at all, so that a process that
only reads plain texts never loads it. Pure."""

from __future__ import annotations

import re
from typing import Final

_SSML_START: Final = re.compile(r"[\s\ufeff]*(?:<\?xml[^>]{0,200}\?>\s*)?<speak[\s/>]")


def is_ssml(text: str) -> bool:
    """Whether a text payload is SSML: `<speak` first, after white space, a byte-order mark
    and an optional XML declaration."""
    return _SSML_START.match(text) is not None
