"""The shape of the code: a pure core, edges that do not know each other, one composition root;
and operator tools that never load the agent's runtime.

The folders of `agent/` are the layers: the pure ones (`core`, `formats`, `protocol`, `settings`),
the edges (one folder per outside thing), the guarded helpers, and the composition at the top.
A module is placed by the folder it is in; a new folder fails this test until it is given a
layer. Every module of `ota/` and `tiers/` is listed with the modules it may import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"
OTA = ROOT / "ota"
PACKAGES = ("agent", "ota", "tiers")

PURE: dict[str, set[str]] = {
    "core": {"core", "formats"},
    "formats": {"formats", "core"},
    "protocol": {"protocol", "core", "formats", "settings"},
    "settings": {"core"},
}
"""The pure folders (no I/O, no clock, no threads) and the folders each may import: the core's
decisions, data formats, the wire protocol, the config's declarations."""
PURE_EXTERNAL = {
    "__future__", "collections", "dataclasses", "datetime", "enum", "html", "io", "json",
    "math", "re", "typing", "unicodedata", "wave", "base64", "binascii", "hashlib",
    "contextlib", "array", "struct",
}  # fmt: skip
"""Standard modules without I/O, clocks or threads."""
PURE_LIBRARIES = {"settings.declarations": {"ipaddress", "pathlib"}}
PURE_LIBRARIES |= {"core.egress": {"ipaddress", "socket", "urllib"}}
PURE_LIBRARIES |= {"protocol.manifest": {"cryptography"}, "formats.pcm": {"numpy"}}
PURE_LIBRARIES |= {"formats.ssml": {"decimal", "defusedxml", "num2words", "xml"}}
PURE_LIBRARIES |= {"formats.media": {"numpy", "soundfile", "soxr"}}
PURE_LIBRARIES |= {"protocol.sparkplug_schema": {"google"}}
"""Further imports of particular pure modules: paths as values for the config's declarations
(the loader looks at the disk), address parsing for the egress policy (`socket.inet_aton` only,
no I/O), Ed25519 for manifests, numpy for audio data, a hardened XML parser and number words for
SSML, decoders and a resampler for audio bytes (`media` never opens a file: the chimes' loader
reads one, the decoder child is given bytes), protobuf for the Sparkplug B payloads."""

EDGES = {"speech", "audio", "link", "storage", "updates", "system", "loop"}
"""The edges, a folder each, by the outside thing they own: each may import pure folders, the
guarded helpers and its own folder, never another edge."""
OWNED = {"onnxruntime": "speech", "onnx": "speech", "piper": "speech", "alsaaudio": "audio"}
OWNED |= {"paho": "link", "sqlite3": "storage", "zeroconf": "link", "ifaddr": "link"}
"""Outside things only their edge imports."""
SHARED = {"guarded"}
"""Client libraries of our own that own no outside thing (no state, no thread): HTTP within the
egress policy, files opened without following links; any edge may use them."""
ROOTS = {"app", "assembly", "execution", "fact_sheet", "housekeeping", "voices", "__main__"}
ROOTS |= {"sparkplug_node", "wyoming_service", "default_voice"}
ROOTS |= {"__init__", "settings.loading", "speaker_link", "sounder_duty"}
"""The composition (the modules at the top of `agent/`, the sounder's in `agent/sounder/`, and
the config's loader): may import anything; nothing imports them (but `__main__`, the modules
it runs)."""
ENGINE_ONLY = {"numpy", "onnxruntime", "onnx", "piper", "soundfile", "soxr", "zeroconf"}
"""What the sounder's process never loads: the engine's libraries (its start and its alarm
lane owe nothing to them)."""
RUN_AS_PROCESSES = {"speech.healthcheck", "speech.split_graph", "speech.stream_graph"}
"""Edge modules the agent starts as processes of their own (or that only they import: the
streaming decoder's graph surgery, part of the build's `split_graph` process), never imports."""

OTA_ALLOWED = {
    "__init__": set(),
    "__main__": {
        "agent.core.refusal",
        "agent.protocol.manifest",
        "ota.connection",
        "ota.fleet",
        "ota.inventory",
        "ota.release",
    }
    | {"ota.rollout", "ota.rollout_report", "ota.rollout_state", "ota.safe_text", "ota.status"},
    "connection": set(),
    "fleet": {"agent.core.states", "ota.connection", "ota.inventory", "ota.node_messages"}
    | {"ota.safe_text"},
    "inventory": {"ota.node_messages", "ota.safe_text"},
    "node_messages": {"agent.core.states", "ota.safe_text"},
    "release": {"agent.protocol.manifest"},
    "rollout": {"agent.protocol.manifest", "agent.core.states", "ota.fleet", "ota.inventory"}
    | {"ota.rollout_state", "ota.safe_text", "ota.waves"},
    "rollout_report": {"agent.core.states", "ota.inventory", "ota.rollout_state", "ota.safe_text"},
    "rollout_state": set(),
    "safe_text": set(),
    "status": {"ota.connection", "ota.fleet", "ota.inventory", "ota.safe_text"},
    "waves": {"agent.core.states"},
}
"""The operator's tools and what they may import: never ONNX Runtime (offers, rollouts and
releases run on an operator's machine without it)."""
TIERS = ROOT / "tiers"
TIERS_ALLOWED = {
    "__init__": set(),
    "audio_distance": set(),
    "variants": set(),
    "quantize": {
        "agent.core.tiers",
        "agent.speech.voice",
        "tiers.audio_distance",
        "tiers.variants",
    },
    "auto": {
        "agent.speech.voice",
        "agent.system.allocator",
        "tiers.quantize",
        "tiers.recipes",
        "tiers.selective",
        "tiers.variants",
    },
    "selective": {"tiers.audio_distance", "tiers.variants"},
    "recipes": set(),
    "__main__": {
        "agent.core.tiers",
        "agent.speech.voice",
        "tiers.auto",
        "tiers.quantize",
        "tiers.recipes",
        "tiers.selective",
        "tiers.variants",
    },
}
"""The model tiers (the quantizer, which builds and synthesizes voice variants) and what they
may import: never the operator's tool."""
RUNTIME = {"onnxruntime", "onnx", "piper", "alsaaudio"}


def agent_modules() -> set[str]:
    """Every module of `agent/`: `name` at the top, `folder.name` below it."""
    return {
        ".".join(path.relative_to(AGENT).with_suffix("").parts)
        for path in AGENT.rglob("*.py")
        if "__pycache__" not in path.parts
    }


MODULES = agent_modules()
SOUNDER = {m for m in MODULES if m.startswith("sounder.")}
ROOTS |= SOUNDER


def folder_of(module: str) -> str:
    return module.split(".", maxsplit=1)[0] if "." in module else ""


def imports_of(path: Path, package: str) -> tuple[set[str], set[str]]:
    """(top-level external modules, `agent.x`, `ota.x` and `tiers.x` modules) imported by one
    file of `package`; a module of a subpackage of `agent` is named to its file
    (`agent.core.messages`)."""
    external: set[str] = set()
    internal: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = f"{package}.{node.module}" if node.level and node.module else node.module
            base = base or package  # `from . import x`
            names = [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] not in PACKAGES:
                external.add(parts[0])
            elif parts[0] == "agent":  # the longest prefix that is a module, else the package's
                prefixes = (".".join(parts[1:n]) for n in range(len(parts), 1, -1))
                internal.add(f"agent.{next((m for m in prefixes if m in MODULES), '__init__')}")
            else:
                internal.add(".".join(parts[:2]))
    return external, internal


def agent_imports(module: str) -> tuple[set[str], set[str]]:
    path = AGENT.joinpath(*module.split(".")).with_suffix(".py")
    external, internal = imports_of(path, "agent")
    return external, {name.removeprefix("agent.") for name in internal}


def test_every_module_is_placed_in_a_layer() -> None:
    folders = set(PURE) | EDGES | SHARED
    placed = {m for m in MODULES if folder_of(m) in folders or m in ROOTS}
    assert placed == MODULES, MODULES - placed
    # one level of folders; the link's by protocol (mqtt, sparkplug, wyoming) one more
    assert all(m.count(".") <= (2 if m.startswith("link.") else 1) for m in MODULES)
    assert {path.stem for path in OTA.glob("*.py")} == set(OTA_ALLOWED)
    assert {path.stem for path in TIERS.glob("*.py")} == set(TIERS_ALLOWED)


@pytest.mark.parametrize("module", sorted(MODULES - ROOTS))
def test_modules_import_only_what_their_layer_allows(module: str) -> None:
    external, internal = agent_imports(module)
    folder = folder_of(module)
    if folder in PURE:
        allowed = PURE[folder]
        libraries = PURE_EXTERNAL | PURE_LIBRARIES.get(module, set())
        assert not external - libraries, external - libraries
    elif folder in SHARED:
        allowed = set(PURE) | SHARED
    else:
        allowed = set(PURE) | SHARED | {folder}
    outside = {m for m in internal if folder_of(m) not in allowed or m in ROOTS}
    assert not outside, f"{module} imports {outside}"
    owned = {lib for lib in external if OWNED.get(lib, folder) != folder}
    assert not owned, f"{module} imports {owned}, owned by another edge"


def test_the_layer_rules_live_here_alone() -> None:
    """A module's docstring says what it holds; what it may import is this test's (issue 23:
    five docstrings' lists had drifted from the code)."""
    listing = [
        path.relative_to(ROOT).as_posix()
        for path in [*AGENT.rglob("*.py"), *OTA.glob("*.py"), *TIERS.glob("*.py")]
        if "allowed imports"
        in " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split()).lower()
    ]
    assert not listing, listing


def test_no_module_imports_itself_round_a_cycle() -> None:
    graph = {module: agent_imports(module)[1] - {"version"} for module in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module not in done:
            for imported in graph.get(module, set()):
                visit(imported, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_only_the_composition_imports_the_composition() -> None:
    for module in MODULES - ROOTS:
        assert not agent_imports(module)[1] & ROOTS, module
    _, main = agent_imports("__main__")
    allowed = {"app", "voices", "settings.loading", "__init__", "sounder.main"}
    assert main & ROOTS <= allowed | {"sounder.engine_process", "sounder.deferred_imports"}


@pytest.mark.parametrize("module", sorted(SOUNDER))
def test_the_sounder_imports_nothing_of_the_engine(module: str) -> None:
    """The sounder's modules reach neither the speech edge nor the engine's composition."""
    external, internal = agent_imports(module)
    engine = {m for m in internal if folder_of(m) == "speech" or (m in ROOTS and m not in SOUNDER)}
    assert not engine - {"settings.loading"}, f"{module} imports {engine}"
    assert not external & ENGINE_ONLY, external & ENGINE_ONLY


def test_the_sounders_process_starts_without_the_engines_libraries() -> None:
    """What `voice-agent run` imports before its alarm lane serves: no numpy, no ONNX Runtime,
    no espeak-ng (as the process loads them, not as the source reads)."""
    code = (
        "import sys, agent.__main__, agent.sounder.main; "
        f"print(sorted(set({sorted(ENGINE_ONLY)!r}) & {{m.split('.')[0] for m in sys.modules}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_composition_root_wires_every_edge() -> None:
    reached: set[str] = set()
    todo = ["__main__"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += agent_imports(module)[1] & MODULES
    edges = {m for m in MODULES if folder_of(m) in EDGES | SHARED and not m.endswith("__init__")}
    assert edges - reached == RUN_AS_PROCESSES
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


def test_no_class_has_more_than_20_methods() -> None:
    """Small classes whose names say what they hold (the developers' guide): the core, the loop,
    the protocol and the engine's loop and wiring (`App`, `assemble`) first."""
    paths = [*(AGENT / "core").glob("*.py"), *(AGENT / "loop").glob("*.py")]
    paths += [*(AGENT / "protocol").glob("*.py"), AGENT / "app.py", AGENT / "assembly.py"]
    paths += [AGENT / "default_voice.py"]
    large = {
        f"{path.relative_to(ROOT)}:{node.name}": count
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and (count := sum(isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for f in node.body))
        > 20
    }
    assert not large, large
