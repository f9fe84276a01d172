"""A tiny Piper-format voice for fast tests: the same inputs and outputs as a real one.

Output: 256 samples per phoneme id, a 4-cycle sine whose amplitude follows the id, so the
audio is deterministic, non-silent and its length follows the phonemes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP

SAMPLES_PER_ID: Final = 256
SAMPLE_RATE: Final = 22050


def write_tiny_voice(directory: Path, name: str = "tiny.onnx", gain: float = 0.004) -> Path:
    """Write `name` and `name.json` into directory; returns the model path."""
    wave = np.sin(np.arange(SAMPLES_PER_ID) * 2 * np.pi * 4 / SAMPLES_PER_ID).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["input"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids_f", "gain"], ["amp"]),
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
