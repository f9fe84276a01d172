"""A lean build of a voice's split parts, one step a process, to measure each step's peak.

Usage: python bench/memory/memory_build.py STEP --dir DIR [--model MODEL] [--cut JSON] [--seconds S]
(bench/memory/measure_memory.py `build` runs the steps in order). The agent builds its parts in one
process from the whole model in memory (onnx.load, shape inference, three optimized sessions
and a whole-model session to check them against); here the weights move once into an external
data file and every later step handles a graph without them, or one part whose weights ONNX
Runtime memory-maps:

- `externalize`: the model's initializers to DIR/model.onnx.data (only onnx imported; the file
  is parsed from a read-only memory map, so the input pages are page cache, not heap).
- `split`: the weightless graph (load_external_data=False) cut into DIR/{prior,flow,decoder}.onnx
  with onnx.utils.Extractor; their initializers still point into model.onnx.data.
- `optimize-prior|flow|decoder`: ONNX Runtime optimizes one part (ENABLE_ALL, arena off) and
  saves it with its initializers external (`session.optimized_model_external_initializers_*`).
- `reference`: the whole model (memory-mapped weights, arena off) speaks a probe: the samples
  the parts must give.
- `check`: the optimized parts (memory-mapped, arena off) speak the probe; largest difference.

Each step prints `RESULT <json>` with its phases (memory_workloads.Phases).
"""

from __future__ import annotations

import argparse
import json
import mmap
import time
from pathlib import Path
from typing import Any, Final

from memory_workloads import Phases, emit

PARTS: Final = ("prior", "flow", "decoder")
PROBE_TEXT: Final = (
    "The quick brown fox jumps over the lazy dog, and the five boxing wizards jump quickly "
    "across the old stone bridge."
)
"""About 5 s of speech, as the agent's build probe; `--seconds` shortens it."""
EXTERNAL: Final = (
    ("session.optimized_model_external_initializers_file_name", "{name}.data"),
    ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
)


def step_externalize(args: argparse.Namespace) -> dict[str, Any]:
    """The model's weights into model.onnx.data, the graph into model.onnx."""
    import onnx  # noqa: PLC0415

    phases = Phases()
    phases.mark("import onnx")
    proto = onnx.ModelProto()
    with (
        args.model.open("rb") as source,
        mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        proto.ParseFromString(memoryview(m))  # type: ignore[arg-type]  # a buffer: no copy
    phases.mark("parsed (file memory-mapped)")
    args.dir.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        proto,
        str(args.dir / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=1024,
    )
    phases.mark("saved with external data")
    return {"phases": phases.rows}


def step_split(args: argparse.Namespace) -> dict[str, Any]:
    """The three parts, cut where the agent cuts (names in --cut), weights left in place."""
    import onnx  # noqa: PLC0415
    import onnx.utils  # noqa: PLC0415

    phases = Phases()
    phases.mark("import onnx")
    proto = onnx.load(str(args.dir / "model.onnx"), load_external_data=False)
    phases.mark("graph loaded without weights")
    extractor = onnx.utils.Extractor(proto)  # shape inference over the weightless graph
    phases.mark("shape inference")
    cut: dict[str, list[list[str]]] = json.loads(args.cut)
    for part in PARTS:
        inputs, outputs = cut[part]
        onnx.save_model(extractor.extract_model(inputs, outputs), str(args.dir / f"{part}.onnx"))
    phases.mark("three parts extracted and saved")
    return {"phases": phases.rows}


def _options(level: str) -> Any:
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.intra_op_num_threads = 2
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return options


def step_optimize(args: argparse.Namespace, part: str) -> dict[str, Any]:
    """One part optimized by ONNX Runtime and saved with external initializers."""
    import onnxruntime as ort  # noqa: PLC0415

    phases = Phases()
    phases.mark("import onnxruntime")
    name = f"{part}.opt.onnx"
    options = _options("ORT_ENABLE_ALL")
    options.optimized_model_filepath = str(args.dir / name)
    for key, value in EXTERNAL:
        options.add_session_config_entry(key, value.format(name=name))
    began = time.perf_counter()
    ort.InferenceSession(
        str(args.dir / f"{part}.onnx"), options, providers=["CPUExecutionProvider"]
    )
    phases.mark(f"{part} optimized and saved", seconds=round(time.perf_counter() - began, 2))
    return {"phases": phases.rows}


def _probe(args: argparse.Namespace) -> dict[str, Any]:
    """The model's inputs for the probe text (piper's phonemizer), cut to --seconds of speech
    (about 37 phoneme ids a second, pads included)."""
    import numpy as np  # noqa: PLC0415
    from piper import espeakbridge  # noqa: PLC0415
    from piper.phoneme_ids import phonemes_to_ids  # noqa: PLC0415
    from piper.phonemize_espeak import ESPEAK_DATA_DIR  # noqa: PLC0415

    config = json.loads(Path(f"{args.model}.json").read_text(encoding="utf-8"))
    espeakbridge.initialize(str(ESPEAK_DATA_DIR))
    espeakbridge.set_voice(config["espeak"]["voice"])
    phonemes = "".join(p + t for p, t, _ in espeakbridge.get_phonemes(PROBE_TEXT))
    ids = phonemes_to_ids(list(phonemes), config["phoneme_id_map"])
    ids = ids[: max(20, int(args.seconds * 37))]
    return {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
    }


def step_reference(args: argparse.Namespace) -> dict[str, Any]:
    """The whole model (weights memory-mapped) on the probe; samples saved for `check`."""
    import numpy as np  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415

    phases = Phases()
    feed = _probe(args)
    phases.mark("imports, probe")
    session = ort.InferenceSession(
        str(args.dir / "model.onnx"),
        _options("ORT_DISABLE_ALL"),
        providers=["CPUExecutionProvider"],
    )
    phases.mark("whole model loaded")
    audio = np.asarray(session.run(None, feed)[0], dtype=np.float32).reshape(-1)
    np.save(args.dir / "reference.npy", audio)
    phases.mark("probe spoken", seconds_of_audio=round(audio.size / 22050, 2))
    return {"phases": phases.rows}


def step_check(args: argparse.Namespace) -> dict[str, Any]:
    """The optimized parts (memory-mapped) on the probe, against the whole model's samples."""
    import numpy as np  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415

    phases = Phases()
    feed = _probe(args)
    phases.mark("imports, probe")
    sessions = {
        part: ort.InferenceSession(
            str(args.dir / f"{part}.opt.onnx"),
            _options("ORT_DISABLE_ALL"),
            providers=["CPUExecutionProvider"],
        )
        for part in PARTS
    }
    phases.mark("three parts loaded")
    prior, flow, decoder = (sessions[p] for p in PARTS)
    latent = prior.run(None, feed)
    given = dict(zip((o.name for o in prior.get_outputs()), latent, strict=True))
    z = flow.run(None, {i.name: given[i.name] for i in flow.get_inputs()})[0]
    (z_name,) = (i.name for i in decoder.get_inputs())
    audio = np.asarray(decoder.run(None, {z_name: z})[0], dtype=np.float32).reshape(-1)
    reference = np.load(args.dir / "reference.npy")
    worst = float(np.abs(audio - reference).max()) if audio.shape == reference.shape else None
    phases.mark("probe spoken by the parts", largest_difference=worst)
    return {"phases": phases.rows, "largest_difference": worst}


def main() -> None:
    """Run one step; print its RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = ["externalize", "split", *(f"optimize-{p}" for p in PARTS), "reference", "check"]
    parser.add_argument("step", choices=steps)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--cut", default="{}", help="split: {part: [inputs, outputs]} (JSON)")
    parser.add_argument("--seconds", type=float, default=5.0, help="probe length")
    args = parser.parse_args()
    began = time.perf_counter()
    if args.step.startswith("optimize-"):
        result = step_optimize(args, args.step.removeprefix("optimize-"))
    else:
        step = {
            "externalize": step_externalize,
            "split": step_split,
            "reference": step_reference,
            "check": step_check,
        }[args.step]
        result = step(args)
    result["wall_s"] = round(time.perf_counter() - began, 1)
    emit(result)


if __name__ == "__main__":
    main()
