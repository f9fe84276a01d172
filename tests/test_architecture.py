"""The shape of the code: a pure core, edges that do not know each other, one composition root;
and operator tools that never load the agent's runtime.

Every module of `agent/` and `ota/` is listed here with the modules it may import; a new module
fails this test until it is placed in a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"
OTA = ROOT / "ota"
PACKAGES = ("agent", "ota", "tiers")

PURE: dict[str, set[str]] = {
    # decisions and protocol: no I/O, no clock, no threads
    "core": {"catalog", "messages", "program"},
    "catalog": {"egress"},
    "program": {"messages", "ssml"},
    "messages": set(),
    "states": set(),
    "inputs": {"hermes", "messages"},
    "payloads": {"messages", "ssml", "text"},
    "topics": set(),
    "config": {"egress"},
    "egress": set(),
    "text": set(),
    "chunking": set(),
    "volume": {"messages"},
    "discovery": {"topics"},
    "hermes": {"messages", "payloads", "states"},
    "hermes_bridge": {"hermes", "inputs", "messages", "states"},
    "telemetry": {"messages"},
    "status": {"config", "discovery", "messages", "states", "telemetry", "topics"},
    "routes": {
        "config",
        "hermes",
        "inputs",
        "manifest",
        "messages",
        "payloads",
        "states",
        "topics",
    },
    "manifest": set(),
    "flood": set(),
    "ssml": {"text"},
    "pcm": {"messages"},
    "media": {"pcm"},
    "start_clock": set(),
}
"""Pure modules and the agent modules each may import."""
PURE_EXTERNAL = {
    "__future__", "collections", "dataclasses", "datetime", "enum", "html", "io", "json",
    "math", "re", "typing", "unicodedata", "wave", "base64", "binascii", "hashlib",
    "contextlib",
}  # fmt: skip
"""Standard modules without I/O, clocks or threads."""
PURE_LIBRARIES = {"config": {"yaml", "os", "pathlib", "socket", "types"}}
PURE_LIBRARIES |= {"egress": {"ipaddress", "socket", "urllib"}}
PURE_LIBRARIES |= {"manifest": {"cryptography"}}
PURE_LIBRARIES |= {"pcm": {"numpy"}, "ssml": {"decimal", "defusedxml", "num2words", "xml"}}
PURE_LIBRARIES |= {"media": {"numpy", "soundfile", "soxr"}}
"""Further imports of particular pure modules: YAML and the environment for the config (read at
start only), address parsing for the egress policy (`socket.inet_aton` only, no I/O), Ed25519
for manifests, numpy for audio data, a hardened XML parser and number words for SSML, decoders
and a resampler for audio bytes (`media` never opens a file: the chimes' loader reads one, the
decoder child is given bytes)."""

EDGES: dict[str, dict[str, set[str]]] = {
    "tts": {
        "voice": {"chunking", "decoder_build", "decoder_parts", "pcm", "sessions"},
        "sessions": {"nofollow"},
        "decoder_parts": {"sessions"},
        "decoder_build": {"decoder_parts", "sessions"},
        "split_graph": {"sessions"},
        "synthesizer": {"chimes", "chunking", "messages", "pcm", "phrase_cache", "text", "voice"}
        | {"media", "media_source", "program", "ssml"},
        "media_source": {"egress", "http_fetch", "media", "media_decoder", "messages", "pcm"}
        | {"phrase_cache"},
        "media_decoder": {"media", "media_child"},
        "media_child": {"media"},
        "phrase_cache": {"nofollow", "pcm"},
        "chimes": {"media", "messages", "pcm"},
        "healthcheck": {"sessions", "voice"},
    },
    "audio": {"player": {"messages", "pcm", "start_clock", "volume"}},
    "mqtt": {"mqtt_link": {"config", "messages"}},
    "storage": {
        "journal": {"messages", "nofollow", "states"},
        "ledger": {"journal", "messages", "states", "step_marker"},
        "step_marker": {"nofollow"},
    },
    "ota": {
        "updater": {"config", "egress", "http_fetch", "manifest", "model_at_start", "states"}
        | {"update_store"},
        "update_store": {"manifest", "states"},
        "model_at_start": {"config", "states", "update_store"},
    },
    "system": {"systemd": set(), "board": set(), "clock": set(), "allocator": set()},
    "loop": {"inbox": set(), "voice_swap": set()},
}
"""Edges by the outside thing they own, each module with the agent modules it may import: pure
ones and its own edge's, never another edge's."""
SHARED = {"http_fetch": {"egress"}, "nofollow": set[str]()}
"""Client libraries of our own that own no outside thing (no state, no thread): any edge may use
them, as it uses the standard library."""
ROOTS = {"app", "assembly", "fact_sheet", "voices", "__main__", "__init__"}
"""The composition: may import anything; nothing imports them (but `__main__` the two it runs)."""

OTA_ALLOWED = {
    "__init__": set(),
    "__main__": {"agent.manifest", "ota.connection", "ota.fleet", "ota.inventory", "ota.release"}
    | {"ota.rollout", "ota.rollout_report", "ota.rollout_state", "ota.safe_text", "ota.status"},
    "connection": set(),
    "fleet": {"agent.states", "ota.connection", "ota.inventory", "ota.node_messages"}
    | {"ota.safe_text"},
    "inventory": {"ota.node_messages", "ota.safe_text"},
    "node_messages": {"agent.states", "ota.safe_text"},
    "release": {"agent.manifest"},
    "rollout": {"agent.manifest", "agent.states", "ota.fleet", "ota.inventory"}
    | {"ota.rollout_state", "ota.safe_text", "ota.waves"},
    "rollout_report": {"agent.states", "ota.inventory", "ota.rollout_state", "ota.safe_text"},
    "rollout_state": set(),
    "safe_text": set(),
    "status": {"ota.connection", "ota.fleet", "ota.inventory", "ota.safe_text"},
    "waves": {"agent.states"},
}
"""The operator's tools and what they may import: never ONNX Runtime (offers, rollouts and
releases run on an operator's machine without it)."""
TIERS = ROOT / "tiers"
TIERS_ALLOWED = {
    "__init__": set(),
    "audio_distance": set(),
    "variants": set(),
    "quantize": {"agent.voice", "tiers.audio_distance", "tiers.variants"},
}
"""The model tiers (the quantizer, which builds and synthesizes voice variants) and what they
may import: never the operator's tool."""
RUNTIME = {"onnxruntime", "onnx", "piper", "alsaaudio"}

EDGE_MODULES = {module: edge for edge, modules in EDGES.items() for module in modules}
ALLOWED = {**PURE, **SHARED}
ALLOWED |= {m: allowed for modules in EDGES.values() for m, allowed in modules.items()}


def imports_of(path: Path, package: str) -> tuple[set[str], set[str]]:
    """(top-level external modules, `agent.x`, `ota.x` and `tiers.x` modules) imported by one
    file of `package`."""
    external: set[str] = set()
    internal: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = f"{package}.{node.module}" if node.level and node.module else node.module
            base = base or package  # `from . import x`
            whole = base in PACKAGES  # `from agent import manifest`: a module each
            names = [f"{base}.{alias.name}" if whole else base for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] in PACKAGES:
                internal.add(".".join(parts[:2]))
            else:
                external.add(parts[0])
    return external, internal


def agent_imports(module: str) -> tuple[set[str], set[str]]:
    external, internal = imports_of(AGENT / f"{module}.py", "agent")
    return external, {name.removeprefix("agent.") for name in internal if name != "agent.version"}


def test_every_module_is_placed_in_a_layer() -> None:
    agent = {path.stem for path in AGENT.glob("*.py")}
    assert agent == set(PURE) | set(SHARED) | set(EDGE_MODULES) | ROOTS
    assert {path.stem for path in OTA.glob("*.py")} == set(OTA_ALLOWED)
    assert {path.stem for path in TIERS.glob("*.py")} == set(TIERS_ALLOWED)


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_modules_import_only_what_their_layer_allows(module: str) -> None:
    external, internal = agent_imports(module)
    assert internal <= ALLOWED[module], internal - ALLOWED[module]
    if module in PURE:
        allowed = PURE_EXTERNAL | PURE_LIBRARIES.get(module, set())
        assert not external - allowed, external - allowed


def test_the_layer_rules_live_here_alone() -> None:
    """A module's docstring says what it holds; what it may import is this test's (issue 23:
    five docstrings' lists had drifted from the code)."""
    listing = [
        path.relative_to(ROOT).as_posix()
        for path in [*AGENT.glob("*.py"), *OTA.glob("*.py"), *TIERS.glob("*.py")]
        if "allowed imports"
        in " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split()).lower()
    ]
    assert not listing, listing


@pytest.mark.parametrize("module", sorted(EDGE_MODULES))
def test_an_edge_never_imports_another_edge(module: str) -> None:
    _, internal = agent_imports(module)
    others = {m for m in internal if m in EDGE_MODULES and EDGE_MODULES[m] != EDGE_MODULES[module]}
    assert not others, f"{module} ({EDGE_MODULES[module]}) imports {others}"


def test_only_the_composition_imports_the_composition() -> None:
    for module in ALLOWED:
        assert not agent_imports(module)[1] & ROOTS, module
    _, main = agent_imports("__main__")
    assert main & ROOTS <= {"app", "voices"}


def test_the_composition_root_wires_every_edge() -> None:
    reached: set[str] = set()
    todo = ["__main__"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += agent_imports(module)[1]
    assert set(EDGE_MODULES) - reached == {"healthcheck", "split_graph"}  # run as processes
    # the decoder child runs as a process too; the agent imports its framing from it


@pytest.mark.parametrize("module", sorted(OTA_ALLOWED))
def test_operator_tools_import_only_what_they_are_allowed(module: str) -> None:
    external, internal = imports_of(OTA / f"{module}.py", "ota")
    assert internal <= OTA_ALLOWED[module], internal - OTA_ALLOWED[module]
    assert not external & RUNTIME, external & RUNTIME


@pytest.mark.parametrize("module", sorted(TIERS_ALLOWED))
def test_model_tiers_import_only_what_they_are_allowed(module: str) -> None:
    _, internal = imports_of(TIERS / f"{module}.py", "tiers")
    assert internal <= TIERS_ALLOWED[module], internal - TIERS_ALLOWED[module]
