"""The sounder and its engine, as `voice-agent run` starts them: an alarm is heard whatever the
engine does (busy, hung, stopped with SIGSTOP, killed), from its chime and the sounder's own
memory; the engine is started again, and the node speaks on (issue 33: alarms first, by
construction)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from agent.formats.chimes import BUILTIN, render_notes
from agent.sounder.engine_process import engine_command
from agent.sounder.kit import KitFiles
from harness import TIMEOUT, Broker, agent_config, publish, read_pcm, wait_until, write_config
from harness.audio import located
from tests.conftest import RunningAgent, StartAgent

pytestmark = [pytest.mark.broker, pytest.mark.voice]

RATE = 22050
PHRASE = "Fire in hall two. Leave the building now."
"""A pinned alarm text (`cache.phrases`): the sounder says it from memory."""


def engine_pid(agent: RunningAgent) -> int:
    """The sounder's child: the engine process (found in /proc by its parent and command)."""
    sounder = agent.process.pid

    def find() -> int | None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == sounder and b"engine" in command:
                return int(entry.name)
        return None

    wait_until(lambda: find() is not None, what="the engine process")
    pid = find()
    assert pid is not None
    return pid


def kept(cache_dir: Path, text: str) -> None:
    """Wait until the sounder keeps this phrase in its kit (the engine rendered it at its
    asking once its voice was ready; an earlier start's kit already has it)."""
    kit = KitFiles(cache_dir)
    # after the voice loads: on a new cache, its graph analysis first (a minute on a busy machine)
    wait_until(lambda: text in kit.load(RATE).phrases, 600, what=f"{text!r} kept by the sounder")


def kept_phrase(cache_dir: Path) -> np.ndarray:
    kit = KitFiles(cache_dir).load(RATE)
    pcm = kit.phrases[PHRASE]
    return np.frombuffer(pcm, dtype="<i2").astype(np.int16)


def alarm(agent: RunningAgent, broker: Broker, text: str, priority: str = "critical") -> str:
    request_id = uuid.uuid4().hex
    body = {"id": request_id, "text": text, "priority": priority}
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    return request_id


def heard(capture: Path, sound: np.ndarray) -> float:
    """How well `sound` is found in the capture (Pearson correlation where it fits best)."""
    samples = read_pcm(capture)
    assert len(samples) >= len(sound), (len(samples), len(sound))
    return located(samples, sound)[1]


def speaks_on(agent: RunningAgent, broker: Broker) -> None:
    """The node's control message: an ordinary request, said by the (new) engine."""
    control = uuid.uuid4().hex
    body = {"id": control, "text": "Still here.", "priority": "info"}
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    agent.watcher.wait_event(control, "finished", timeout=180)


def chime(name: str) -> np.ndarray:
    return np.frombuffer(render_notes(BUILTIN[name], RATE), dtype="<i2").astype(np.int16)


def test_a_pinned_alarm_is_heard_while_the_engine_is_stopped(
    start_agent: StartAgent, broker: Broker, cache_dir: Path
) -> None:
    agent = start_agent(sections={"cache": {"phrases": [PHRASE]}})
    kept(cache_dir, PHRASE)
    engine = engine_pid(agent)
    os.kill(engine, signal.SIGSTOP)
    try:
        fire = alarm(agent, broker, PHRASE)
        finished = agent.watcher.wait_event(fire, "finished")
    finally:
        os.kill(engine, signal.SIGCONT)
    assert [e["event"] for e in agent.watcher.events(fire)] == ["accepted", "started", "finished"]
    assert finished["audio_seconds"] > 2.0, finished
    assert heard(agent.capture, chime("alert")) > 0.99
    assert heard(agent.capture, kept_phrase(cache_dir)) > 0.99
    assert engine_pid(agent) == engine  # a short stop: the same engine goes on
    speaks_on(agent, broker)


def test_a_pinned_alarm_is_heard_while_the_engine_is_killed_and_it_comes_back(
    start_agent: StartAgent, broker: Broker, cache_dir: Path
) -> None:
    agent = start_agent(sections={"cache": {"phrases": [PHRASE]}})
    kept(cache_dir, PHRASE)
    engine = engine_pid(agent)
    os.kill(engine, signal.SIGKILL)
    fire = alarm(agent, broker, PHRASE, "alarm")
    agent.watcher.wait_event(fire, "finished")
    assert heard(agent.capture, chime("alarm")) > 0.99
    assert heard(agent.capture, kept_phrase(cache_dir)) > 0.99
    wait_until(lambda: "ended: killed by SIGKILL" in agent.process.output(), what="the loss seen")
    assert engine_pid(agent) != engine
    speaks_on(agent, broker)


@pytest.mark.allow_error_logs(r"said nothing for \d+ s: killed")
def test_a_hung_engine_is_replaced_and_an_alarm_meanwhile_says_its_words_after_it(
    start_agent: StartAgent, broker: Broker, cache_dir: Path
) -> None:
    """An alarm of a text nobody pinned, while the engine hangs: its chime and the generic
    phrase at once; the hung engine is killed, a new one says the words; nothing else is
    said before them."""
    agent = start_agent()
    kept(cache_dir, "Alarm.")
    engine = engine_pid(agent)
    os.kill(engine, signal.SIGSTOP)
    words = f"Gas leak in room {uuid.uuid4().hex[:4]}."
    gas = alarm(agent, broker, words, "alarm")
    agent.watcher.wait_event(gas, "started")
    finished = agent.watcher.wait_event(gas, "finished", timeout=240)
    assert "said nothing for" in agent.process.output()
    assert engine_pid(agent) != engine
    assert finished["audio_seconds"] > 2.0, finished
    assert heard(agent.capture, chime("alarm")) > 0.99
    speaks_on(agent, broker)


def test_online_comes_before_the_voice_is_ready_and_the_state_says_when_it_is(
    start_agent: StartAgent,
) -> None:
    from agent.voices import DELAY_ENV  # noqa: PLC0415 - the test hook's name

    agent = start_agent(env={DELAY_ENV: "20"}, sections={"state": {"interval": 1}})
    states = [
        json.loads(m.payload) for m in agent.watcher.snapshot() if m.topic == agent.topics.state
    ]
    assert not any(s.get("voice_ready") for s in states)  # online, and the voice not ready

    def ready() -> bool:
        return any(
            json.loads(m.payload).get("voice_ready") is True
            for m in agent.watcher.snapshot()
            if m.topic == agent.topics.state
        )

    wait_until(ready, what="voice_ready", timeout=180)
    engine = [
        m.payload
        for m in agent.watcher.snapshot()
        if m.topic == "voice/" + agent.topics.node_id + "/engine"
    ]
    assert engine[-1:] == [b"online"]


def test_an_engine_whose_sounder_is_gone_before_its_hello_stops(
    broker: Broker, tmp_path: Path, tiny_voice: Path
) -> None:
    """A sounder killed while its engine starts closes the pipe before the engine's hello: the
    engine stops by itself. (It served on before, an orphan whose session took the next
    engine's and back: two engines of one client id, seen in test_faults' random kills.)"""
    config = agent_config(broker, tmp_path, "orphan", voice=tiny_voice)
    path = write_config(tmp_path / "agent.yaml", config)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = [*engine_command(str(path), False), "--fd", str(theirs.fileno())]
    with (tmp_path / "engine.log").open("wb") as log:
        engine = subprocess.Popen(
            command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    theirs.close()
    ours.close()  # gone before the engine's imports are done, let alone its hello
    try:
        code = engine.wait(TIMEOUT)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    output = (tmp_path / "engine.log").read_text(errors="replace")
    assert code == 0, output[-3000:]
    assert "The pipe to the sounder broke" in output
