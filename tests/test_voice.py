"""The voice edge on the tiny generated model: sentences, PCM, and the optimized-model cache."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from agent.voice import Voice, model_digest, to_pcm16
from tests.tiny_voice import SAMPLES_PER_ID, write_tiny_voice


def test_one_chunk_per_sentence_with_the_model_length(tiny_voice: Path) -> None:
    voice = Voice.load(tiny_voice, threads=1, cache_dir=None)
    sentences = voice.sentence_ids("The door is open. Close it, please.")
    chunks = list(voice.synthesize("The door is open. Close it, please."))
    assert len(sentences) == len(chunks) == 2
    for ids, pcm in zip(sentences, chunks, strict=True):
        assert pcm.dtype == np.int16
        assert len(pcm) == len(ids) * SAMPLES_PER_ID
        assert np.abs(pcm).max() > 1000
    assert sentences[0][0] == 1  # BOS
    assert sentences[0][-1] == 2  # EOS


def test_text_without_phonemes_gives_no_audio(tiny_voice: Path) -> None:
    voice = Voice.load(tiny_voice, threads=1, cache_dir=None)
    assert list(voice.synthesize("")) == []


def test_pcm_conversion_clips() -> None:
    pcm = to_pcm16(np.array([0.0, 0.5, 1.5, -2.0], dtype=np.float32))
    assert pcm.tolist() == [0, 16383, 32767, -32767]


def test_optimized_model_is_cached_by_digest_and_rebuilt_when_damaged(
    tiny_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    (cached,) = (tmp_path / "models").glob("*.onnx")
    assert cached.name.startswith(first.sha256)
    stamp = cached.stat().st_mtime_ns

    Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    assert cached.stat().st_mtime_ns == stamp  # reused, not rebuilt

    cached.write_bytes(b"not a model")
    with caplog.at_level(logging.WARNING):
        again = Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    assert "damaged" in caplog.text
    reference = [p.tolist() for p in first.synthesize("Hello.")]
    assert [p.tolist() for p in again.synthesize("Hello.")] == reference


def test_cache_entries_are_keyed_by_content(tiny_voice: Path, tmp_path: Path) -> None:
    same = write_tiny_voice(tmp_path, "same.onnx")  # same bytes under another name
    louder = write_tiny_voice(tmp_path, "louder.onnx", gain=0.008)
    cache = tmp_path / "cache"
    voices = [Voice.load(path, threads=1, cache_dir=cache) for path in (tiny_voice, same, louder)]
    assert voices[0].sha256 == voices[1].sha256 != voices[2].sha256
    entries = sorted(p.name.split("-")[0] for p in (cache / "models").glob("*.onnx"))
    assert entries == sorted({voices[0].sha256, voices[2].sha256})


def test_non_espeak_voices_are_refused_clearly(tiny_voice: Path, tmp_path: Path) -> None:
    model = tmp_path / "text.onnx"
    shutil.copy(tiny_voice, model)
    config = json.loads(Path(f"{tiny_voice}.json").read_text())
    config["phoneme_type"] = "text"
    Path(f"{model}.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="phoneme_type 'text' unsupported"):
        Voice.load(model, threads=1, cache_dir=None)


def test_model_digest_is_remembered_until_the_file_changes(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"first model bytes")
    expected = hashlib.sha256(b"first model bytes").hexdigest()
    assert model_digest(model, tmp_path) == expected
    (memo,) = (tmp_path / "models").glob("digest-*")
    assert memo.read_text() == expected
    memo.write_text("f" * 64)  # prove the memo is what answers while the file is unchanged
    assert model_digest(model, tmp_path) == "f" * 64
    with model.open("ab") as f:
        f.write(b"!")  # changed in place: size and change time differ, so it is hashed again
    assert model_digest(model, tmp_path) == hashlib.sha256(b"first model bytes!").hexdigest()
    assert model_digest(model, None) == hashlib.sha256(b"first model bytes!").hexdigest()
