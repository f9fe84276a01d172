"""The acceptance test "a real clustered broker": the real agent (`python -m agent run`) on a
three-node RabbitMQ 3.10 cluster (harness/rabbitmq.py), `mqtt.hosts` listing the three nodes'
MQTT ports (node 1 first), `mqtt.protocol` at its default (`auto`), Sparkplug B on with a
primary host.

Two clusters, one per class:

- `TestPlantCluster`: the cluster as a plant sets it up for the agent, two lines of rabbitmq.conf
  over RabbitMQ's defaults. `mqtt.sparkplug = true`: without it the plugin gives the `.` of
  `spBv1.0` back as `/` (`TestDefaultCluster` shows it) and no Sparkplug message reaches a
  Sparkplug subscriber. `mqtt.durable_queue_type = quorum`: a persistent session's queue is a
  quorum queue, on every node, so the session survives the loss of the node it was made on.
  The primary host is connected to every node (as Ignition's MQTT Engine connects to every
  server of its list): RabbitMQ keeps retained messages per node, so the STATE a host
  published on one node is the retained STATE of that node only.
- `TestDefaultCluster`: RabbitMQ's defaults (classic queues). The persistent session (the
  agent's default: clean session off on 3.1.1) is a classic queue on the node it was made on:
  while that node is down every reconnect to another node is closed right after its SUBSCRIBE,
  so the agent cannot carry on through another node (a strict xfail shows it).

The failover tests publish a numbered sequence of speak messages (QoS 1, each with its own id)
from node 3 at a steady pace across the failover and count, per id, `finished` once, more than
once, never; each run prints its report (`pytest -rP` or `-s` shows it).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness import TIMEOUT, wait_until
from harness.cluster_agent import (
    QUIET,
    Client311,
    ClusterAgent,
    Connection,
    Sequence,
    Tally,
    address,
    configure,
    log_time,
    retained,
    start_cluster_agent,
    tally,
)
from harness.rabbitmq import RabbitCluster, RabbitNode
from harness.scada import Decoded, ScadaHost, metric
from ota import release, rollout_state
from tests.release_server import ReleaseServer
from tests.test_ota import make_release

pytestmark = [pytest.mark.plant, pytest.mark.xdist_group("rabbitmq")]

GROUP, DEVICE, HOST = "plant", "speaker", "scada-1"
SPARKPLUG_NAMESPACE: Final = "mqtt.sparkplug = true"
QUORUM_SESSIONS: Final = "mqtt.durable_queue_type = quorum"
PACE: Final = 0.25
"""Seconds between two speak messages of a sequence."""
OUTAGE: Final = 8.0
"""Seconds the sequence goes on after the agent's node went down (before it is started again)."""
FOLLOW: Final = 60.0
"""Upper bound for the agent to show up on another node, or to speak again, after a change."""

DEFAULT_SESSION: Final = (
    "RabbitMQ's default classic queues: the persistent session (clean session off) is a queue "
    "on the node it was made on; while that node is down a CONNECT elsewhere gets session "
    "present 0 and its SUBSCRIBE is closed at once (queue.declare: home node down), again and "
    "again; the messages published meanwhile are PUBACKed and lost. Needs the agent's change "
    "(report), or quorum session queues on the broker (TestPlantCluster)."
)
STAGED_ROLLOUT: Final = (
    "`ota rollout` learns the nodes from the retained status and state through `voice/+/status` "
    "and `voice/+/state`; RabbitMQ sends retained messages to exact-topic filters only: the node "
    "is unknown, counted offline, never offered, and the rollout says every wave passed (exit "
    "0). Needs the tool's change (report)."
)


def sparkplug_section(**extra: Any) -> dict[str, Any]:
    """The agent's Sparkplug edge node, waiting for the primary host."""
    return {"enabled": True, "group_id": GROUP, "primary_host_id": HOST, "keepalive": 5} | extra


# ---------------------------------------------------------------------------------------------
# Around the agent
# ---------------------------------------------------------------------------------------------


def wait_online(agent: ClusterAgent, watcher: Client311) -> None:
    """Wait until the agent's status `online` reached the watcher (live, on any node)."""

    def online() -> bool:
        mine = [m.payload for m in watcher.snapshot() if m.topic == agent.topics.status]
        return (bool(mine) and mine[-1] == b"online") or not agent.process.alive()

    wait_until(online, TIMEOUT, f"{agent.node_id} online")
    assert agent.process.alive(), agent.log()[-3000:]


def stop_agent(agent: ClusterAgent) -> list[str]:
    """SIGTERM it (if it runs); the ERROR lines of its log."""
    if agent.process.alive():
        agent.process.signal(signal.SIGTERM)
    return [line for line in agent.log().splitlines() if " ERROR " in line]


def speak(client: Client311, agent: ClusterAgent, request_id: str, text: str) -> None:
    """Publish a JSON speak for the agent from this client's node (QoS 1, PUBACKed)."""
    body = json.dumps({"id": request_id, "text": text}).encode()
    client.publish(agent.topics.speak, body)


def states(watcher: Client311, agent: ClusterAgent) -> list[dict[str, Any]]:
    """The agent's states the watcher saw, oldest first."""
    return [m.json() for m in watcher.snapshot() if m.topic == agent.topics.state]


@contextlib.contextmanager
def primary_hosts(nodes: list[RabbitNode], workdir: Path) -> Iterator[dict[int, ScadaHost]]:
    """The primary host application (`HOST`) on each of these nodes (its own client id and
    STATE there), by node index; stopped on the way out."""
    hosts: dict[int, ScadaHost] = {}
    tag = secrets.token_hex(3)
    try:
        for node in nodes:
            log = workdir / f"scada-{node.index}.log"
            client_id = f"scada-{node.index}-{tag}"
            hosts[node.index] = ScadaHost(
                node.host, node.mqtt_port, HOST, client_id=client_id, log=log
            )
            hosts[node.index].start()
        yield hosts
    finally:
        for host in hosts.values():
            if host.alive():
                host.stop()


def first_of(
    host: ScadaHost, edge: str, kind: str, since: int = 0, timeout: float = TIMEOUT
) -> Decoded:
    """The first message of this type from the edge node (from index `since`)."""
    return host.wait_for(
        lambda m: m["type"] == kind and m["edge"] == edge, f"{kind} of {edge}", timeout, since
    )


def born(host: ScadaHost, edge: str, since: int = 0) -> tuple[Decoded, Decoded]:
    """The next NBIRTH and the DBIRTH after it."""
    nbirth = first_of(host, edge, "NBIRTH", since)
    return nbirth, first_of(host, edge, "DBIRTH", host.messages().index(nbirth))


def settle(
    sequence: Sequence, watcher: Client311, since: float = 0.0, timeout: float = 30.0
) -> None:
    """Wait (at most `timeout` s) until every PUBACKed id of the sequence published from
    `since` on finished."""
    wanted = sequence.acknowledged() & set(sequence.ids(since))

    def done() -> bool:
        finished = {e.get("id") for e in watcher.events() if e.get("event") == "finished"}
        return wanted <= finished

    with contextlib.suppress(AssertionError):
        wait_until(done, timeout, "the acknowledged ids finished")


def lifetimes(agent: ClusterAgent, start: float, end: float) -> list[float]:
    """Seconds each connection of the sounder's link made between `start` and `end` lasted
    (from its `Connected to` line to the next `Disconnected from` line; the engine's lines,
    prefixed `engine`, are its own session's)."""
    lines = [
        line
        for line in agent.lines("agent.link.mqtt.link", start)
        if " engine agent.link" not in line
    ]
    found: list[float] = []
    opened: float | None = None
    for line in lines:
        at = log_time(line)
        if at >= end:
            break
        if "Connected to " in line:
            opened = at
        elif "Disconnected from the broker" in line and opened is not None:
            found.append(at - opened)
            opened = None
    return found


def ota_section(key: Ed25519PrivateKey) -> dict[str, Any]:
    """The agent config section that trusts `key` and the loopback release server."""
    return {
        "trusted_keys": [release.public_text(key)],
        "hosts": ["127.0.0.1:*"],
        "health_timeout": 60,
    }


def run_tool(nodes: list[RabbitNode], command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m ota COMMAND ...` as an operator runs it (harness.fleet_sim.tool), with one
    `--broker` per node, to its end."""
    brokers = [part for node in nodes for part in ("--broker", address(node))]
    line = [sys.executable, "-m", "ota", command, *args, *brokers]
    return subprocess.run(line, check=False, capture_output=True, text=True, timeout=600)


# ---------------------------------------------------------------------------------------------
# The plant's cluster: Sparkplug namespace and quorum session queues
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="class")
def plant_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """Three clustered nodes, `mqtt.sparkplug = true` and quorum session queues; a test that
    stops a node starts it again."""
    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbitmq-plant"))
    with configure(cluster, SPARKPLUG_NAMESPACE, QUORUM_SESSIONS) as running:
        yield running


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    """The fleet's release signing key."""
    return Ed25519PrivateKey.generate()


@pytest.fixture
def releases(tmp_path: Path) -> Iterator[ReleaseServer]:
    """The release server on the LAN."""
    started = ReleaseServer(tmp_path / "releases").start()
    yield started
    started.stop()


@dataclass
class Failover:
    """What one failover did: the agent's node stopped (`stop`: SIGTERM) or killed (`kill`)."""

    kind: str
    agent: ClusterAgent
    lost_node: RabbitNode
    down_at: float
    tally: Tally | None = None
    moved: Connection | None = None
    """The link's first connection after the failover, on another node."""
    spoken: dict[str, Any] | None = None
    """The `finished` of a speak published from node 2 once the link had moved."""
    spoken_after: float | None = None
    """Seconds from the node's loss to that `finished`."""
    nbirth: Decoded | None = None
    """The first NBIRTH after the failover, as the host on node 3 saw it."""
    sparkplug: list[tuple[float, str]] = field(default_factory=list)
    """The Sparkplug sessions after the failover: (time.time(), host:port)."""
    state: dict[str, Any] | None = None
    """The last state the agent published after the failover."""
    stale_status: list[bytes] = field(default_factory=list)
    """The agent's retained status on the lost node once it was back."""
    errors: list[str] = field(default_factory=list)
    report: str = ""


def _fail_over(
    cluster: RabbitCluster, kind: str, workdir: Path, voice: Path, cache: Path
) -> Failover:
    """Agent on node 1 (Sparkplug on, the host on every node), a sequence from node 3, node 1
    stopped or killed; what followed, measured (never asserted: the tests do)."""
    first, second, third = cluster.nodes
    node_id = f"fo-{kind}-{secrets.token_hex(2)}"
    with primary_hosts(cluster.nodes, workdir) as hosts:
        watcher = Client311(third, f"voice/{node_id}/#")
        publisher, speaker = Client311(third), Client311(second)
        agent = start_cluster_agent(
            cluster, workdir, node_id, voice, cache, sparkplug=sparkplug_section()
        )
        run = Failover(kind, agent, first, 0.0)
        host = hosts[third.index]
        try:
            wait_online(agent, watcher)
            assert agent.connections()[0].server == address(first)
            born(host, node_id)
            sequence = Sequence(publisher, agent.topics.speak, prefix="s", pace=PACE).start()
            wait_until(lambda: len(watcher.events()) >= 6, TIMEOUT, "the first of the sequence")
            mark = host.mark()
            run.down_at = time.time()
            first.stop() if kind == "stop" else first.kill()

            def moved() -> Connection | None:
                later = [c for c in agent.connections() if c.at >= run.down_at]
                return next((c for c in later if c.server != address(first)), None)

            with contextlib.suppress(AssertionError):
                wait_until(lambda: moved() is not None, FOLLOW, "the link on another node")
            run.moved = moved()
            if run.moved is not None:
                speak(speaker, agent, f"after-{kind}", "Still here.")
                with contextlib.suppress(AssertionError):
                    run.spoken = watcher.wait_event(f"after-{kind}", "finished", FOLLOW)
                    run.spoken_after = time.time() - run.down_at
            with contextlib.suppress(AssertionError):
                run.nbirth = first_of(host, node_id, "NBIRTH", mark, timeout=15)
            time.sleep(max(0.0, run.down_at + OUTAGE - time.time()))
            sequence.stop()
            settle(sequence, watcher)
            run.tally = tally(sequence, watcher.events())
            run.sparkplug = [s for s in agent.sparkplug_sessions() if s[0] >= run.down_at]
            shown = states(watcher, agent)
            run.state = shown[-1] if shown else None
        finally:
            if not first.alive():
                first.start()
            cluster.wait_ready()
            run.stale_status = retained([first], agent.topics.status)[first.name]
            run.errors = stop_agent(agent)
            for client in (watcher, publisher, speaker):
                client.close()
    run.report = _report(run)
    return run


def _report(run: Failover) -> str:
    agent, lost = run.agent, address(run.lost_node)
    after = [c for c in agent.connections() if c.at >= run.down_at]
    storm = [s for s in run.sparkplug if s[1] != lost]
    lines = [
        f"--- failover by {run.kind} of {run.lost_node.name} ({lost}), quorum session queues",
        f"link: {len(after)} connection(s) after it: "
        + ", ".join(
            f"+{c.at - run.down_at:.2f}s {c.server} MQTT {c.version} present={c.session_present}"
            for c in after[:6]
        ),
        f"speak from node 2: finished {run.spoken_after and round(run.spoken_after, 2)} s after "
        f"the loss"
        if run.spoken
        else "speak from node 2: never finished",
        f"sparkplug: {len(run.sparkplug)} session(s) after it ({len(storm)} elsewhere), NBIRTH "
        + (f"+{run.nbirth['received'] - run.down_at:.2f}s" if run.nbirth else "never"),
        f"sequence: {run.tally.line() if run.tally else 'not counted'}",
        f"retained status on {run.lost_node.name} once back: {run.stale_status}",
    ]
    return "\n".join(lines)


@pytest.fixture(scope="class", params=["stop", "kill"])
def failover(
    request: pytest.FixtureRequest,
    plant_cluster: RabbitCluster,
    tiny_voice: Path,
    cache_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Failover:
    """One failover run per kind, measured once, judged by several tests."""
    kind = str(request.param)
    workdir = tmp_path_factory.mktemp(f"failover-{kind}")
    return _fail_over(plant_cluster, kind, workdir, tiny_voice, cache_dir)


class TestPlantCluster:
    """The cluster a plant runs for the agent: Sparkplug namespace on, quorum session queues."""

    def test_speaks_updates_and_serves_sparkplug_through_the_cluster(  # noqa: PLR0917 - its fixtures
        self,
        plant_cluster: RabbitCluster,
        tiny_voice: Path,
        cache_dir: Path,
        tmp_path: Path,
        key: Ed25519PrivateKey,
        releases: ReleaseServer,
    ) -> None:
        """MQTT 5 refused by node 1 (closed before any CONNACK): the agent speaks 3.1.1 there.
        A speak from node 2 is finished; status and state are retained on node 1 only. An offer
        by the operator's tool through node 2 is installed and reported. Sparkplug: the host on
        nodes 2 and 3 does not make the node born (its STATEs are retained there, not on node
        1); once it is on node 1 too, the births reach it on every node, and its DCMD Speak from
        node 3 is said."""
        first, second, third = plant_cluster.nodes
        node_id = f"plant-{secrets.token_hex(2)}"
        watcher = Client311(third, f"voice/{node_id}/#")
        speaker = Client311(second)
        with primary_hosts([second, third], tmp_path) as hosts:
            host = hosts[third.index]
            agent = start_cluster_agent(
                plant_cluster,
                tmp_path,
                node_id,
                tiny_voice,
                cache_dir,
                sparkplug=sparkplug_section(),
                ota=ota_section(key),
            )
            try:
                wait_online(agent, watcher)
                (connection, *_) = agent.connections()
                assert (connection.server, connection.version) == (address(first), "3.1.1")
                fallback = agent.lines("trying MQTT 3.1.1")
                assert fallback, agent.log()
                # RabbitMQ closes an MQTT 5 CONNECT without a CONNACK: an early close is not a
                # refusal in words, so it is not remembered (docs/brokers.md, "MQTT 3.1.1")
                assert not agent.lines(f"{address(first)} does not take MQTT 5"), agent.log()
                took = connection.at - log_time(fallback[0])
                print(f"MQTT 5 refused by {first.name}, 3.1.1 connected {took * 1000:.0f} ms later")

                # 1. a speak from node 2; status and state retained where the agent publishes
                speak(speaker, agent, "hello", "The front door is open.")
                watcher.wait_event("hello", "finished")
                wait_until(lambda: bool(states(watcher, agent)), TIMEOUT, "a state")
                assert states(watcher, agent)[-1]["mqtt"] == {
                    "server": address(first),
                    "protocol": "3.1.1",
                }
                kept = retained(plant_cluster.nodes, agent.topics.status)
                assert kept == {first.name: [b"online"], second.name: [], third.name: []}
                kept_state = retained(plant_cluster.nodes, agent.topics.state)
                assert [len(v) for v in kept_state.values()] == [1, 0, 0], kept_state
                assert json.loads(kept_state[first.name][0])["node"] == node_id

                # 3. Sparkplug: the STATE retained on nodes 2 and 3 is not seen from node 1
                wait_until(lambda: bool(agent.sparkplug_sessions()), TIMEOUT, "Sparkplug")
                time.sleep(QUIET)
                assert [h.messages("NBIRTH", edge=node_id) for h in hosts.values()] == [[], []]
                with primary_hosts([first], tmp_path) as on_first:
                    nbirth, dbirth = born(host, node_id)
                    assert (nbirth["seq"], dbirth["seq"]) == (0, 1)
                    for other in (on_first[first.index], hosts[second.index]):
                        born(other, node_id)  # each host sees what is published on any node
                    assert agent.sparkplug_sessions()[0][1] == address(first)
                    host.dcmd(
                        GROUP, node_id, DEVICE, [metric("Speak", "String", "Fire in hall two.")]
                    )

                    def spoken() -> list[dict[str, Any]]:
                        return [
                            e
                            for e in watcher.events()
                            if str(e.get("id")).startswith("spb-") and e.get("event") == "finished"
                        ]

                    wait_until(lambda: bool(spoken()), TIMEOUT, "the DCMD Speak finished")

                    # 2. an offer by the operator's tool, connected to node 2
                    item = make_release(releases.directory, key, 1)
                    offered = run_tool(
                        [second, third],
                        "offer",
                        str(item.directory / "manifest.json"),
                        "--base-url",
                        f"{releases.url}{item.directory.name}/",
                        "--node",
                        node_id,
                        "--wait",
                        "180",
                    )
                    assert offered.returncode == 0, offered.stdout + offered.stderr
                    assert "installed 1" in offered.stdout
                    updates = [e for e in watcher.events() if e.get("event") == "update"]
                    assert updates[-1]["state"] == "installed", updates
                    wait_until(
                        lambda: any(s.get("model_release") == 1 for s in states(watcher, agent)),
                        TIMEOUT,
                        "a state on release 1",
                    )
                    speak(speaker, agent, "on-release-1", "Updated.")
                    watcher.wait_event("on-release-1", "finished")
                    assert states(watcher, agent)[-1]["model_release"] == 1
            finally:
                errors = stop_agent(agent)
                watcher.close()
                speaker.close()
        assert not errors, errors

    @pytest.mark.xfail(reason=STAGED_ROLLOUT, strict=True)
    def test_a_staged_rollout_by_the_operators_tool_reaches_the_node(  # noqa: PLR0917 - its fixtures
        self,
        plant_cluster: RabbitCluster,
        tiny_voice: Path,
        cache_dir: Path,
        tmp_path: Path,
        key: Ed25519PrivateKey,
        releases: ReleaseServer,
    ) -> None:
        """`ota rollout --nodes <node>` through node 2: the node installs the release."""
        _, second, third = plant_cluster.nodes
        node_id = f"wave-{secrets.token_hex(2)}"
        watcher = Client311(third, f"voice/{node_id}/#")
        agent = start_cluster_agent(
            plant_cluster, tmp_path, node_id, tiny_voice, cache_dir, ota=ota_section(key)
        )
        try:
            wait_online(agent, watcher)
            item = make_release(releases.directory, key, 1)
            state_file = tmp_path / "rollout.json"
            done = run_tool(
                [second, third],
                "rollout",
                str(item.directory / "manifest.json"),
                "--base-url",
                f"{releases.url}{item.directory.name}/",
                "--nodes",
                node_id,
                "--waves",
                "all",
                "--soak",
                "0",
                "--node-timeout",
                "180",
                "--state-file",
                str(state_file),
            )
            print(done.stdout)
            assert done.returncode == 0, done.stdout + done.stderr
            plan = rollout_state.load(state_file)
            assert plan.nodes[node_id].state == "installed", (plan.nodes[node_id], done.stdout)
        finally:
            errors = stop_agent(agent)
            watcher.close()
        assert not errors, errors

    def test_the_agent_carries_on_through_another_node(self, failover: Failover) -> None:
        """Its node stopped or killed: the link resumes its session on another node (quorum
        queue: session present), a speak from node 2 is finished, and of the sequence across
        the failover none is said twice (the remembered ids) and none the publisher's node
        acknowledged is lost (a quorum queue keeps a PUBACKed message on a majority)."""
        run = failover
        print(run.report)  # the counts (pytest -rP shows them)
        assert not run.errors, run.errors
        assert run.moved is not None, run.agent.log()[-4000:]
        assert run.moved.version == "3.1.1"
        assert run.moved.session_present, run.report
        assert run.spoken is not None, run.report
        assert run.state is not None
        assert run.state["mqtt"] == {"server": run.moved.server, "protocol": "3.1.1"}
        assert run.tally is not None
        assert run.tally.repeated == [], run.report
        assert run.tally.lost_acknowledged == [], run.report

    def test_sparkplug_is_born_again_on_another_node(self, failover: Failover) -> None:
        """The Sparkplug session moves to another node, where the host's retained STATE makes
        it born again (seen by the host on node 3). After a kill too: each CONNECT has a client
        id of its own, so the clean session's queue left on the killed node does not refuse
        it."""
        run = failover
        lost = address(run.lost_node)
        assert run.nbirth is not None, run.report
        assert [s for _, s in run.sparkplug][:1] != [lost]
        assert all(server != lost for _, server in run.sparkplug), run.report
        assert run.state is not None
        assert run.state["sparkplug"]["server"] == run.sparkplug[-1][1]


# ---------------------------------------------------------------------------------------------
# RabbitMQ's defaults: classic session queues, no Sparkplug namespace
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="class")
def default_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """Three clustered nodes as harness/rabbitmq.py makes them (RabbitMQ's MQTT defaults)."""
    with RabbitCluster(tmp_path_factory.mktemp("rabbitmq-default")) as running:
        yield running


@dataclass
class Outage:
    """The agent's node down for OUTAGE s, then started again, with RabbitMQ's default classic
    session queues."""

    kind: str
    agent: ClusterAgent
    lost_node: RabbitNode
    down_at: float = 0.0
    restart_at: float = 0.0
    """When the lost node was started again."""
    up_at: float = 0.0
    """When the cluster ran it again."""
    during: list[str] = field(default_factory=list)
    """Ids of the sequence published while the node was down."""
    said_during: list[str] = field(default_factory=list)
    """Ids published while the node was down that were finished before it was started again."""
    back: Connection | None = None
    """The engine's first connection after the restart that found its session (the session
    the sequence's speak messages wait in: they are not alarm-class, docs/architecture.md)."""
    alarms_back: Connection | None = None
    """The sounder's first connection after the restart that found its session (alarm-class
    speaks); the two sessions reconnect on their own, in either order."""
    said_after: list[str] = field(default_factory=list)
    """Ids published once the node ran again that were finished."""
    tally: Tally | None = None
    errors: list[str] = field(default_factory=list)
    report: str = ""


def finished_at(watcher: Client311) -> dict[str, float]:
    """By request id, when the watcher received its first `finished` (time.time())."""
    found: dict[str, float] = {}
    for message in watcher.snapshot():
        if message.topic.endswith("/events"):
            event = message.json()
            if event.get("event") == "finished":
                found.setdefault(str(event.get("id")), message.at)
    return found


def _outage(cluster: RabbitCluster, kind: str, workdir: Path, voice: Path, cache: Path) -> Outage:
    """Agent on node 1, a sequence from node 3, node 1 stopped or killed for OUTAGE s and
    started again; what followed, measured (never asserted: the tests do)."""
    first, _, third = cluster.nodes
    node_id = f"out-{kind}-{secrets.token_hex(2)}"
    watcher = Client311(third, f"voice/{node_id}/#")
    publisher = Client311(third)
    agent = start_cluster_agent(cluster, workdir, node_id, voice, cache)
    run = Outage(kind, agent, first)
    try:
        wait_online(agent, watcher)
        sequence = Sequence(publisher, agent.topics.speak, prefix="o", pace=PACE).start()
        wait_until(lambda: len(watcher.events()) >= 6, TIMEOUT, "the first of the sequence")
        run.down_at = time.time()
        first.stop() if kind == "stop" else first.kill()
        time.sleep(max(0.0, run.down_at + OUTAGE - time.time()))
        run.restart_at = time.time()
        first.start()
        cluster.wait_ready()
        run.up_at = time.time()

        def said_after() -> list[str]:
            return [i for i in sequence.ids(run.up_at) if i in finished_at(watcher)]

        with contextlib.suppress(AssertionError):
            wait_until(lambda: bool(said_after()), FOLLOW, "a message published after the return")
        sequence.stop()
        settle(sequence, watcher, since=run.up_at)  # those published meanwhile are lost
        run.during = sequence.ids(run.down_at, run.restart_at)
        finished = finished_at(watcher)
        run.said_during = [
            i for i in run.during if finished.get(i, run.restart_at) < run.restart_at
        ]
        run.said_after = said_after()
        run.tally = tally(sequence, watcher.events())
        resumed = [
            c for c in agent.engine_connections() if c.at >= run.restart_at and c.session_present
        ]
        run.back = resumed[0] if resumed else None

        def alarms_back() -> Connection | None:
            found = [c for c in agent.connections() if c.at >= run.restart_at]
            return next((c for c in found if c.session_present), None)

        # the engine may speak again before the sounder's backoff ends (seen: 0.53 s before)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: alarms_back() is not None, FOLLOW, "the sounder's session")
        run.alarms_back = alarms_back()
    finally:
        if not first.alive():
            first.start()
            cluster.wait_ready()
        run.errors = stop_agent(agent)
        watcher.close()
        publisher.close()
    run.report = _outage_report(run)
    return run


def _outage_report(run: Outage) -> str:
    agent, lost = run.agent, address(run.lost_node)
    during = [c for c in agent.connections() if run.down_at <= c.at < run.restart_at]
    elsewhere = [c for c in during if c.server != lost]
    lasted = lifetimes(agent, run.down_at, run.restart_at)
    warned = agent.lines("is a second agent running with the same node_id", run.down_at)
    lost_during = set(run.tally.lost if run.tally else ()) & set(run.during)
    lines = [
        f"--- {run.kind} of {run.lost_node.name} ({lost}) for "
        f"{run.restart_at - run.down_at:.1f} s (running again {run.up_at - run.restart_at:.1f} s "
        "later), classic session queues",
        f"the sounder's link while it was down: {len(during)} connection(s), "
        f"{len(elsewhere)} to other nodes, "
        f"session present {sorted({c.session_present for c in elsewhere})}, each lasted "
        + (
            f"median {statistics.median(lasted) * 1000:.0f} ms, max {max(lasted) * 1000:.0f} ms"
            if lasted
            else "-"
        )
        + f"; 'second agent with the same node_id?' warnings: {len(warned)}",
        f"published while it was down: {len(run.during)}, said meanwhile "
        f"{len(run.said_during)}, lost {len(lost_during)}",
        "the engine's session found again: "
        + (
            f"on {run.back.server} {run.back.at - run.restart_at:+.2f} s from the restart"
            if run.back
            else "never"
        )
        + f"; said of those published once it ran: {len(run.said_after)}; the sounder's "
        + (
            f"on {run.alarms_back.server} {run.alarms_back.at - run.restart_at:+.2f} s"
            if run.alarms_back
            else "never"
        ),
        f"sequence: {run.tally.line() if run.tally else 'not counted'}",
    ]
    return "\n".join(lines)


@pytest.fixture(scope="class", params=["stop", "kill"])
def outage(
    request: pytest.FixtureRequest,
    default_cluster: RabbitCluster,
    tiny_voice: Path,
    cache_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Outage:
    """One outage run per kind, measured once, judged by several tests."""
    kind = str(request.param)
    workdir = tmp_path_factory.mktemp(f"outage-{kind}")
    return _outage(default_cluster, kind, workdir, tiny_voice, cache_dir)


class TestDefaultCluster:
    """RabbitMQ's MQTT defaults, as harness/rabbitmq.py starts them."""

    def test_without_the_sparkplug_namespace_spbv1_0_comes_back_as_spbv1_slash_0(
        self, default_cluster: RabbitCluster
    ) -> None:
        """The plugin maps MQTT's `/` to AMQP's `.` and back, and a `.` of a topic to `/`:
        `spBv1.0/...` is delivered as `spBv1/0/...` unless `mqtt.sparkplug = true` (so the
        plant's cluster sets it)."""
        first, second, _ = default_cluster.nodes
        topic = f"spBv1.0/{GROUP}/NDATA/{secrets.token_hex(3)}"
        subscriber = Client311(second, "spBv1.0/#")
        publisher = Client311(first)
        try:
            publisher.publish(topic, b"\x08\x01")
            wait_until(lambda: bool(subscriber.snapshot()), TIMEOUT, "the message")
            assert [m.topic for m in subscriber.snapshot()] == [topic.replace(".", "/", 1)]
        finally:
            subscriber.close()
            publisher.close()

    @pytest.mark.xfail(reason=DEFAULT_SESSION, strict=True)
    def test_the_agent_speaks_through_another_node_while_its_node_is_down(
        self, outage: Outage
    ) -> None:
        assert not outage.errors, outage.errors
        assert outage.said_during, outage.report

    def test_the_agent_speaks_again_once_its_node_is_back(self, outage: Outage) -> None:
        """Once the lost node runs again the engine's session, where the (not alarm-class)
        speak messages wait, is found again (through whichever node its link is trying), and
        what is published from then on is said; the sounder's session is found again too."""
        print(outage.report)  # the counts (pytest -rP shows them)
        assert not outage.errors, outage.errors
        assert outage.back is not None, outage.agent.log()[-4000:]
        assert outage.said_after, outage.report
        assert outage.alarms_back is not None, outage.agent.log()[-4000:]
