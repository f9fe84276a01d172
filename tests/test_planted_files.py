"""Planted files (issue 34, "Files"): every file the node keeps in its directories
(`tests/hostile.py`'s NODE_FILES: the journal and its companions, the step marker, the update
state, slots and staged downloads, the phrase cache, the optimized-model cache) replaced by each
kind of hostile file (PLANTED_KINDS: a link out of the directory, a link to a FIFO, a FIFO, a
directory, a device, a huge sparse file, a truncated one, garbage), through the real agent.

Each case starts from the files of a node that ran once (the seed: it spoke, rendered its
pinned phrase, optimized its voice and had an update installed in slot a), plants, starts the
agent and checks that it starts and serves, says so in its state's `storage` when a file was no
regular one, speaks a control message sent with `mosquitto_pub` (heard in the ALSA capture),
and that nothing outside its storage and cache directories changed (the files links point to,
the configured voice). `make test` plants each kind at every file at once; the matrix of each
file alone with each kind is `slow`."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.updates.update_store import UpdateState, save_state
from harness.agent import AgentProcess, agent_config, write_config
from harness.broker import Broker
from harness.mqtt import Watcher, publish
from harness.wait import wait_until
from tests import hostile
from tests.conftest import RunningAgent, StartAgent
from tests.hostile import NODE_FILES, NOT_REGULAR, PLANTED_KINDS, NodeFile
from tests.test_hostile_files import audible, storage_state

NODE = "planted"
PHRASE = "Fire in hall two."


@dataclass(frozen=True)
class Seed:
    """The directories of a node that ran once, and what its config names."""

    root: Path
    voice: Path
    key: str
    """The trusted public key (base64): the agent reads its update state and slots."""

    def sections(self, cache: Path) -> dict[str, dict[str, Any]]:
        return {
            "cache": {"dir": str(cache), "phrases": [PHRASE]},
            "ota": {"trusted_keys": [self.key]},
        }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _install_slot(ota: Path, voice: Path) -> None:
    """An update directory as the updater leaves it: release 1 in slot a (the tiny voice's
    files, with their digests in the state), a staged download and a partial one."""
    slot = ota / "slots" / "a"
    slot.mkdir(parents=True)
    for source in (voice, voice.with_name(voice.name + ".json")):
        shutil.copyfile(source, slot / f"tiny{''.join(source.suffixes)}")
    files = {p.name: _digest(p) for p in slot.iterdir()}
    state = UpdateState(release=1, version="1.0", active="a", model="tiny.onnx", files=files)
    state.model_sha256 = files["tiny.onnx"]
    save_state(ota, state)
    (ota / "staging").mkdir()
    (ota / "staging" / ("0" * 64)).write_bytes(b"a staged download" * 100)
    (ota / "staging" / ("1" * 64 + ".part")).write_bytes(b"half a download" * 50)


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory, tiny_voice: Path) -> Seed:
    """A node that ran once: spoke, rendered its pinned phrase into the phrase cache, optimized
    its voice, from release 1 in slot a."""
    root = tmp_path_factory.mktemp("seed")
    public = Ed25519PrivateKey.generate().public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    made = Seed(root, tiny_voice, base64.b64encode(raw).decode())
    _install_slot(root / "storage" / "ota" / NODE, tiny_voice)
    broker = Broker(root / "broker")
    broker.start()
    watcher = Watcher(broker, f"voice/{NODE}/#")
    sections = made.sections(root / "cache")
    config = agent_config(
        broker, root, NODE, voice=tiny_voice, cache=sections["cache"], ota=sections["ota"]
    )
    config["tts"]["tier"] = "fp32"
    agent = AgentProcess(write_config(root / "seed.yaml", config), root / "seed.log")
    try:
        agent.start()
        wait_until(lambda: any(m.payload == b"online" for m in watcher.snapshot()), what="online")
        publish(broker, f"voice/{NODE}/speak", json.dumps({"id": "s", "text": PHRASE}).encode())
        watcher.wait_event("s", "finished")
        kit = root / "cache" / "sounder"

        def kept() -> bool:  # the sounder keeps the pinned phrase the engine rendered
            index = kit / "index.json"
            return index.is_file() and PHRASE.encode() in index.read_bytes()

        wait_until(kept, what="the sounder's kit kept")
        agent.signal(15)
        wait_until(lambda: not agent.alive(), what="the seed agent to stop")
    finally:
        if agent.alive():
            agent.signal(9)
        watcher.close()
        broker.stop()
    assert list((root / "cache" / "phrases").glob("*/*.pcm")), agent.output()
    assert list((root / "cache" / "models").glob("*.onnx.seal")), agent.output()
    assert list((root / "cache" / "sounder").glob("*.pcm")), agent.output()
    return made


def paths(file: NodeFile, storage: Path, cache: Path) -> list[Path]:
    """Where `file` is in these directories (each match of its pattern; its own path when the
    node has not made it)."""
    base = {"storage": storage, "cache": cache, "ota": storage / "ota" / NODE}[file.where]
    pattern = file.pattern.format(node=NODE)
    found = sorted(base.glob(pattern))
    if not found and not file.seeded:
        return [base / pattern]
    assert found, f"the seed has no {file.what} ({pattern})"
    return found


def start_planted(
    start_agent: StartAgent, seed: Seed, tmp_path: Path, planted: list[tuple[NodeFile, str]]
) -> RunningAgent:
    """Copy the seed's directories, plant, start the agent on them; then check that it serves
    and speaks, and that nothing outside its directories changed."""
    storage, cache, outside = tmp_path / "storage", tmp_path / "own-cache", tmp_path / "outside"
    shutil.copytree(seed.root / "storage", storage, symlinks=True)
    shutil.copytree(seed.root / "cache", cache, symlinks=True)
    hostile.outside_files(outside)
    for n, (file, kind) in enumerate(planted):
        for path in paths(file, storage, cache):
            hostile.plant(path, kind, outside, seed=n)
    voice_before = hostile.tree(seed.voice.parent)
    before = hostile.tree(tmp_path, [storage, cache, tmp_path / "broker"])
    started = time.monotonic()
    agent = start_agent(voice=seed.voice, node_id=NODE, sections=seed.sections(cache))
    online = time.monotonic() - started
    request = json.dumps({"id": "control", "text": "The node still speaks."}).encode()
    publish(agent.watcher.broker, agent.topics.speak, request)  # the real mosquitto_pub
    agent.watcher.wait_event("control", "finished")
    wait_until(lambda: audible(agent.capture), what="the control message heard")
    run_files = [agent.capture, agent.process.log, agent.process.config]
    after = hostile.tree(tmp_path, [storage, cache, tmp_path / "broker", *run_files])
    assert after == before, "something outside the node's directories changed"
    assert hostile.tree(seed.voice.parent) == voice_before
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS
    print(f"online {online:.1f} s; storage: {storage_state(agent)}")
    return agent


def noted(agent: RunningAgent) -> str:
    """The state's `storage` once it says something other than ok."""
    wait_until(lambda: storage_state(agent) not in ("", "ok"), what="the state's storage note")
    return storage_state(agent)


UPDATE_REASONS = {"unsafe_file", "damaged", "state_damaged"}


def said_so(agent: RunningAgent, file: NodeFile) -> None:
    """Wait until the node said that it found `file` planted, where it says so (`said`)."""
    if file.said == "state":
        noted(agent)
    elif file.said == "events":

        def reported() -> bool:
            events = agent.watcher.events()
            return any(
                e.get("event") == "update" and e.get("reason") in UPDATE_REASONS for e in events
            )

        wait_until(reported, what="the updater's event")
    elif file.said == "log":
        lines = agent.process.output().splitlines()
        assert [line for line in lines if " WARNING " in line or " ERROR " in line], lines[-20:]


ALLOWED_ERRORS = (
    r"journal \S+ unreadable \(.*\); moved to ",
    r"state\.json.*: set aside, the configured model speaks$",
    r"Release 1 cannot be used \(damaged\)",
    r"Removed \S+ was .* \(never followed\)$",
)


@pytest.mark.allow_error_logs(*ALLOWED_ERRORS)
@pytest.mark.parametrize("kind", PLANTED_KINDS)
def test_each_kind_planted_at_every_file_at_once_never_stops_the_node(
    start_agent: StartAgent, seed: Seed, tmp_path: Path, kind: str
) -> None:
    """Every file of the node replaced by `kind` at once: the node starts, serves, speaks, and
    touches nothing outside its directories; a file that is no regular one is in the state."""
    agent = start_planted(start_agent, seed, tmp_path, [(f, kind) for f in NODE_FILES])
    if kind in NOT_REGULAR:
        assert noted(agent)


@pytest.mark.slow
@pytest.mark.allow_error_logs(*ALLOWED_ERRORS)
@pytest.mark.parametrize("kind", PLANTED_KINDS)
@pytest.mark.parametrize("file", NODE_FILES, ids=lambda f: f.pattern)
def test_each_file_of_the_node_planted_with_each_kind(
    start_agent: StartAgent, seed: Seed, tmp_path: Path, file: NodeFile, kind: str
) -> None:
    """The matrix: one file, one kind at a time (NODE_FILES x PLANTED_KINDS)."""
    agent = start_planted(start_agent, seed, tmp_path, [(file, kind)])
    if kind in NOT_REGULAR:
        said_so(agent, file)
