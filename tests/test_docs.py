"""The documentation site builds, strict (MkDocs: a broken link or anchor fails the build),
every page under docs/ is in its navigation, and the generated parts (the configuration
reference, config/agent.yaml, the bench figures) are current."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ import each other by name (as mypy has them)

import generate_docs  # noqa: E402


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
    folders = {path.parent for path in (ROOT / "agent").rglob("*/*.py")}
    modules -= {(folder / "__init__.py").relative_to(ROOT).as_posix() for folder in folders}
    assert listed == modules, listed ^ modules


def test_the_generated_pages_are_current() -> None:
    """config/agent.yaml, docs/configuration.md and the bench figures in the pages are what
    scripts/generate_docs.py makes of the declarations and bench/*.json (one text per key, no
    figure copied by hand): after a change there, `make docs` (or `python -m
    scripts.generate_docs`) writes them."""
    stale = [path.relative_to(ROOT).as_posix() for path in generate_docs.stale()]
    assert not stale, f"not current: {stale}; run python -m scripts.generate_docs"


def test_each_key_is_written_once_in_the_yaml_and_the_reference() -> None:
    """Each key's one text (its declaration's) is its comment in config/agent.yaml and its row
    in docs/configuration.md; the examples are YAML of the key they show."""
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for key in generate_docs.config_keys():
        (row,) = [line for line in reference.splitlines() if line.startswith(f"| `{key.path}` |")]
        assert generate_docs.markdown_text(key.doc) in row
    for path, example in generate_docs.EXAMPLES.items():
        shown = yaml.safe_load(example)
        assert list(shown) == [path.rsplit(".", 1)[-1]], path


def test_every_figure_is_read_from_its_bench_json_and_shown_somewhere() -> None:
    """Each figure's value is in its JSON, and each is shown on a page (a marker)."""
    pages = "\n".join(p.read_text(encoding="utf-8") for p in generate_docs.markdown_files())
    shown = set(generate_docs.MARKER.findall(pages))
    for name, figure in generate_docs.FIGURES.items():
        assert figure.text(), name
        assert (name, figure.text()) in shown, f"{name} is on no page"


def test_the_site_reads_lists_and_diagrams_as_github_shows_them() -> None:
    """scripts/mkdocs_hooks.py: a list right under a paragraph line becomes a list, an item's
    later blocks indented by 2 stay in the item, a box-drawn block is a diagram (its lines kept
    whole), a fenced block's own indentation is kept."""
    import markdown  # type: ignore[import-untyped]  # noqa: PLC0415 - MkDocs' own
    import mkdocs_hooks  # noqa: PLC0415

    source = (
        "What it does:\n- one\n- two\n\n"
        "- item\n\n  its second paragraph\n  ```yaml\n  a:\n    b: 1\n  ```\n- next\n\n"
        "```\nA ──► B\n```\n"
    )
    html = markdown.markdown(
        mkdocs_hooks.on_page_markdown(source),
        extensions=["pymdownx.superfences", "pymdownx.highlight", "attr_list"],
    )
    assert "<p>What it does:</p>\n<ul>" in html
    assert "- one" not in html
    (second,) = [item for item in html.split("<li>") if "its second paragraph" in item]
    assert '<span class="nt">b</span>' in second  # the block stayed in its item
    assert "next" not in second
    assert '<span class="w">  </span><span class="nt">b</span>' in second  # its own indent
    assert 'class="diagram' in html


def test_the_walk_of_a_speak_and_an_alarm_names_what_is_there() -> None:
    """docs/architecture.md's "Follow a speak, follow an alarm": each step's file exists and
    defines the functions it names (`Class.method` or `function`), and every `Class.method`
    of the section is defined in the agent: a rename that leaves the walk behind fails here."""
    import ast  # noqa: PLC0415

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Follow a speak, follow an alarm", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^\d+\. `(agent/[\w/]+\.py)` — ((?:`[\w.]+`(?:, )?)+):", section, re.M)
    assert len(steps) >= 20, steps

    def defined(path: Path) -> set[str]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            names |= {f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
        return names

    for path, names in steps:
        missing = set(re.findall(r"`([\w.]+)`", names)) - defined(ROOT / path)
        assert not missing, f"{path} has no {missing}"
    everywhere = set().union(*(defined(p) for p in (ROOT / "agent").rglob("*.py")))
    methods = set(re.findall(r"`([A-Z]\w+\.\w+)`", section))
    assert methods <= everywhere, methods - everywhere
