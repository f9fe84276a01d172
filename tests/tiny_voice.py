"""A tiny Piper-format voice for fast tests: the same inputs and outputs as a real one.

Output: 256 samples per phoneme id, a 4-cycle sine whose amplitude follows the id, so the
audio is deterministic, non-silent and its length follows the phonemes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP

SAMPLES_PER_ID: Final = 256
SAMPLE_RATE: Final = 22050


def write_tiny_voice(
    directory: Path,
    name: str = "tiny.onnx",
    gain: float = 0.004,
    fault: str | None = None,
    heavy_mb: int = 400,
) -> Path:
    """Write `name` and `name.json` into directory; returns the model path.

    `fault` makes a broken model for the update tests: "hang" (a loop of 10^15 steps inside
    every inference), "heavy" (a `heavy_mb` tensor in every inference: too big for a small
    memory limit). A NaN or a silent model is `gain=float("nan")` or `gain=0`.
    """
    wave = np.sin(np.arange(SAMPLES_PER_ID) * 2 * np.pi * 4 / SAMPLES_PER_ID).astype(np.float32)
    extra_nodes, extra_init, gain_name = _fault_nodes(fault, heavy_mb)
    nodes = [
        *extra_nodes,
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
        ],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 1, "t"])],
        initializer=[
            numpy_helper.from_array(np.array([gain], dtype=np.float32), "gain"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            numpy_helper.from_array(wave.reshape(1, 1, SAMPLES_PER_ID), "wave"),
            numpy_helper.from_array(np.array([1, 1, 1, -1], dtype=np.int64), "out_shape"),
            *extra_init,
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = directory / name
    onnx.save(model, str(path))
    config = {
        "audio": {"sample_rate": SAMPLE_RATE},
        "espeak": {"voice": "en-us"},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "num_symbols": 256,
        "num_speakers": 1,
        "phoneme_id_map": DEFAULT_PHONEME_ID_MAP,
    }
    Path(f"{path}.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def _fault_nodes(fault: str | None, heavy_mb: int) -> tuple[list[Any], list[Any], str]:
    """Nodes that compute the gain the slow or the greedy way; (nodes, initializers, name)."""
    if fault is None:
        return [], [], "gain"
    if fault == "hang":
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
        trips = numpy_helper.from_array(np.array(10**15, dtype=np.int64), "trips")
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
