"""The shape of the package: a pure core, edges that do not know each other, one root."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "agent"
PURE = {"core", "messages", "payloads", "topics", "config", "text", "chunking", "volume"}
PURE |= {"discovery", "hermes", "telemetry"}
IMPURE_STDLIB = {"threading", "time", "socket", "queue", "subprocess", "random", "uuid", "signal"}
EDGES = {"mqtt_link", "player", "voice", "synthesizer", "phrase_cache", "chimes", "systemd"}
ALLOWED_AGENT_IMPORTS = {
    "core": {"messages"},
    "messages": set(),
    "payloads": {"messages", "text"},
    "topics": set(),
    "config": set(),
    "text": set(),
    "chunking": set(),
    "mqtt_link": {"config", "messages"},
    "volume": {"messages"},
    "discovery": {"topics"},
    "hermes": {"messages", "payloads"},
    "telemetry": {"messages"},
    "systemd": set(),
    "chimes": {"messages"},
    "player": {"messages", "volume"},
    "voice": set(),
    "phrase_cache": set(),
    "synthesizer": {"chimes", "chunking", "messages", "phrase_cache", "player", "text", "voice"},
}


def imports_of(module: str) -> tuple[set[str], set[str]]:
    """(top-level external modules, agent modules) imported by agent/<module>.py."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    external: set[str] = set()
    internal: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            external |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.module:
                    internal.add(node.module.split(".")[0])
                else:
                    internal |= {alias.name for alias in node.names}
            elif node.module:
                external.add(node.module.split(".")[0])
    return external, internal


@pytest.mark.parametrize("module", sorted(ALLOWED_AGENT_IMPORTS))
def test_modules_import_only_what_their_layer_allows(module: str) -> None:
    external, internal = imports_of(module)
    assert internal <= ALLOWED_AGENT_IMPORTS[module], internal
    if module in PURE - {"config"}:
        assert not external & IMPURE_STDLIB, external
        pure_stdlib = {"__future__", "collections", "dataclasses", "datetime", "enum", "html"}
        pure_stdlib |= {"io", "json", "math", "re", "typing", "unicodedata", "wave"}
        assert not external - pure_stdlib, external


def test_only_the_composition_root_wires_every_edge() -> None:
    _, internal = imports_of("app")
    assert internal >= EDGES
    for module in ALLOWED_AGENT_IMPORTS:
        assert "app" not in imports_of(module)[1]
