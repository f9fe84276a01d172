"""Memory budgets held by the kernel (`make test-small`): the real agent (bundled voice, ALSA
`null`, the environment its systemd unit gives it, an empty model cache as on a new node) runs
in a cgroup v1 memory group with a limit and no swap, under tests/soak.py's steady mix of cached
and uncached announcements and the longest request `speak.max_audio_seconds` allows. The whole
life of a node adds a signed model update over the air (download, the health check, a child of
the agent and so in the group too, the switch), speech with the new model, a rollback and
speech again. Whatever does not fit is OOM-killed by the kernel. Each test prints, phase by
phase, the group's peak (`memory.max_usage_in_bytes`: anonymous memory and page cache), the
peak of anonymous memory (sampled), the page cache, `memory.failcnt` and the processes seen in
the group. Needs root and the cgroup v1 memory controller: without them the tests fail, they
never skip."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import onnx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.core.messages import FINAL_EVENTS
from agent.core.states import FINAL_PHASES
from agent.protocol.topics import Topics
from agent.settings.declarations import SpeakConfig
from agent.speech.voice import bundled_voice
from harness import (
    AgentProcess,
    Broker,
    MemoryCgroup,
    MemoryReading,
    Watcher,
    agent_config,
    drop_page_cache,
    wait_until,
    write_config,
)
from harness.cgroup import MIB
from ota import release
from tests.release_server import ReleaseServer
from tests.soak import CACHED
from tests.test_systemd import unit_settings

pytestmark = [pytest.mark.small, pytest.mark.broker, pytest.mark.voice]

STEADY_BUDGET_MB: Final = 256
"""Steady work: start, the mix, the longest request (MiB)."""
LIFE_BUDGET_MB: Final = 384
"""The whole life of a node: steady work, an update with its health check, a rollback (MiB)."""
MIX_MINUTES: Final = float(os.environ.get("SMALL_MIX_MINUTES", "3"))
"""Minutes of the steady mix in each test (environment variable `SMALL_MIX_MINUTES`)."""
PAUSE_SECONDS: Final = 0.25
"""From one announcement's end to the next one's publication (tests/soak.py's pace)."""
SAMPLE_SECONDS: Final = 0.05
"""How often the group's anonymous memory and processes are sampled (seconds)."""
START_TIMEOUT: Final = 600.0
"""Spawn to `online` (seconds): a new node builds its voice's split parts first."""
LONG_TIMEOUT: Final = 600.0
"""The longest request, synthesized to a device that takes audio as fast as it comes (s)."""
UPDATE_TIMEOUT: Final = 1800.0
"""An offer to its result: 63 MB downloaded, the health check, the new model loaded (s)."""
SAY_TIMEOUT: Final = 120.0
"""One announcement of the mix, publication to `finished` (seconds)."""
MAX_AUDIO_SECONDS: Final = SpeakConfig().max_audio_seconds
"""The longest speech of one request the agent accepts by default (seconds)."""
NODE: Final = "small"
PLACES: Final = (
    "north wing",
    "south wing",
    "east stairwell",
    "west lobby",
    "main hall",
    "library",
    "canteen",
    "workshop",
)
EXITS: Final = ("front door", "loading bay", "garden gate", "car park ramp", "fire escape")


@dataclass(frozen=True)
class Phase:
    """What the kernel counted during one phase of a run."""

    name: str
    seconds: float
    peak_mb: float
    """`memory.max_usage_in_bytes` during the phase: anonymous memory and page cache."""
    anon_peak_mb: float
    """The largest anonymous memory (`rss` of memory.stat) sampled during the phase."""
    cache_mb: float
    """Page cache charged to the group at the phase's end."""
    failcnt: int
    """Charges that hit the limit during the phase."""
    processes: tuple[str, ...]
    """What ran in the group during the phase (module or program names)."""


class Meter:
    """The group's counters phase by phase: the kernel's peak (reset at each phase's end) and a
    sampler of anonymous memory and of the processes in the group."""

    def __init__(self, group: MemoryCgroup) -> None:
        self.group = group
        self.phases: list[Phase] = []
        self._lock = threading.Lock()
        self._anon_peak = 0
        self._seen: set[str] = set()
        self._began = time.monotonic()
        self._failcnt = group.read().failcnt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            rss = self.group.read().rss
            names = {_program(pid) for pid in self.group.pids()}
            with self._lock:
                self._anon_peak = max(self._anon_peak, rss)
                self._seen |= names - {""}

    def end_phase(self, name: str) -> Phase:
        """Close the running phase under `name` and start the next."""
        reading = self.group.read()
        self.group.reset_peak()
        with self._lock:
            phase = Phase(
                name,
                round(time.monotonic() - self._began, 1),
                round(reading.max_usage / MIB, 1),
                round(max(self._anon_peak, reading.rss) / MIB, 1),
                round(reading.cache / MIB, 1),
                reading.failcnt - self._failcnt,
                tuple(sorted(self._seen)),
            )
            self._anon_peak, self._seen = reading.rss, set()
        self._began, self._failcnt = time.monotonic(), reading.failcnt
        self.phases.append(phase)
        return phase

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()

    def report(self, title: str, final: MemoryReading) -> str:
        """The phases as a table, and the totals."""
        lines = [
            f"{title}: limit {self.group.limit_bytes / MIB:g} MiB",
            "| phase | s | peak MiB (max_usage) | anon peak MiB | cache MiB | failcnt | in group |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {p.name} | {p.seconds} | {p.peak_mb} | {p.anon_peak_mb} | {p.cache_mb} "
            f"| {p.failcnt} | {', '.join(p.processes)} |"
            for p in self.phases
        ]
        peak = max((p.peak_mb for p in self.phases), default=0.0)
        where = [p.name for p in self.phases if p.peak_mb == peak]
        lines.append(
            f"max_usage_in_bytes {peak} MiB (in: {', '.join(where)}); failcnt "
            f"{final.failcnt}; OOM kills {final.oom_kills}"
        )
        return "\n".join(lines)


def _program(pid: int) -> str:
    """A process's module (`python -m NAME`) or program name; "" once it has exited."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    words = [a.decode(errors="replace") for a in argv if a]
    if "-m" not in words[:-1]:
        return Path(words[0]).name if words else ""
    module, *rest = words[words.index("-m") + 1 :]
    return f"{module} {rest[0]}" if rest and rest[0].isalpha() else module  # `agent run`


@dataclass
class Node:
    """The agent in its group, a client that talks to it, and what was said."""

    agent: AgentProcess
    watcher: Watcher
    group: MemoryCgroup
    meter: Meter
    topics: Topics = field(default_factory=lambda: Topics("voice", NODE))
    counter: Iterator[int] = field(default_factory=itertools.count)
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)

    def alive(self) -> None:
        """Fail with what the kernel counted when the agent has exited."""
        if self.agent.alive():
            return
        code = self.agent.signal(signal.SIGTERM)
        raise AssertionError(
            f"the agent exited ({code}): {self.group.read()}\n{self.agent.output()[-3000:]}"
        )

    def wait(self, what: str, condition: Callable[[], object], timeout: float) -> None:
        """Wait for a condition; fail at once if the agent exits meanwhile."""
        wait_until(lambda: bool(condition()) or not self.agent.alive(), timeout, what)
        self.alive()

    def say(self, request_id: str, text: str, timeout: float = SAY_TIMEOUT) -> dict[str, Any]:
        """Publish one announcement and wait for its end, which must be `finished`."""
        end = self.outcome(request_id, text, timeout)
        assert end["event"] == "finished", end
        self.finished[request_id] = end
        return end

    def outcome(self, request_id: str, text: str, timeout: float) -> dict[str, Any]:
        """Publish one announcement; the event that ended it."""
        payload = json.dumps({"id": request_id, "text": text}).encode()
        self.watcher.publish(self.topics.speak, payload)
        self.wait(request_id, lambda: self._ends(request_id), timeout)
        return self._ends(request_id)[0]

    def _ends(self, request_id: str) -> list[dict[str, Any]]:
        return [e for e in self.watcher.events(request_id) if e["event"] in FINAL_EVENTS]

    def mix(self, seconds: float) -> int:
        """tests/soak.py's mix for `seconds`: one at a time, every third uncached."""
        began, said = time.monotonic(), 0
        while time.monotonic() - began < seconds:
            n = next(self.counter)
            text = f"Update {n}: all is well." if n % 3 == 0 else CACHED[n % 3]
            self.say(f"mix-{n}", text)
            self.watcher.clear()  # bounded memory for the test too, as the soak's
            said += 1
            time.sleep(PAUSE_SECONDS)  # pace, as the soak's; the wait above synchronises
        return said

    def longest(self) -> dict[str, Any]:
        """The longest request allowed, found by the agent's own estimate: notices of fewer and
        fewer distinct sentences (none in the phrase cache) until one is not `too_long`; it
        must then be spoken whole. Refused requests cost no synthesis."""
        sentences = notice()
        refused = 0
        for count in range(len(sentences), 0, -1):
            request_id = f"longest-{count}"
            end = self.outcome(request_id, " ".join(sentences[:count]), LONG_TIMEOUT)
            if end["event"] == "rejected" and end.get("reason") == "too_long":
                refused += 1
                continue
            assert refused, f"all {len(sentences)} sentences fit: the notice is too short"
            assert end["event"] == "finished", end
            self.finished[request_id] = end
            return end
        raise AssertionError("even one sentence is too long")

    def state(self) -> dict[str, Any]:
        """The latest state seen since the watcher was last cleared ({} if none)."""
        states = [m.json() for m in self.watcher.snapshot() if m.topic == self.topics.state]
        return states[-1] if states else {}

    def stop(self) -> int:
        """SIGTERM; the exit code."""
        return self.agent.signal(signal.SIGTERM)


def notice() -> list[str]:
    """Distinct sentences of an evacuation notice, together well beyond the longest allowed."""
    return [
        f"Everyone in the {place}, level {level}, please walk calmly to the {way} and wait "
        f"there for the wardens."
        for level, (place, way) in enumerate(itertools.product(PLACES, EXITS), 1)
    ]


def sha256(path: Path) -> str:
    """The file's sha256."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


StartNode = Callable[..., Node]
"""`run_node(budget_mb, title, ota=None)`: the agent started in a group of that budget."""


def unit_environment() -> dict[str, str]:
    """The environment the systemd unit gives the agent (`MALLOC_ARENA_MAX`...)."""
    return dict(value.split("=", 1) for value in unit_settings().get("Environment", []))


@pytest.fixture
def run_node(broker: Broker, tmp_path: Path) -> Iterator[StartNode]:
    """Start the agent in a new memory group of the given budget; yields a starter. At the
    end: the agent stopped, the table printed, the group removed."""
    started: list[tuple[Node, str]] = []

    def start(budget_mb: int, title: str, ota: dict[str, Any] | None = None) -> Node:
        config = agent_config(broker, tmp_path, NODE, ota=ota or {})
        path = write_config(tmp_path / "agent.yaml", config)
        agent = AgentProcess(path, tmp_path / "agent.log", unit_environment())
        watcher = Watcher(broker, f"voice/{NODE}/#")
        model = bundled_voice()
        for file in (model, Path(f"{model}.json")):  # charged to the group that reads it next
            drop_page_cache(file)
        group = MemoryCgroup(f"voice-agent-small-{os.getpid()}-{budget_mb}", budget_mb * MIB)
        node = Node(agent, watcher, group, Meter(group))
        started.append((node, title))  # from here the teardown removes the group
        with group.spawn_inside():
            agent.start()
        status = node.topics.status

        def online() -> bool:
            statuses = [m.payload for m in watcher.snapshot() if m.topic == status]
            return statuses[-1:] == [b"online"]

        node.wait("online", online, START_TIMEOUT)
        node.meter.end_phase("start: spawn to online")
        return node

    yield start
    for node, title in started:
        if node.agent.alive():
            node.stop()
        if not node.meter.phases or node.meter.phases[-1].name != "stop":
            node.meter.end_phase("unfinished: the test stopped here")
        node.meter.stop()
        node.watcher.close()
        print("\n" + node.meter.report(title, node.group.read()))
        node.group.close()


def steady_work(node: Node) -> None:
    """Half the mix, the longest request, the other half; each a phase."""
    said = node.mix(MIX_MINUTES * 30)
    node.meter.end_phase(f"mix ({said} announcements)")
    longest = node.longest()
    print(
        f"\nlongest request: {longest['audio_seconds']} s of audio, {longest['sentences']} "
        f"sentences (at most {MAX_AUDIO_SECONDS:g} s estimated)"
    )
    assert longest["audio_seconds"] > MAX_AUDIO_SECONDS / 2, longest
    node.meter.end_phase("longest request")
    said = node.mix(MIX_MINUTES * 30)
    node.meter.end_phase(f"mix ({said} announcements)")


def judge(node: Node) -> None:
    """Alive, stopped cleanly, nothing OOM-killed, every announcement finished, no error."""
    node.alive()
    code = node.stop()
    node.meter.end_phase("stop")
    final = node.group.read()
    counts = f"failcnt {final.failcnt}, OOM kills {final.oom_kills}"
    print(f"\n{len(node.finished)} announcements finished; {counts}")
    assert final.oom_kills == 0, f"OOM kills: {final.oom_kills} (None: the kernel counts none)"
    assert final.swap == 0, final
    assert code == 0, node.agent.output()[-3000:]
    errors = [line for line in node.agent.output().splitlines() if " ERROR " in line]
    assert not errors, errors


def test_steady_work_fits_in_256_mb(run_node: StartNode) -> None:
    """Start, the mix and the longest request within 256 MiB: every announcement finished,
    nothing OOM-killed."""
    node = run_node(STEADY_BUDGET_MB, "steady work")
    steady_work(node)
    judge(node)


def rereleased_voice(directory: Path, number: int) -> Path:
    """The bundled voice as release `number`: the same weights with the release in its metadata,
    so the file and its digest are its own and no cache keyed by digest holds it (the node
    takes it as it would a different voice of the same size)."""
    model = onnx.load(str(bundled_voice()))
    model.metadata_props.add(key="release", value=str(number))
    directory.mkdir(parents=True)
    path = directory / bundled_voice().name
    onnx.save(model, str(path))
    shutil.copy(f"{bundled_voice()}.json", f"{path}.json")
    return path


def update_result(node: Node, offer_id: str, timeout: float) -> dict[str, Any]:
    """Wait for the final `update` event of an offer or command."""

    def finals() -> list[dict[str, Any]]:
        events = node.watcher.events(offer_id)
        return [e for e in events if e["event"] == "update" and e["state"] in FINAL_PHASES]

    node.wait(f"the result of {offer_id}", finals, timeout)
    return finals()[-1]


def speaks_with(node: Node, digest: str, release_number: int, label: str) -> None:
    """A few announcements (cached and uncached) finish, and the state names the model."""
    for text in (f"The {label} model is speaking now.", CACHED[1], CACHED[2]):
        node.say(f"{label}-{next(node.counter)}", text)
    node.wait(
        f"the state to show the {label} model",
        lambda: (
            (node.state().get("model_sha256"), node.state().get("model_release"))
            == (digest, release_number)
        ),
        SAY_TIMEOUT,
    )


def test_the_whole_life_of_a_node_fits_in_384_mb(run_node: StartNode, tmp_path: Path) -> None:
    """Steady work, then a signed update (download, health check in the group, switch),
    speech with the new model, a rollback and speech again, within 384 MiB: nothing
    OOM-killed, every announcement finished, each model spoke."""
    key = Ed25519PrivateKey.generate()
    server = ReleaseServer(tmp_path / "releases").start()
    try:
        model = rereleased_voice(tmp_path / "new-model", 1)
        new, old = sha256(model), sha256(bundled_voice())
        assert new != old
        envelope = release.sign(release.build_manifest(model, 1, "1.0"), [key])
        release.publish_release(server.directory / "r1", model, envelope)
        ota = {"trusted_keys": [release.public_text(key)], "health_timeout": 900}
        ota["hosts"] = [f"127.0.0.1:{server.port}"]  # the release server
        node = run_node(LIFE_BUDGET_MB, "the whole life of a node", ota)
        steady_work(node)

        offer = {"id": "up1", "manifest": json.loads(envelope), "base_url": f"{server.url}r1/"}
        node.watcher.publish(node.topics.ota, json.dumps(offer).encode())
        result = update_result(node, "up1", UPDATE_TIMEOUT)
        update = node.meter.end_phase("update: download, health check, switch")
        assert result["state"] == "installed", json.dumps(result)  # reason, detail: whole
        assert "agent.speech.healthcheck" in update.processes, update  # it ran in the group
        speaks_with(node, new, 1, "new")
        # the state is published on a change, gathered for 0.25 s: wait for the one that shows it
        wait_until(
            lambda: (node.state().get("last_update") or {}).get("state") == "installed",
            60,
            f"a state with the update installed (latest: {node.state()})",
        )
        node.meter.end_phase("speech, new model")

        node.watcher.publish(node.topics.ota, b'{"id": "back1", "rollback": true}')
        back = update_result(node, "back1", UPDATE_TIMEOUT)
        assert back["state"] == "rolled_back", json.dumps(back)
        node.meter.end_phase("rollback")
        speaks_with(node, old, 0, "old")
        node.meter.end_phase("speech, old model")
        judge(node)
    finally:
        server.stop()
