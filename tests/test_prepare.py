"""`voice-agent prepare`: the voice's graph analysis done ahead of the first start (the install
and `make run`'s set-up run it), into the cache directory the agent then reads, so that start
finds the split voice and analyses nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from agent.speech.decoder_parts import SPLIT_FORMAT
from harness import agent_config, write_config

SCRIPT = Path(sys.executable).parent / "voice-agent"


def run(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_prepare_builds_the_split_that_a_start_then_uses(tiny_voice: Path, tmp_path: Path) -> None:
    second = tmp_path / "second.onnx"  # a voice of tts.voices is prepared too
    shutil.copy(tiny_voice, second)
    shutil.copy(f"{tiny_voice}.json", f"{second}.json")
    config = agent_config(None, tmp_path, "prepared", voice=tiny_voice)
    config["tts"] |= {"voices": {"second": str(second)}}
    path = write_config(tmp_path / "agent.yaml", config)
    models = tmp_path / "cache" / "models"

    prepared = run(["prepare", "--config", str(path)], tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    assert "analysed for chunked decoding" in prepared.stderr
    assert "Saved optimized model" in prepared.stderr  # the tiny voice runs whole
    lines = prepared.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["default", "second"], lines
    assert all(f"ready in {tmp_path / 'cache'}" in line for line in lines), lines
    built = sorted(models.iterdir())
    assert (
        len(list(models.glob(f"*.split{SPLIT_FORMAT}.json"))) == 1
    )  # the same bytes twice: one analysis
    assert len(list(models.glob("*.onnx"))) == 1

    said = run(["say", "Ready.", "--wav", str(tmp_path / "r.wav"), "--config", str(path)], tmp_path)
    assert said.returncode == 0, said.stderr
    assert "runs whole" in said.stderr  # the verdict, read from the cache
    assert "analysed" not in said.stderr  # nothing built at this start
    assert "Saved optimized model" not in said.stderr
    assert sorted(models.iterdir()) == built


def test_prepare_reports_a_bad_config_and_builds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("tts:\n  voice: /nonexistent/voice.onnx\n", encoding="utf-8")
    prepared = run(["prepare", "--config", str(path)], tmp_path)
    assert prepared.returncode == 2
    assert "tts.voice" in prepared.stderr
    assert not (tmp_path / "cache").exists()
