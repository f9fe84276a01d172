"""The documentation site as a reader sees it: built (MkDocs, strict), served over HTTP, and every
page opened in headless Chromium (harness/screenshot.py) at a laptop's width. No paragraph shows
a literal list marker or a heading or table row swallowed into it (a Markdown list or section
run into the paragraph before it), no section is collapsed, and no figure (a code block, an
image, a table) is cut off at its right edge. The home page says where the project lives (no
public address yet, said plainly), and its picture is docs/images/site-front-page.png."""

from __future__ import annotations

import functools
import http.server
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from harness import ROOT
from harness.screenshot import Page, browser

pytestmark = pytest.mark.clients

SIZE: Final = (1280, 900)
"""The window: a laptop's width, where the site shows its navigation and its table of contents."""
PICTURE: Final = ROOT / "docs" / "images" / "site-front-page.png"

PROBLEMS: Final = r"""
(() => {
  const found = [];
  const article = document.querySelector("article") || document.body;
  const said = (el) => (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 120);
  for (const p of article.querySelectorAll("p")) {
    const text = p.textContent || "";
    const inside = (what) => found.push(what + " inside a paragraph: " + said(p));
    if (/(^|\n)\s*[-*+] \S/.test(text)) found.push("a literal list marker: " + said(p));
    if (/(^|\n)\s*#{1,6} \S/.test(text)) inside("a heading");
    if (/(^|\n)\s*\|.*\|\s*(\n|$)/.test(text)) inside("a table row");
    if (/(^|\n)\s*```/.test(text)) inside("a code fence");
  }
  for (const d of article.querySelectorAll("details:not([open])")) {
    found.push("a collapsed section: " + said(d));
  }
  const cut = (el, what) => {
    if (el.scrollWidth > el.clientWidth + 1) {
      const sizes = `${el.scrollWidth} px wide in ${el.clientWidth} px`;
      found.push(`${what} cut off (${sizes}): ` + said(el));
    }
  };
  for (const code of article.querySelectorAll("pre > code")) cut(code, "a code block");
  for (const wrap of article.querySelectorAll(".md-typeset__scrollwrap")) cut(wrap, "a table");
  const right = article.getBoundingClientRect().right;
  for (const img of article.querySelectorAll("img, svg")) {
    const box = img.getBoundingClientRect();
    const named = img.alt || img.src || "svg";
    if (box.right > right + 1) found.push(`an image cut off at ${Math.round(right)} px: ` + named);
    if (img.tagName === "IMG" && !img.complete) found.push("an image not loaded: " + img.src);
  }
  return found;
})()
"""
"""What is wrong on the page shown (JavaScript, evaluated in it)."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strict into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment, check=False
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on a free loopback port (as a web server would serve it)."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def pages(site: Path) -> list[str]:
    """Every page of the site, as paths under its root."""
    found = ["/"]
    for index in sorted(site.glob("*/index.html")):
        if index.parent.name not in {"search", "assets"}:
            found.append(f"/{index.parent.name}/")
    return found


def problems_of(page: Page, url: str) -> list[str]:
    page.open(url)
    result = page.evaluate(PROBLEMS)
    assert isinstance(result, list), result
    return [f"{url}: {problem}" for problem in result]


def test_every_page_reads_as_written(site: Path, served: str) -> None:
    listed = pages(site)
    assert len(listed) == len(list((ROOT / "docs").glob("*.md")))  # every page of docs/
    found: list[str] = []
    with browser(*SIZE) as page:
        for path in listed:
            found += problems_of(page, served + path)
    assert not found, "\n".join(found)


def test_the_front_page_says_where_the_project_lives_and_is_photographed(served: str) -> None:
    with browser(*SIZE) as page:
        page.open(served + "/")
        text = page.evaluate("document.body.innerText")
        assert isinstance(text, str)
        assert "no public address yet" in text
        page.capture(PICTURE)
    picture = PICTURE.read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n")
    assert struct.unpack(">II", picture[16:24]) == SIZE  # the IHDR chunk
    assert len(picture) > 30_000  # a drawn page, not a blank one
