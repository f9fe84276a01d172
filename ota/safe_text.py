"""Text from nodes made safe for where the tool writes it: the terminal and the Markdown report.

Anyone who may publish on the broker chooses what the tool reads (a node id is a topic level, a
`reason` or a `detail` is free text), so no such text reaches a terminal or a report raw:

- `escaped` is the one reversible rendering: a backslash is doubled, and every character that
  is not printable (C0 and C1 controls, DEL, bidi overrides and other format characters, line
  and paragraph separators, lone surrogates, unassigned code points) becomes `\\xNN`, `\\uNNNN`
  or `\\UNNNNNNNN`; long text is cut (`…`).
- `terminal` is the last guard over a whole block of output: every character that is not
  printable, but the line ends the tool writes itself, is shown escaped (no ANSI sequence, no
  carriage return, no surrogate that would stop the write).
- `markdown` puts node text in a code span (no emphasis, link, image, HTML or entity inside).

"Printable" is Python's `str.isprintable`. Pure; stdlib only.
"""

from __future__ import annotations

import sys
from typing import Final, TextIO

ELLIPSIS: Final = "…"


def _escape_char(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escaped(text: str, limit: int | None = None) -> str:
    """The text with `\\` doubled and every non-printable character escaped; at most `limit`
    characters of the text (then `…`)."""
    cut = limit is not None and len(text) > limit
    if cut:
        text = text[:limit]
    if text.isprintable() and "\\" not in text:
        return text + (ELLIPSIS if cut else "")
    out = [
        "\\\\" if char == "\\" else char if char.isprintable() else _escape_char(char)
        for char in text
    ]
    return "".join(out) + (ELLIPSIS if cut else "")


def is_clean(text: str) -> bool:
    """Whether every character of the text is printable."""
    return text.isprintable()


def terminal(text: str) -> str:
    """A block of output for a terminal: every non-printable character but `\\n` escaped."""
    if all(line.isprintable() for line in text.split("\n")):
        return text
    return "\n".join(
        "".join(char if char.isprintable() else _escape_char(char) for char in line)
        for line in text.split("\n")
    )


def say(text: str, file: TextIO | None = None) -> None:
    """Print a line through the `terminal` guard (stdout unless `file`), flushed."""
    print(terminal(text), file=file if file is not None else sys.stdout, flush=True)


def markdown(text: str, *, in_table: bool = False) -> str:
    """Node text as a Markdown code span: rendered literally (CommonMark: no emphasis, link,
    autolink, raw HTML or entity is recognized inside a code span). Non-printable characters
    are escaped first; in a table cell a `|` is written `\\|` (GFM reads the cell's end first)."""
    body = escaped(text)
    if in_table:
        body = body.replace("|", "\\|")
    if not body:
        return "(empty)"
    longest = run = 0
    for char in body:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    if body[0] in "` " or body[-1] in "` ":
        body = f" {body} "  # CommonMark strips one space on each side
    return f"{fence}{body}{fence}"
