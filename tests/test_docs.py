"""The documentation site builds, strict (MkDocs: a broken link or anchor fails the build), and
every page under docs/ is in its navigation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strict(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "security" / "index.html").is_file()


def pages_of(nav: object) -> set[str]:
    """The pages a navigation (nested lists of {title: page or list}) names."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return {page for entry in nav for page in pages_of(entry)}
    if isinstance(nav, dict):
        return {page for entry in nav.values() for page in pages_of(entry)}
    raise TypeError(nav)


def test_every_page_is_in_the_navigation_and_on_the_home_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = pages_of(config["nav"])
    pages = {path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md")}
    assert pages == listed, pages ^ listed
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert not [p for p in pages - {"index.md"} if f"]({p})" not in home]


def test_the_readme_is_the_front_door() -> None:
    """Under ~20 KB, and every page of the site linked from it (links that resolve)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 20_000
    linked = set(re.findall(r"\]\(docs/([^)#]+)", readme))
    assert all((ROOT / "docs" / page).is_file() for page in linked), linked
    pages = {path.name for path in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, pages - linked


def test_the_module_table_lists_every_module_of_the_agent() -> None:
    """docs/architecture.md's table of modules, against the files (a folder's `__init__.py`
    says what the folder holds, as its row in the table does)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(agent/[\w/]+\.py)`", text, re.MULTILINE))
    modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "agent").rglob("*.py")}
    modules -= {f"agent/{path.parent.name}/__init__.py" for path in (ROOT / "agent").glob("*/*.py")}
    assert listed == modules, listed ^ modules
