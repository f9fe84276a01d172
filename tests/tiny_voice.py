"""A tiny Piper-format voice for fast tests: the same inputs and outputs as a real one.

Output: 256 samples per phoneme id, a sine of 4 cycles per 256 samples whose amplitude follows
the id, so the audio is deterministic, non-silent and its length follows the phonemes. A
multi-speaker tiny voice also takes Piper's `sid` input (int64, shape [1]): speaker k's sine
has 4 (k + 1) cycles, so each speaker has its own pitch (`speaker_frequency`) at the same level.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP

SAMPLES_PER_ID: Final = 256
"""Output samples per phoneme id."""
SAMPLE_RATE: Final = 22050
"""Default `audio.sample_rate` of the voice's JSON, in Hz (the bundled voice's)."""
CYCLES_PER_ID: Final = 4
"""Sine cycles per phoneme id of speaker 0 (and of a one-speaker voice); speaker k has k + 1
times as many."""
SLOW_TRIPS: Final = 400_000
"""Loop steps in every inference of a `slow` tiny voice: about 0.15 s each here, thousands of
times the tiny voice's own time (the health check's slowdown)."""
MAX_SPEAKERS: Final = SAMPLES_PER_ID // (2 * CYCLES_PER_ID) - 1
"""Most speakers a tiny voice can have: the highest one's sine stays below Nyquist (31)."""


@dataclass(frozen=True, slots=True)
class Language:
    """The `language` block of a Piper voice's JSON, e.g. Language("de_DE", "German",
    "Germany")."""

    code: str
    """Language and region, e.g. `de_DE` (family and region are split from it)."""
    name_english: str
    country_english: str
    name_native: str = ""
    """Defaults to the English name."""

    def as_json(self) -> dict[str, str]:
        """The block as Piper writes it."""
        family, _, region = self.code.partition("_")
        return {
            "code": self.code,
            "family": family,
            "region": region,
            "name_native": self.name_native or self.name_english,
            "name_english": self.name_english,
            "country_english": self.country_english,
        }


def speaker_frequency(speaker_id: int, rate: int = SAMPLE_RATE) -> float:
    """The pitch of a speaker's sine, in Hz, at `rate` samples per second."""
    return CYCLES_PER_ID * (speaker_id + 1) * rate / SAMPLES_PER_ID


def write_tiny_voice(
    directory: Path,
    name: str = "tiny.onnx",
    gain: float = 0.004,
    fault: str | None = None,
    heavy_mb: int = 400,
    *,
    speakers: int | Sequence[str] = 1,
    rate: int = SAMPLE_RATE,
    language: Language | None = None,
    dataset: str | None = None,
    quality: str | None = None,
    espeak_voice: str = "en-us",
) -> Path:
    """Write `name` and `name.json` into directory; returns the model path.

    `fault` makes a broken model for the update tests: "hang" (a loop of 10^15 steps inside
    every inference), "slow" (a loop of `SLOW_TRIPS` steps), "heavy" (a `heavy_mb` tensor in
    every inference: too big for a small memory limit). A NaN or a silent model is
    `gain=float("nan")` or `gain=0`.

    `speakers` above one (a count, named `speaker0`..., or the names, ids in their order) makes
    a multi-speaker voice: an int64 `sid` input of shape [1] that picks the pitch, and
    `num_speakers` and `speaker_id_map` in the JSON. `rate` is the JSON's sample rate;
    `language`, `dataset` and `quality` are written only when given (as in a real voice's
    JSON); `espeak_voice` is the phonemizer's voice.
    """
    names = _speaker_names(speakers)
    if rate <= 0:
        raise ValueError(f"sample rate must be positive, not {rate}")
    extra_nodes, extra_init, gain_name = _fault_nodes(fault, heavy_mb)
    speaker_nodes, wave_init, inputs = _speaker_parts(len(names))
    nodes = [
        *extra_nodes,
        *speaker_nodes,
        helper.make_node("Cast", ["input"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids_f", gain_name], ["amp"]),
        helper.make_node("Unsqueeze", ["amp", "axis2"], ["amp3"]),
        helper.make_node("Mul", ["amp3", "wave"], ["frames"]),
        helper.make_node("Reshape", ["frames", "out_shape"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_voice",
        inputs=[
            helper.make_tensor_value_info("input", TensorProto.INT64, [1, "n"]),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
            *inputs,
        ],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 1, "t"])],
        initializer=[
            numpy_helper.from_array(np.array([gain], dtype=np.float32), "gain"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            wave_init,
            numpy_helper.from_array(np.array([1, 1, 1, -1], dtype=np.int64), "out_shape"),
            *extra_init,
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = directory / name
    onnx.save(model, str(path))
    audio: dict[str, Any] = {"sample_rate": rate}
    if quality is not None:
        audio["quality"] = quality
    config: dict[str, Any] = {
        "audio": audio,
        "espeak": {"voice": espeak_voice},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "num_symbols": 256,
        "num_speakers": len(names),
        "phoneme_id_map": DEFAULT_PHONEME_ID_MAP,
    }
    if len(names) > 1:
        config["speaker_id_map"] = {speaker: i for i, speaker in enumerate(names)}
    if language is not None:
        config["language"] = language.as_json()
    if dataset is not None:
        config["dataset"] = dataset
    Path(f"{path}.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def _speaker_names(speakers: int | Sequence[str]) -> tuple[str, ...]:
    """The speakers' names by id (one unnamed speaker for a one-speaker voice)."""
    if isinstance(speakers, str):
        raise TypeError("speakers is a count or a sequence of names, not one string")
    if isinstance(speakers, int):
        names = ("",) if speakers == 1 else tuple(f"speaker{i}" for i in range(speakers))
    else:
        names = tuple(speakers)
        if len(names) < 2 or len(set(names)) != len(names) or not all(names):
            raise ValueError(f"speaker names must be two or more, distinct, non-empty: {names}")
    if not 1 <= len(names) <= MAX_SPEAKERS:
        raise ValueError(f"a tiny voice has 1 to {MAX_SPEAKERS} speakers, not {len(names)}")
    return names


def _speaker_parts(count: int) -> tuple[list[Any], Any, list[Any]]:
    """The node that picks the speaker's wave, the wave(s) and the extra graph inputs; a
    one-speaker voice has its one wave as a constant and no `sid`."""
    steps = np.arange(SAMPLES_PER_ID) * 2 * np.pi / SAMPLES_PER_ID
    if count == 1:
        wave = np.sin(steps * CYCLES_PER_ID).astype(np.float32)
        return [], numpy_helper.from_array(wave.reshape(1, 1, SAMPLES_PER_ID), "wave"), []
    waves = np.stack([np.sin(steps * CYCLES_PER_ID * (k + 1)) for k in range(count)])
    table = waves.astype(np.float32).reshape(count, 1, SAMPLES_PER_ID)
    pick = helper.make_node("Gather", ["waves", "sid"], ["wave"], axis=0)
    sid = helper.make_tensor_value_info("sid", TensorProto.INT64, [1])
    return [pick], numpy_helper.from_array(table, "waves"), [sid]


def _fault_nodes(fault: str | None, heavy_mb: int) -> tuple[list[Any], list[Any], str]:
    """Nodes that compute the gain the slow or the greedy way; (nodes, initializers, name)."""
    if fault is None:
        return [], [], "gain"
    if fault in {"hang", "slow"}:
        body = helper.make_graph(
            [
                helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                helper.make_node("Identity", ["g_in"], ["g_out"]),
            ],
            "spin",
            inputs=[
                helper.make_tensor_value_info("i", TensorProto.INT64, []),
                helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                helper.make_tensor_value_info("g_in", TensorProto.FLOAT, [1]),
            ],
            outputs=[
                helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                helper.make_tensor_value_info("g_out", TensorProto.FLOAT, [1]),
            ],
        )
        loop = helper.make_node("Loop", ["trips", "", "gain"], ["slow_gain"], body=body)
        count = 10**15 if fault == "hang" else SLOW_TRIPS
        trips = numpy_helper.from_array(np.array(count, dtype=np.int64), "trips")
        return [loop], [trips], "slow_gain"
    if fault == "heavy":
        count = heavy_mb * 1024 * 1024 // 4
        nodes = [
            helper.make_node("Shape", ["input"], ["in_shape"]),
            helper.make_node("Slice", ["in_shape", "zero", "one"], ["batch"]),
            helper.make_node("Mul", ["batch", "count"], ["big_shape"]),
            helper.make_node(
                "ConstantOfShape",
                ["big_shape"],
                ["big"],
                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]),
            ),
            helper.make_node("ReduceSum", ["big"], ["nothing"], keepdims=0),
            helper.make_node("Add", ["gain", "nothing"], ["heavy_gain"]),
        ]
        init = [
            numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
            numpy_helper.from_array(np.array([count], dtype=np.int64), "count"),
        ]
        return nodes, init, "heavy_gain"
    raise ValueError(f"unknown fault {fault!r}")
