"""The production install, as a Pi user makes it: the wheel built from this tree, installed
with its dependencies (no extras) into a fresh venv outside the source tree, run from another
directory with no config file. `say` writes speech; `run` serves a speak message through a real
Mosquitto; the bundled voice is split for chunked decoding and streams (its first audio goes out
before the sentence is synthesized whole)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from harness import ROOT, Broker, Watcher

pytestmark = [pytest.mark.install, pytest.mark.broker]

LONG_SENTENCE = (
    "When the delivery van arrives at the loading dock behind the warehouse someone from the "
    "receiving team should come down with the scanner and sign for all of the pallets"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel of this tree and its dependencies, and nothing else."""
    work = tmp_path_factory.mktemp("wheel")
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("voice_agent-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, str(wheel)], check=True, timeout=1200)
    return venv


def environment(home: Path) -> dict[str, str]:
    """A user's environment: their own home and caches, nothing of this tree's."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "LANG": "C.UTF-8",
    }


def test_the_wheel_carries_no_source_tree_and_no_dev_extras(installed: Path) -> None:
    python = str(installed / "bin" / "python")
    script = "import agent, sys; print(agent.__file__)"
    env = environment(installed)
    where = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, check=True, cwd=installed, env=env
    )
    assert str(installed) in where.stdout  # the installed package, not this tree's
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], capture_output=True, check=True
    )
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "onnx" in names  # the split needs it at run time
    assert not names & {"pytest", "mypy", "ruff", "hypothesis"}


def test_say_speaks_with_the_split_voice_and_no_config_file(
    installed: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "say.wav"
    done = subprocess.run(
        [
            str(installed / "bin" / "voice-agent"),
            "say",
            "The front door is open.",
            "--wav",
            str(out),
        ],
        cwd=home,
        env=environment(home),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(done.stderr[-2000:])
    assert done.returncode == 0, done.stderr
    assert "split for chunked decoding" in done.stderr
    with wave.open(str(out)) as audio:
        samples = np.frombuffer(audio.readframes(audio.getnframes()), dtype="<i2")
        rate = audio.getframerate()
    assert rate == 22050
    assert len(samples) / rate > 0.8
    assert np.abs(samples).max() > 3000


def test_run_serves_a_speak_message_and_streams(
    installed: Path, tmp_path: Path, broker: Broker
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = environment(home) | {
        "VOICE_AGENT_NODE_ID": "wheel",
        "VOICE_AGENT_MQTT_HOST": broker.host,
        "VOICE_AGENT_MQTT_PORT": str(broker.port),
        "VOICE_AGENT_AUDIO_DEVICE": f"file:FILE={tmp_path}/played.raw,FORMAT=raw",
    }
    watcher = Watcher(broker, "voice/wheel/#")
    log = tmp_path / "run.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(installed / "bin" / "voice-agent"), "run"],
            cwd=home,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        watcher.wait_payload("voice/wheel/status", b"online", timeout=600)
        body = json.dumps({"id": "long", "text": LONG_SENTENCE})
        watcher.publish("voice/wheel/speak", body.encode())
        finished = watcher.wait_event("long", "finished", timeout=300)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        watcher.close()
    text = log.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, text[-3000:]
    assert "split for chunked decoding" in text
    states = [m.json() for m in watcher.snapshot() if m.topic == "voice/wheel/state"]
    first_audio_ms = states[-1]["last_ttfa_ms"]
    synthesis_ms = 1000 * finished["synthesis_seconds"]
    print(f"first audio after {first_audio_ms} ms; the sentence took {synthesis_ms:.0f} ms")
    assert finished["sentences"] == 1
    assert first_audio_ms < synthesis_ms  # it streamed: audio went out before the end
    assert (tmp_path / "played.raw").stat().st_size > 2 * 22050 * 3
