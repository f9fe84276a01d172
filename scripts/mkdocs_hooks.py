"""MkDocs hooks (mkdocs.yml `hooks:`): the site reads the pages' Markdown as GitHub shows them.

- A list may start right under a paragraph line, and an item's later paragraphs and blocks be
  indented by the marker's width, as CommonMark (GitHub) allows: Python-Markdown would run the
  list into the paragraph, its `- ` markers shown literally, and end the item early. A blank
  line is put before such a list, and indentation inside lists is doubled.
- A fenced block without a language whose lines draw with box characters (`─ │ ├ └ ►`) is a
  diagram: it gets the class `diagram` (docs/stylesheets/extra.css keeps its lines whole and
  sizes it to fit), while other code blocks wrap their long lines instead of being cut at the
  page's edge.

tests/test_docs_browser.py checks the result in Chromium.
"""

from __future__ import annotations

import re
from typing import Any, Final

FENCE: Final = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
LIST_ITEM: Final = re.compile(r"^(?P<indent>\s*)(?:[-*+]|1[.)])\s+\S")
BOX_DRAWING: Final = re.compile(r"[\u2500-\u257f\u25b2-\u25c4]")
"""Box-drawing characters and the arrows diagrams use (▲ ► ▼ ◄)."""


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's Markdown with lists set apart from the paragraph above them and diagrams
    marked."""
    return set_lists_apart(mark_diagrams(markdown))


def mark_diagrams(markdown: str) -> str:
    """Fenced blocks without a language that draw with box characters get the language
    `text`."""
    lines = markdown.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            out.append(lines[index])
            index += 1
            continue
        end = index + 1
        fence = opening["fence"]
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = lines[index + 1 : end]
        if not opening["info"].strip() and any(BOX_DRAWING.search(line) for line in body):
            out.append(f"{opening['indent']}{fence}{{.text .diagram}}")
        else:
            out.append(lines[index])
        out += body
        out += lines[end : end + 1]
        index = end + 1
    return "\n".join(out)


def set_lists_apart(markdown: str) -> str:
    """Lists as CommonMark reads them: a blank line before a list item that follows a
    paragraph line (or a later block of the item before), and inside a list every indentation
    doubled (GitHub takes a paragraph,
    a nested list or a fenced block indented by the marker's width, 2, as part of the item;
    Python-Markdown wants 4); a fenced block's lines keep their own indentation."""
    out: list[str] = []
    fence: str | None = None
    shift = 0
    in_list = False
    block_in_item = False  # an item's later block (after a blank line): set the next item apart
    for line in markdown.split("\n"):
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append(" " * shift + line if line.strip() else line)
            continue
        if not line.strip():
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        previous = out[-1] if out else ""
        if LIST_ITEM.match(line):
            if previous.strip() and (not in_list or block_in_item):
                out.append("")
            in_list = True
            block_in_item = False
        elif not previous.strip() and indent == 0:
            in_list = False  # a new block at the margin after a blank line ends the list
        elif not previous.strip() and in_list:
            block_in_item = True
        shift = indent if in_list else 0
        opening = FENCE.match(line)
        if opening is not None:
            fence = opening["fence"]
        out.append(" " * shift + line)
    return "\n".join(out)
