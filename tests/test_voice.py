"""The voice edge on generated models: sentences, PCM, the optimized-model cache, and the split
for chunked decoding (on a small VITS-shaped graph; the real voice: test_split_decoder.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.formats.chunking import decoder_runs, frame_chunks
from agent.speech.decoder_parts import SPLIT_FORMAT
from agent.speech.sessions import cache_stem, model_digest
from agent.speech.voice import FramePlan, SynthesisParams, Voice, to_pcm16
from harness import TIMEOUT
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


@pytest.mark.parametrize("damaged", ["", ".data"], ids=["model", "weights"])
def test_optimized_model_is_cached_by_digest_and_rebuilt_when_damaged(
    tiny_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damaged: str
) -> None:
    first = Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    (cached,) = (tmp_path / "models").glob("*.onnx")
    assert cached.name.startswith(first.sha256)
    stamp = cached.stat().st_mtime_ns

    Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    assert cached.stat().st_mtime_ns == stamp  # reused, not rebuilt

    reference = [p.tolist() for p in first.synthesize("Hello.")]  # before: its weights are mapped
    Path(f"{cached}{damaged}").write_bytes(b"not a model")
    with caplog.at_level(logging.WARNING):
        again = Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    assert "damaged" in caplog.text
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


# ---- the split for chunked decoding, on a small VITS-shaped graph --------------------------

HOP = 16
"""Samples per latent frame of the VITS-shaped test voice."""
SPLIT = f".split{SPLIT_FORMAT}."
"""In the names of the split's cache entries."""
CONV_PRE = "/dec/conv_pre/Conv"


def write_vits_like_voice(
    directory: Path,
    name: str = "vits.onnx",
    local: bool = True,
    hop: int = HOP,
    decoder_op: str | None = None,
) -> Path:
    """A Piper-format voice shaped like a VITS graph, small enough to build in milliseconds.

    Prior: an embedding per phoneme id, two latent frames each (`z_p`, 4 channels) and a mask;
    flow (nodes named /flow/): a kernel-5 convolution added to `z_p`, masked (`/Mul_7`, as in
    Piper's graphs); decoder: `/dec/conv_pre/Conv` (kernel 3), a transposed convolution to
    `hop` samples a frame, tanh. Reaches: flow 2 frames, decoder 1. With `local=False` the
    decoder also adds its input's mean over all frames, so it cannot be run in chunks; with
    `decoder_op` that operator follows conv_pre (one the streaming rewrite lacks: the voice
    decodes with context). (With
    `hop` 256 its speech is as long as a real voice's, for the update's health check.)
    """
    rng = np.random.default_rng(7)
    channels, hidden = 4, 8

    def weights(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name
        )

    def ints(name: str, *values: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, dtype=np.int64), name)

    node = helper.make_node
    nodes = [
        node("Gather", ["emb", "input"], ["/enc_p/emb"], name="/enc_p/Gather"),
        node("Transpose", ["/enc_p/emb"], ["/enc_p/t"], perm=[0, 2, 1], name="/enc_p/Transpose"),
        node("Unsqueeze", ["/enc_p/t", "axis3"], ["/enc_p/u"], name="/enc_p/Unsqueeze"),
        node("Concat", ["/enc_p/u", "/enc_p/u"], ["/enc_p/twice"], axis=3, name="/enc_p/Concat"),
        node("Reshape", ["/enc_p/twice", "zp_shape"], ["/Add_output_0"], name="/Add"),
        node("ReduceMean", ["/Add_output_0"], ["/mean"], axes=[1], keepdims=1, name="/Mean"),
        node("Mul", ["/mean", "zero"], ["/zeros"], name="/Zeros"),
        node("Add", ["/zeros", "one"], ["/y_mask"], name="/Cast_2"),
        node("Conv", ["/Add_output_0", "flow_w"], ["/flow/c"], pads=[2, 2], name="/flow/Conv"),
        node("Add", ["/flow/c", "/Add_output_0"], ["/flow/out"], name="/flow/Add"),
        node("Mul", ["/flow/out", "/y_mask"], ["/Mul_7_output_0"], name="/Mul_7"),
        node(
            "Conv",
            ["/Mul_7_output_0", "pre_w"],
            ["/dec/pre"],
            pads=[1, 1],
            name="/dec/conv_pre/Conv",
        ),
    ]
    decoded = "/dec/pre"
    if not local:
        nodes += [
            node("ReduceMean", ["/dec/pre"], ["/dec/avg"], axes=[2], keepdims=1, name="/dec/Mean"),
            node("Add", ["/dec/pre", "/dec/avg"], ["/dec/global"], name="/dec/Global"),
        ]
        decoded = "/dec/global"
    if decoder_op is not None:  # an operator on each sample that the streaming rewrite lacks
        nodes.append(node(decoder_op, [decoded], ["/dec/extra"], name="/dec/Extra"))
        decoded = "/dec/extra"
    nodes += [
        node("ConvTranspose", [decoded, "up_w"], ["/dec/up"], strides=[hop], name="/dec/ups/0"),
        node("Tanh", ["/dec/up"], ["/dec/tanh"], name="/dec/Tanh"),
        node("Unsqueeze", ["/dec/tanh", "axis1"], ["output"], name="/Unsqueeze_11"),
    ]
    graph = helper.make_graph(
        nodes,
        "vits_like",
        inputs=[
            helper.make_tensor_value_info("input", TensorProto.INT64, [1, "n"]),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
        ],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 1, "t"])],
        initializer=[
            weights("emb", 256, channels, scale=1.0),
            weights("flow_w", channels, channels, 5),
            weights("pre_w", hidden, channels, 3),
            weights("up_w", hidden, 1, hop, scale=0.2),
            ints("axis3", 3),
            ints("axis1", 1),
            ints("zp_shape", 1, channels, -1),
            numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
            numpy_helper.from_array(np.ones(1, np.float32), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = directory / name
    onnx.save(model, str(path))
    shutil.copy(f"{write_tiny_voice(directory, f'{name}-tiny.onnx')}.json", f"{path}.json")
    return path


@pytest.fixture
def vits_voice(tmp_path: Path) -> Path:
    return write_vits_like_voice(tmp_path)


PARAMS = SynthesisParams(0.0, 1.0, 0.0)
TEXT = "The delivery van has arrived at the loading dock behind the north warehouse."


def test_a_vits_shaped_voice_is_split_and_its_parts_give_the_whole_models_samples(
    vits_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="agent"):
        voice = Voice.load(vits_voice, threads=1, cache_dir=tmp_path / "cache")
    assert voice.chunked
    assert voice.hop == HOP
    assert "split for chunked decoding (prior, flow, decoder)" in caplog.text
    assert "context 2 frames for the decoder, 3 for the flow" in caplog.text  # reach + 1
    whole = Voice.load(vits_voice, threads=1, cache_dir=tmp_path / "cache", split=False)
    assert not whole.chunked
    for ids in voice.sentence_ids(f"{TEXT} Close it, please."):
        assert np.array_equal(
            voice.render(ids, PARAMS, FramePlan.whole()), whole.render(ids, PARAMS)
        )


@pytest.mark.parametrize("size", [1, 2, 5, 13, 64])
def test_chunks_of_any_size_join_into_the_whole_decoding(vits_voice: Path, size: int) -> None:
    """The streaming decoder: a chunk's audio ends `lag` samples before its frames (the last
    chunk gives them), its first chunk is at least `first` frames; the chunks join into the
    whole decoding."""
    voice = Voice.load(vits_voice, threads=1, cache_dir=None)
    spec = voice.stream_spec
    assert spec is not None
    assert (spec.lag, spec.first) == (HOP, 2)  # conv_pre's kernel of 3: one frame behind
    (ids,) = voice.sentence_ids(TEXT)
    reference = voice.render(ids, PARAMS, FramePlan.whole())
    pieces = list(voice.stream(ids, PARAMS, FramePlan(size, size, 1)))
    expected, _ = frame_chunks(len(reference) // HOP, max(size, spec.first), size, 1)
    lengths = [len(frames) * HOP for frames in expected]
    lengths[0] -= spec.lag
    lengths[-1] += spec.lag
    assert [len(p) for p in pieces] == lengths
    assert np.abs(np.concatenate(pieces) - reference).max() <= 1e-6
    assert voice.inferences == 2  # one prior run for each stream, however many chunks


def test_the_parts_take_their_tensors_from_the_arena_without_a_plan(
    vits_voice: Path, tmp_path: Path
) -> None:
    """A split voice's parts have no memory pattern (a plan per set of input shapes, each
    growing the arena by a block of its own: docs/memory.md), the streaming decoder's as the
    prior's and the flow's; a whole model's session keeps it. Built here and loaded from the
    cache alike."""
    for cache_dir in (None, tmp_path / "cache", tmp_path / "cache"):  # built, built, cached
        voice = Voice.load(vits_voice, threads=1, cache_dir=cache_dir)
        parts = voice._engine.parts
        assert parts is not None
        assert parts.stream is not None
        assert parts.flow is not None
        assert not parts.decoder.get_session_options().enable_mem_pattern
        assert not parts.prior.get_session_options().enable_mem_pattern
        assert not parts.flow.get_session_options().enable_mem_pattern
        assert np.concatenate(list(voice.synthesize(TEXT))).size > 0
    whole = Voice.load(vits_voice, threads=1, cache_dir=None, split=False)
    assert whole._engine.session is not None
    assert whole._engine.session.get_session_options().enable_mem_pattern


def test_a_decoder_chunk_is_decoded_in_runs_of_cache_size() -> None:
    assert decoder_runs(range(128)) == [range(32), range(32, 64), range(64, 96), range(96, 128)]
    assert decoder_runs(range(128, 166)) == [range(128, 166)]  # a 6-frame tail joins
    assert decoder_runs(range(10)) == [range(10)]
    assert decoder_runs(range(100), 32, first=40) == [range(40), range(40, 72), range(72, 100)]
    assert decoder_runs(range(40, 100), 32, first=50) == [range(40, 72), range(72, 100)]
    for frames in (range(0, 1), range(3, 77), range(0, 1000)):
        runs = decoder_runs(frames)
        assert [f for run in runs for f in run] == list(frames)


@pytest.mark.parametrize("size", [1, 5, 64])
def test_chunks_decoded_with_context_join_into_the_whole_decoding(
    vits_voice: Path, size: int
) -> None:
    """Without the streaming decoder (a voice whose decoder it cannot carry), each chunk is
    decoded with the decoder's context frames on each side and cropped."""
    voice = Voice.load(vits_voice, threads=1, cache_dir=None, stream=False)
    assert voice.stream_spec is None
    (ids,) = voice.sentence_ids(TEXT)
    reference = voice.render(ids, PARAMS, FramePlan.whole())
    pieces = list(voice.stream(ids, PARAMS, FramePlan(size, size, 1)))
    expected, _ = frame_chunks(len(reference) // HOP, size, size, 1)
    assert [len(p) for p in pieces] == [len(frames) * HOP for frames in expected]
    assert np.abs(np.concatenate(pieces) - reference).max() <= 1e-6


def test_a_decoder_the_streaming_rewrite_cannot_carry_decodes_with_context(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_vits_like_voice(tmp_path, "cosine.onnx", decoder_op="Cos")
    with caplog.at_level(logging.INFO, logger="agent"):
        voice = Voice.load(model, threads=1, cache_dir=tmp_path / "cache")
    assert voice.chunked
    assert voice.stream_spec is None
    assert "decodes its chunks with context (no streaming decoder: its decoder has Cos" in (
        caplog.text
    )
    (ids,) = voice.sentence_ids(TEXT)
    reference = voice.render(ids, PARAMS, FramePlan.whole())
    joined = np.concatenate(list(voice.stream(ids, PARAMS, FramePlan(4, 4, 1))))
    assert np.abs(joined - reference).max() <= 1e-6


def test_the_split_parts_are_cached_sealed_and_rebuilt_when_damaged(
    vits_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stem = cache_stem(tmp_path, model_digest(vits_voice, None))
    older = [Path(f"{stem}.split{n}.{suffix}") for n in (1, 2) for suffix in ("json", "prior.onnx")]
    for path in older:  # what the previous format left: never used again
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"older format")
    Voice.load(vits_voice, threads=1, cache_dir=tmp_path)
    models = tmp_path / "models"
    names = {p.name.split(SPLIT)[1] for p in models.glob(f"*.split{SPLIT_FORMAT}.*")}
    parts = {"prior.onnx", "flow.onnx", "decoder.onnx", "stream.onnx"}
    assert names >= {"json", *parts, *(f"{part}.seal" for part in parts)}
    assert "prior.onnx.data" in names  # its weights (the embedding) apart, mapped at load
    assert not [p for p in models.glob("*.onnx") if SPLIT not in p.name]  # no whole copy
    assert not any(path.exists() for path in older)
    assert not list(models.glob(".build-*"))  # the work directory is gone
    (decoder,) = models.glob("*.stream.onnx")
    stamp = decoder.stat().st_mtime_ns
    assert Voice.load(vits_voice, threads=1, cache_dir=tmp_path).chunked
    assert decoder.stat().st_mtime_ns == stamp  # reused, not rebuilt
    decoder.write_bytes(b"not a model")
    with caplog.at_level(logging.WARNING):
        again = Voice.load(vits_voice, threads=1, cache_dir=tmp_path)
    assert "damaged" in caplog.text
    assert again.chunked
    assert len(list(again.synthesize(TEXT))) == 1


def _damage_truncated(data: Path) -> None:
    with data.open("r+b") as file:
        file.truncate(data.stat().st_size // 2)


def _damage_one_byte(data: Path) -> None:
    with data.open("r+b") as file:  # the same size, one weight changed: it still loads
        file.seek(data.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("damage", [_damage_truncated, _damage_one_byte], ids=["cut", "byte"])
def test_a_damaged_weights_file_is_detected_and_the_parts_rebuilt(
    vits_voice: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
) -> None:
    first = Voice.load(vits_voice, threads=1, cache_dir=tmp_path)
    (ids,) = first.sentence_ids(TEXT)
    reference = first.render(ids, PARAMS)
    (data,) = (tmp_path / "models").glob(f"*.split{SPLIT_FORMAT}.prior.onnx.data")
    damage(data)
    with caplog.at_level(logging.INFO, logger="agent"):
        again = Voice.load(vits_voice, threads=1, cache_dir=tmp_path)
    assert "damaged" in caplog.text
    assert "split for chunked decoding" in caplog.text  # built again
    assert again.chunked
    assert np.array_equal(again.render(ids, PARAMS), reference)


def test_a_part_copied_back_unchanged_is_used_without_a_rebuild(
    vits_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restored backup: new inode and times, the same bytes: hashed once, then trusted."""
    Voice.load(vits_voice, threads=1, cache_dir=tmp_path)
    models = tmp_path / "models"
    for path in [
        *models.glob(f"*.split{SPLIT_FORMAT}.*.onnx"),
        *models.glob(f"*.split{SPLIT_FORMAT}.*.data"),
    ]:
        copy = path.with_name(f"{path.name}.copy")
        shutil.copyfile(path, copy)
        os.replace(copy, path)
    with caplog.at_level(logging.INFO, logger="agent"):
        assert Voice.load(vits_voice, threads=1, cache_dir=tmp_path).chunked
    assert "damaged" not in caplog.text
    assert "analysed" not in caplog.text  # nothing built


def test_a_load_with_a_cold_cache_builds_in_child_processes(
    vits_voice: Path, tmp_path: Path
) -> None:
    """The loading process never imports onnx: the graph is split, optimized and checked by
    child processes, and the parts are loaded from what they leave."""
    script = (
        "import json, sys; from pathlib import Path; from agent.speech.voice import Voice; "
        f"v = Voice.load(Path({str(vits_voice)!r}), 1, Path({str(tmp_path / 'cache')!r})); "
        "w = Voice.load(Path(sys.argv[1]), 1, None); "
        "print(json.dumps([v.chunked, w.chunked, 'onnx' in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(vits_voice)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [True, True, False], done.stderr


def test_a_build_process_killed_leaves_the_voice_whole_and_it_is_tried_again(
    vits_voice: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build process killed (as the kernel kills one out of memory): the voice speaks whole,
    the reason is logged, and no verdict is recorded, so the next load builds the parts."""
    killed = tmp_path / "killed-interpreter"
    killed.write_text("#!/bin/sh\nkill -KILL $$\n")
    killed.chmod(0o755)
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", str(killed))
        with caplog.at_level(logging.WARNING):
            voice = Voice.load(vits_voice, threads=1, cache_dir=tmp_path)
    assert not voice.chunked
    assert "splitting it failed: the build step externalize+split was killed by signal 9" in (
        caplog.text
    )
    assert sum(len(pcm) for pcm in voice.synthesize(TEXT)) > 0
    models = tmp_path / "models"
    assert not list(models.glob(f"*.split{SPLIT_FORMAT}.json"))
    assert not list(models.glob(".build-*"))
    assert Voice.load(vits_voice, threads=1, cache_dir=tmp_path).chunked


def test_a_voice_without_the_decoder_node_runs_whole_logged_once_and_speaks(
    tiny_voice: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="agent"):
        voice = Voice.load(tiny_voice, threads=1, cache_dir=tmp_path)
    assert not voice.chunked
    notes = [r for r in caplog.records if "runs whole" in r.getMessage()]
    assert len(notes) == 1
    assert notes[0].levelno == logging.INFO
    assert "no decoder convolution like /dec/conv_pre/Conv" in notes[0].getMessage()
    (record,) = (tmp_path / "models").glob(f"*.split{SPLIT_FORMAT}.json")
    assert json.loads(record.read_text())["parts"] == []  # not analysed again at the next start
    assert sum(len(pcm) for pcm in voice.synthesize("The door is open.")) > 0
    (ids,) = voice.sentence_ids("The door is open.")
    assert len(list(voice.stream(ids, PARAMS, FramePlan(1, 1, 1)))) == 1  # whole, whatever the plan


def test_a_decoder_that_cannot_run_in_chunks_runs_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_vits_like_voice(tmp_path, "global.onnx", local=False)
    with caplog.at_level(logging.INFO, logger="agent"):
        voice = Voice.load(model, threads=1, cache_dir=tmp_path / "cache")
    assert not voice.chunked
    assert "is not local" in caplog.text
    models = tmp_path / "cache" / "models"
    assert not list(models.glob(f"*.split{SPLIT_FORMAT}.*.onnx"))  # the parts were never installed
    assert not list(models.glob(".build-*"))
    assert sum(len(pcm) for pcm in voice.synthesize(TEXT)) > 0


def test_espeak_ng_is_set_to_a_voice_only_when_it_changes(
    tiny_voice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `set_voice` keeps memory espeak-ng never gives back (docs/memory.md): a voice
    phonemizes with it once, then as long as no other voice has set another; the phonemes are
    those of a voice set before each piece."""
    from piper import espeakbridge  # noqa: PLC0415 - the library the voice phonemizes with

    import agent.speech.phonemizer as phonemizer_module  # noqa: PLC0415 - the memo's module

    real = espeakbridge.set_voice
    calls: list[str] = []

    def counted(name: str) -> None:
        calls.append(name)
        real(name)

    monkeypatch.setattr(espeakbridge, "set_voice", counted)
    monkeypatch.setattr(phonemizer_module, "_ESPEAK_VOICE", {})
    voice = Voice.describe(tiny_voice, None)
    first = [voice.sentences(f"{TEXT} Number {n}.") for n in range(5)]
    assert len(calls) == 1
    with phonemizer_module.ESPEAK_LOCK:  # another voice's language, as a second voice sets it
        real("de")
        phonemizer_module._ESPEAK_VOICE["set"] = "de"
    assert voice.sentences(f"{TEXT} Number 0.") == first[0]
    assert len(calls) == 2


def test_espeak_ng_is_initialized_once_and_a_voice_loaded_later_leaves_the_one_in_use(
    tiny_voice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Initializing espeak-ng again reloads its phoneme data under the voice set before: the
    next phonemizing read freed tables ("Invalid instruction ... for phoneme", then SIGSEGV;
    a health check loads two voices, an update or a rollback one more in the engine). It is
    initialized once a process; after someone else initialized it (`forget_espeak_voice`), the
    next voice loaded initializes it again and its voice is set again before it phonemizes."""
    from piper import espeakbridge  # noqa: PLC0415 - the library the voice phonemizes with

    import agent.speech.phonemizer as phonemizer_module  # noqa: PLC0415 - the memo's module

    real_initialize, real_set = espeakbridge.initialize, espeakbridge.set_voice
    calls: list[str] = []

    def initialize(path: str) -> None:
        calls.append("initialize")
        real_initialize(path)

    def set_voice(name: str) -> None:
        calls.append(f"set {name}")
        real_set(name)

    monkeypatch.setattr(espeakbridge, "initialize", initialize)
    monkeypatch.setattr(espeakbridge, "set_voice", set_voice)
    monkeypatch.setattr(phonemizer_module, "_ESPEAK_VOICE", {})
    first = Voice.describe(tiny_voice, None)
    said = first.sentences(TEXT)
    for _ in range(3):  # more voices loaded: an update, a rollback, a health check's second
        Voice.describe(tiny_voice, None)
        assert first.sentences(TEXT) == said
    assert calls == ["initialize", "set en-us"]
    phonemizer_module.forget_espeak_voice()  # espeak-ng used outside: initialized, set again
    Voice.describe(tiny_voice, None)
    assert first.sentences(TEXT) == said
    assert calls == ["initialize", "set en-us", "initialize", "set en-us"]
