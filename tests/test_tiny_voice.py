"""The tiny test voice: one speaker by default (as every test before multi-speaker voices
expects), or several told apart by Piper's `sid` input, at any sample rate, and loaded by the
agent's `Voice` like a real voice."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from agent.speech.voice import Voice, VoiceInfo
from tests.tiny_voice import (
    CYCLES_PER_ID,
    SAMPLE_RATE,
    SAMPLES_PER_ID,
    Language,
    speaker_frequency,
    write_tiny_voice,
)

IDS = [1, 0, 20, 0, 35, 0, 14, 0, 2]
"""Phoneme ids as piper-tts makes them: BOS, each phoneme then a pad, EOS."""


def _run(path: Path, speaker: int | None) -> npt.NDArray[np.float32]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {
        "input": np.array([IDS], dtype=np.int64),
        "input_lengths": np.array([len(IDS)], dtype=np.int64),
        "scales": np.array([0.667, 1.0, 0.8], dtype=np.float32),
    }
    if speaker is not None:
        feed["sid"] = np.array([speaker], dtype=np.int64)
    return np.asarray(session.run(None, feed)[0], dtype=np.float32).reshape(-1)


def _cycles(audio: npt.NDArray[np.floating]) -> set[int]:
    """The sine cycles in each non-silent block of SAMPLES_PER_ID samples (its strongest bin)."""
    blocks = np.asarray(audio, dtype=np.float64).reshape(-1, SAMPLES_PER_ID)
    loud = blocks[np.abs(blocks).max(axis=1) > 0]
    return {int(np.argmax(np.abs(np.fft.rfft(block)))) for block in loud}


def _inputs(path: Path) -> list[str]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()]


def test_the_default_voice_has_one_speaker_and_no_sid(tmp_path: Path) -> None:
    path = write_tiny_voice(tmp_path)
    config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
    assert _inputs(path) == ["input", "input_lengths", "scales"]
    assert config["audio"] == {"sample_rate": SAMPLE_RATE}
    assert config["num_speakers"] == 1
    assert not {"speaker_id_map", "language", "dataset"} & config.keys()
    audio = _run(path, None)
    assert len(audio) == len(IDS) * SAMPLES_PER_ID
    assert _cycles(audio) == {CYCLES_PER_ID}
    voice = Voice.load(path, 1, None)
    assert voice.info == VoiceInfo()
    assert voice.sample_rate == SAMPLE_RATE


def test_each_speaker_has_its_own_pitch_at_the_same_level(tmp_path: Path) -> None:
    path = write_tiny_voice(tmp_path, speakers=3, rate=16000)
    config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
    assert config["num_speakers"] == 3
    assert config["speaker_id_map"] == {"speaker0": 0, "speaker1": 1, "speaker2": 2}
    assert config["audio"]["sample_rate"] == 16000
    assert _inputs(path) == ["input", "input_lengths", "scales", "sid"]
    outputs = [_run(path, speaker) for speaker in range(3)]
    for speaker, audio in enumerate(outputs):
        (cycles,) = _cycles(audio)
        assert cycles == CYCLES_PER_ID * (speaker + 1)
        assert cycles * 16000 / SAMPLES_PER_ID == speaker_frequency(speaker, 16000)
        assert len(audio) == len(IDS) * SAMPLES_PER_ID
        level = float(np.sqrt(np.mean(audio**2)))
        assert level == pytest.approx(float(np.sqrt(np.mean(outputs[0] ** 2))), rel=1e-3)
    single = _run(write_tiny_voice(tmp_path, "single.onnx"), None)
    np.testing.assert_allclose(outputs[0], single, atol=1e-6)  # speaker 0 sounds as before


def test_a_speaker_id_out_of_range_is_an_error_not_silence(tmp_path: Path) -> None:
    path = write_tiny_voice(tmp_path, speakers=["alice", "bob"])
    with pytest.raises(Exception, match="out of data bounds"):
        _run(path, 2)


def test_the_agent_loads_a_multi_speaker_voice_whole(tmp_path: Path) -> None:
    german = Language("de_DE", "German", "Germany")
    path = write_tiny_voice(
        tmp_path,
        "pair.onnx",
        speakers=["alice", "bob"],
        rate=16000,
        language=german,
        dataset="tiny_pair",
        quality="low",
        espeak_voice="de",
    )
    voice = Voice.load(path, 1, None)
    assert not voice.chunked
    assert voice.sample_rate == 16000
    assert voice.info == VoiceInfo(
        "tiny_pair", "de_DE", "German", "Germany", "low", ("alice", "bob")
    )
    assert voice.info.label("x") == "Tiny Pair (German, Germany, low)"
    sentences = list(voice.synthesize("Guten Tag. Wie geht es?"))
    assert len(sentences) == 2
    audio = np.concatenate(sentences).astype(np.float64)
    assert np.sqrt(np.mean(audio**2)) > 100
    assert _cycles(audio) == {CYCLES_PER_ID}  # the agent sends the default speaker, 0


@pytest.mark.parametrize(
    ("speakers", "error"),
    [
        (0, ValueError),
        (32, ValueError),
        (["alice"], ValueError),
        (["alice", "alice"], ValueError),
        (["alice", ""], ValueError),
        ("alice", TypeError),
    ],
)
def test_bad_speakers_are_refused(
    tmp_path: Path, speakers: int | Sequence[str], error: type[Exception]
) -> None:
    with pytest.raises(error, match="speaker"):
        write_tiny_voice(tmp_path, speakers=speakers)
    assert not list(tmp_path.iterdir())


def test_a_bad_sample_rate_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sample rate"):
        write_tiny_voice(tmp_path, rate=0)
