"""Selective INT8: quantize a Piper voice layer by layer where the audio distance allows it.

The recipe (docs/quantization.md, "Selective INT8"):

1. **Units.** Every Conv, ConvTranspose and MatMul of the graph is quantizable. The decoder's
   are units of their own (one layer each: they take nearly all the time, and their
   sensitivity differs layer by layer); the text encoder, the duration predictor and the flow
   are one unit each. Each unit's cost is its multiply-accumulates per input frame, read from
   its weights and from the upsampling before it (deterministic, unlike a timing).
2. **Calibration, once.** ONNX Runtime's MinMax calibrator (noise on, seeded) measures every
   activation range of every unit on the calibration sentences; the ranges are kept
   (`calibration.json`, ONNX Runtime's calibration cache) and every build below reuses them.
3. **Sensitivity.** Each unit is quantized alone (`quantize_static`, QDQ, per-channel s8
   weights, u8 activations) and its audio distance to FP32 measured on the selection
   sentences (neither calibration nor evaluation sentences) at the voice's default noise,
   FP32 and variant drawing the same noise (one seed).
4. **Selection.** Units in order of distance per cost (the cheapest quality for the most work
   first; ties by name). The longest prefix of that order whose variant stays within the
   budget (`budget_db`, below the gate's 2 dB for a margin) is found by bisection, each step a
   real build measured the same way. What is left out stays in float.

Everything the selection used is deterministic (the distances repeat exactly on one CPU and
runtime; the costs are arithmetic), so a second build from the same model picks the same
units: the bench builds twice and compares. The result is a recipe (`recipe.json`: the units
quantized, the options, the calibration) that `build_recipe` turns into the same variant
without the search.

`reduce_range` (7-bit weights) is for CPUs without VNNI: there x86's u8 x s8 kernels
(vpmaddubsw) add pairs of products in 16 bits with saturation, so 8-bit weights clip; 7-bit
weights never do, and the variant computes the same on every CPU.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationMethod,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
)
from onnxruntime.quantization.calibrate import save_tensors_data

from tiers.audio_distance import log_mel_distance_db
from tiers.variants import (
    CALIBRATION_SEED,
    CONV_OPS,
    BuildInputs,
    FeedReader,
    Scales,
    make_feed,
    quiet_onnxruntime_tools,
)

_LOGGER = logging.getLogger(__name__)

SELECTION_TEXTS: Final = (
    "The garage door closed at a quarter past six, and the alarm is set.",
    "Is anyone home?",
    "Rain is expected after midnight; bring the chairs in from the garden.",
    "Seven hundred and forty two messages are waiting.",
)
"""What the sensitivity and the selection are judged on: neither calibration nor evaluation
sentences (those stay held out for the gate)."""
BUDGET_DB: Final = 1.5
"""The selection's limit on its own sentences: the gate's 2 dB less a margin for sentences it
has not seen (the held-out evaluation measured 0.1-0.3 dB above the selection's figure)."""
MEASURE_SEED: Final = 1234
"""The seed FP32 and variant draw their noise from when distances are measured."""
_DECODER: Final = re.compile(r"^/dec/(conv_pre|conv_post|ups\.\d+|resblocks\.\d+)/")
_PART: Final = re.compile(r"^/([A-Za-z0-9_]+)/")


@dataclass(frozen=True)
class Unit:
    """What is quantized or kept in float as one."""

    name: str
    nodes: tuple[str, ...]
    cost: float
    """Multiply-accumulates over the selection sentences."""


PERCENTILE: Final = 99.99
"""Where activation ranges are cut (percentile calibration): rare peaks clipped, finer steps
for everything else. Measured: each of the decoder's last-stage layers alone 2-3 times closer
to FP32 than with min/max ranges (docs/quantization.md, the lever table)."""


@dataclass(frozen=True)
class Options:
    """How the quantized units are quantized (QDQ, per-channel s8 weights, u8 activations)."""

    reduce_range: bool = False
    """7-bit weights: exact on CPUs without VNNI (see the module)."""
    calibration: str = "percentile"
    """`percentile` (PERCENTILE of a histogram per tensor) or `minmax` activation ranges."""

    @property
    def method(self) -> CalibrationMethod:
        """ONNX Runtime's name of the calibration."""
        return (
            CalibrationMethod.Percentile
            if self.calibration == "percentile"
            else CalibrationMethod.MinMax
        )


def _last(shapes: Any) -> list[int]:
    """The dimensions of the first tensor of a profiler's `*_type_shape` list."""
    first = dict(shapes[0])
    return [int(d) for d in next(iter(first.values()))]


def units(
    model: onnx.ModelProto, source: Path, sentences: Sequence[Sequence[int]], scales: Scales
) -> list[Unit]:
    """The quantizable units of a Piper (VITS) graph, decoder layers one by one, in graph
    order, each with its multiply-accumulates over these sentences (see the module): read
    from the shapes ONNX Runtime's profiler records for one unoptimized run of each sentence
    at noise 0 (deterministic: the same at every build)."""
    weights = {i.name: [int(d) for d in i.dims] for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node if n.op_type in CONV_OPS}
    macs = dict.fromkeys(nodes, 0.0)
    with tempfile.TemporaryDirectory(prefix="shapes-") as work:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(work) / "profile")
        session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        for ids in sentences:
            session.run(None, make_feed(ids, (0.0, scales[1], 0.0)))
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    for event in events:
        name = str(event.get("name", "")).removesuffix("_kernel_time")
        if event.get("cat") != "Node" or name not in nodes:
            continue
        node, args = nodes[name], event["args"]
        if node.op_type == "MatMul":
            rows = _last(args["input_type_shape"])
            macs[name] += float(np.prod(rows)) * float(_last(args["output_type_shape"])[-1])
        else:
            length = _last(
                args["input_type_shape" if node.op_type == "ConvTranspose" else "output_type_shape"]
            )[-1]
            macs[name] += float(np.prod(weights.get(node.input[1], [1]))) * length
    grouped: dict[str, list[str]] = {}
    for name in nodes:
        decoder = _DECODER.match(name)
        if decoder is not None:
            key = name.rsplit("/", 1)[0].lstrip("/")  # one unit per decoder layer
        else:
            part = _PART.match(name)
            key = part.group(1) if part is not None else "other"
        grouped.setdefault(key, []).append(name)
    return [Unit(key, tuple(found), sum(macs[n] for n in found)) for key, found in grouped.items()]


def staged(source: Path, work: Path) -> Path:
    """The model as ONNX Runtime's quantization tools are to read it: a link in our own work
    directory. Their shape inference writes `<model>-inferred.onnx` beside the path it is given
    and removes it after: beside the model itself, that is a read-only package directory on a
    node, an update slot, or a file two builds of one model remove from under each other."""
    link = work / source.name
    link.symlink_to(source.resolve())
    return link


def calibrate(inputs: BuildInputs, cache: Path, options: Options | None = None) -> None:
    """Measure every activation range of every unit once (noise on, seeded) with ONNX
    Runtime's calibrator, one sentence at a time (its histograms and ranges merge from run to
    run, so only one sentence's tensors are held), and keep them in ONNX Runtime's calibration
    cache format at `cache`."""
    chosen = options or Options()
    extra = {"percentile": PERCENTILE, "symmetric": False}
    with (  # beside the ranges: on a node, /tmp may be memory
        tempfile.TemporaryDirectory(prefix=".calibrate-", dir=cache.parent) as work,
        quiet_onnxruntime_tools(),
    ):
        ort.set_seed(CALIBRATION_SEED)
        calibrator = create_calibrator(
            staged(inputs.source, Path(work)),
            list(CONV_OPS),
            augmented_model_path=str(Path(work) / "augmented.onnx"),
            calibrate_method=chosen.method,
            extra_options=extra if chosen.method == CalibrationMethod.Percentile else {},
        )
        for ids in inputs.calibration_ids:
            calibrator.collect_data(FeedReader([make_feed(ids, inputs.calibration_scales)]))
        ranges = calibrator.compute_data()
        del calibrator
    save_tensors_data(ranges, cache)


def build(
    source: Path, quantized: Sequence[Unit], cache: Path, destination: Path, options: Options
) -> None:
    """The variant with these units quantized and the rest in float, from the kept ranges."""
    nodes = [name for unit in quantized for name in unit.nodes]
    if not nodes:
        raise ValueError("no unit to quantize")
    with (  # beside the variant: on a node, /tmp may be memory
        tempfile.TemporaryDirectory(prefix=".quantize-", dir=destination.parent) as work,
        quiet_onnxruntime_tools(),
    ):
        quantize_static(
            str(staged(source, Path(work))),
            str(destination),
            None,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=options.reduce_range,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=list(CONV_OPS),
            nodes_to_quantize=nodes,
            calibrate_method=options.method,
            calibration_cache_path=str(cache),
        )


def open_session(path: Path, threads: int = 2, *, arena: bool = True) -> ort.InferenceSession:
    """A session like the agent's (sequential, ORT_ENABLE_ALL), `threads` intra-op threads;
    without `arena`, each run's tensors go back when it ends (a child that must stay small)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = arena
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


RANDOM_OPS: Final = ("RandomNormalLike", "RandomNormal", "RandomUniformLike", "RandomUniform")


def fixed_noise(model: onnx.ModelProto, seed: int = MEASURE_SEED) -> onnx.ModelProto:
    """The model with each noise node's own seed set (from `seed` and the node's name), so
    FP32 and a variant draw the same noise whatever order ONNX Runtime makes their kernels in
    (a global seed alone is not enough: a variant's extra nodes change that order, and its
    noise then differs as much as another seed's, ~1.7 dB on this metric). For measuring
    only: a shipped variant draws its noise as the model does."""
    for node in model.graph.node:
        if node.op_type in RANDOM_OPS:
            own = zlib.crc32(f"{seed}:{node.name}".encode()) % 65536
            kept = [a for a in node.attribute if a.name != "seed"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("seed", float(own))])
    return model


def fixed_copy(path: Path, folder: Path, seed: int = MEASURE_SEED) -> Path:
    """A copy of the model at `path` in `folder` with its noise seeds fixed (`fixed_noise`),
    its weights in a file beside it, which ONNX Runtime maps instead of copying (clean page
    cache, not the process's own memory: the children must stay small on a 512 MB board);
    the protobuf is let go before any session is made."""
    copy = folder / f"fixed-{path.name}"
    model = fixed_noise(onnx.load(str(path)), seed)
    onnx.save(
        model,
        str(copy),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{copy.name}.data",
        size_threshold=1024,
    )
    del model
    return copy


def remove_copy(copy: Path) -> None:
    """A `fixed_copy` and its weights removed."""
    copy.unlink(missing_ok=True)
    Path(f"{copy}.data").unlink(missing_ok=True)


def outputs(
    fixed: Path,
    sentences: Sequence[Sequence[int]],
    scales: Scales,
    threads: int = 2,
    *,
    arena: bool = True,
) -> list[npt.NDArray[np.float32]]:
    """Every sentence through a fresh session of a seed-fixed copy (`fixed_copy`)."""
    session = open_session(fixed, threads, arena=arena)
    return [
        np.asarray(session.run(None, make_feed(ids, scales))[0], dtype=np.float32).reshape(-1)
        for ids in sentences
    ]


@dataclass
class Judge:
    """FP32's audio for a set of sentences, at the voice's default noise and at none, and the
    distance of a variant's audio to it. Every model is run from a seed-fixed copy in `work`,
    one session at a time."""

    sentences: list[list[int]]
    noisy_scales: Scales
    sample_rate: int
    work: Path
    noisy: list[npt.NDArray[np.float32]] = field(default_factory=list)
    noiseless: list[npt.NDArray[np.float32]] = field(default_factory=list)
    threads: int = 2
    arena: bool = True
    retimed: bool = False
    """Whether the last variant measured spoke any sentence at another length than FP32 (its
    durations changed: the noise drawn after them no longer lines up)."""

    @classmethod
    def of(
        cls,
        model: Path,
        sentences: list[list[int]],
        scales: Scales,
        sample_rate: int,
        work: Path,
        *,
        threads: int = 2,
        arena: bool = True,
    ) -> Judge:
        """FP32's references for these sentences."""
        judge = cls(sentences, scales, sample_rate, work, threads=threads, arena=arena)
        fixed = fixed_copy(model, work)
        judge.noisy = judge.run(fixed, scales)
        judge.noiseless = judge.run(fixed, (0.0, scales[1], 0.0))
        remove_copy(fixed)
        return judge

    def run(self, fixed: Path, scales: Scales) -> list[npt.NDArray[np.float32]]:
        """Every sentence through a seed-fixed copy."""
        return outputs(fixed, self.sentences, scales, self.threads, arena=self.arena)

    def distances(
        self, variant: Path, *, noiseless: bool = True
    ) -> tuple[list[float], list[float]]:
        """Per-sentence distances of the variant at default noise (same seed) and at none
        (not measured without `noiseless`: the search needs only the gated one)."""
        fixed = fixed_copy(variant, self.work)
        noisy = self.run(fixed, self.noisy_scales)
        quiet = self.run(fixed, (0.0, self.noisy_scales[1], 0.0)) if noiseless else []
        remove_copy(fixed)
        self.retimed = any(len(r) != len(o) for r, o in zip(self.noisy, noisy, strict=True))
        return (
            [
                log_mel_distance_db(r, o, self.sample_rate)
                for r, o in zip(self.noisy, noisy, strict=True)
            ],
            [
                log_mel_distance_db(r, o, self.sample_rate)
                for r, o in zip(self.noiseless, quiet, strict=False)
            ],
        )


@dataclass
class Step:
    """One measured build of the search."""

    units: list[str]
    distance_db: float
    """Mean over the selection sentences at default noise (what the budget is held to)."""
    seconds: float
    retimed: bool = False


@dataclass
class Selection:
    """What the search measured and chose."""

    budget_db: float
    options: dict[str, Any]
    costs: dict[str, float]
    sensitivity: dict[str, float] = field(default_factory=dict)
    """Each unit quantized alone: distance at default noise on the selection sentences."""
    order: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    retiming: list[str] = field(default_factory=list)
    """Units that, quantized alone, change the durations."""
    candidates: dict[str, list[str]] = field(default_factory=dict)
    """What each search chose: durations kept, durations changed."""
    candidate_speedups: dict[str, float] = field(default_factory=dict)
    """Each candidate's speedup by CPU time on the selection sentences (when both exist)."""
    chosen: list[str] = field(default_factory=list)
    quantized_cost_share: float = 0.0
    seconds: float = 0.0

    def recipe(self) -> dict[str, Any]:
        """What `build_recipe` needs to make the same variant again."""
        return {"units": self.chosen, "options": self.options}


def _measured(  # noqa: PLR0917 - the search's state, passed along
    judge: Judge, source: Path, chosen: Sequence[Unit], cache: Path, work: Path, options: Options
) -> Step:
    started = time.perf_counter()
    path = work / "candidate.onnx"
    build(source, chosen, cache, path, options)
    noisy, _ = judge.distances(path, noiseless=False)
    seconds = time.perf_counter() - started
    return Step([u.name for u in chosen], float(np.mean(noisy)), seconds, judge.retimed)


@dataclass
class Search:
    """One search's fixed inputs (see `select`)."""

    judge: Judge
    source: Path
    cache: Path
    work: Path
    options: Options
    steps: list[Step]
    progress: Callable[[str], None]

    def measure(self, chosen: Sequence[Unit], label: str) -> Step:
        """A build of these units, measured and logged."""
        step = _measured(self.judge, self.source, chosen, self.cache, self.work, self.options)
        self.steps.append(step)
        self.progress(f"{label}: {step.distance_db:.3f} dB ({step.seconds:.0f} s)")
        return step

    def within(self, base: list[Unit], order: list[Unit], budget: float) -> list[Unit]:
        """`base` and the longest prefix of `order` within the budget (bisection), then every
        later unit that still fits, in order; [] when `base` alone does not fit."""
        low, high = 0, len(order)
        while low < high:
            middle = (low + high + 1) // 2
            step = self.measure([*base, *order[:middle]], f"{len(base)} + first {middle}")
            if step.distance_db <= budget:
                low = middle
            else:
                high = middle - 1
        chosen = [*base, *order[:low]]
        if base and low == 0 and self.measure(base, "the base alone").distance_db > budget:
            return []
        for unit in order[low + 1 :]:
            if self.measure([*chosen, unit], f"+ {unit.name}").distance_db <= budget:
                chosen.append(unit)
        return chosen


RETIMED_BUDGET_DB: Final = 1.85
"""The budget once the durations change: the noise then differs from FP32's as another seed's
does (1.5-1.7 dB on this metric whatever is quantized), so what is left for quantization is
the gate's 2 dB less a smaller margin."""


def select(  # noqa: PLR0917 - what a selection is made of
    inputs: BuildInputs,
    judge: Judge,
    cache: Path,
    options: Options = Options(),
    budget_db: float = BUDGET_DB,
    progress: Callable[[str], None] = _LOGGER.info,
    *,
    sensitivity: Mapping[str, float] | None = None,
    retimed_budget_db: float = RETIMED_BUDGET_DB,
    speed_rounds: int = 3,
) -> Selection:
    """Measure each unit's sensitivity, then search twice (see the module): keeping the
    durations (units that change them stay in float; `budget_db`), and with every unit that
    changes them quantized (`retimed_budget_db`); the faster of the two by CPU time on the
    selection sentences is chosen."""
    started = time.perf_counter()
    found = units(
        onnx.load(str(inputs.source), load_external_data=False),
        inputs.source,
        judge.sentences,
        judge.noisy_scales,
    )
    total = sum(u.cost for u in found)
    selection = Selection(budget_db, asdict(options), {u.name: u.cost / total for u in found})
    with tempfile.TemporaryDirectory(prefix="selective-") as folder:
        work = Path(folder)
        search = Search(judge, inputs.source, cache, work, options, selection.steps, progress)
        retiming: list[Unit] = []
        for unit in found:
            if sensitivity is not None and unit.name in sensitivity:  # measured before
                selection.sensitivity[unit.name] = float(sensitivity[unit.name])
                continue
            step = _measured(judge, inputs.source, [unit], cache, work, options)
            selection.sensitivity[unit.name] = step.distance_db
            if step.retimed:
                retiming.append(unit)
            progress(f"{unit.name}: {step.distance_db:.3f} dB alone ({step.seconds:.0f} s)")
        by_name = {u.name: u for u in found}
        order = sorted(
            found,
            key=lambda u: (max(selection.sensitivity[u.name], 1e-6) / u.cost, u.name),
        )
        selection.order = [u.name for u in order]
        selection.retiming = [u.name for u in retiming]
        kept = search.within([], [u for u in order if u not in retiming], budget_db)
        candidates = {"durations kept": kept}
        if retiming:
            rest = [u for u in order if u not in retiming]
            candidates["durations changed"] = search.within(retiming, rest, retimed_budget_db)
        selection.candidates = {k: [u.name for u in v] for k, v in candidates.items()}
        chosen = kept
        if len([c for c in candidates.values() if c]) > 1:
            speeds = {}
            for label, units_of in candidates.items():
                path = work / "speed.onnx"
                build(inputs.source, units_of, cache, path, options)
                speeds[label] = cpu_speed(
                    inputs.source, path, judge.sentences, judge.noisy_scales, speed_rounds
                )["speedup"]
                progress(f"{label}: {speeds[label]:.3f}x by CPU time")
            selection.candidate_speedups = speeds
            chosen = candidates[max(speeds, key=lambda k: (speeds[k], k))]
    selection.chosen = [u.name for u in chosen]
    selection.quantized_cost_share = sum(by_name[n].cost for n in selection.chosen) / total
    selection.seconds = time.perf_counter() - started
    return selection


def options_of(recipe: dict[str, Any]) -> Options:
    """The options a recipe was chosen with (its calibration and weights)."""
    raw = dict(recipe.get("options", {}))
    return Options(
        reduce_range=bool(raw.get("reduce_range", False)),
        calibration=str(raw.get("calibration", "percentile")),
    )


def build_recipe(source: Path, recipe: dict[str, Any], cache: Path, destination: Path) -> list[str]:
    """The variant a recipe names, from the kept ranges; the units it names that the model
    does not have are returned (a recipe is for one model)."""
    model = onnx.load(str(source), load_external_data=False)
    found = {u.name: u for u in units(model, source, [], (0.0, 1.0, 0.0))}
    wanted = [str(name) for name in recipe["units"]]
    missing = [name for name in wanted if name not in found]
    options = options_of(recipe)
    build(source, [found[n] for n in wanted if n in found], cache, destination, options)
    return missing


def cpu_speed(
    fp32: Path,
    variant: Path,
    sentences: Sequence[Sequence[int]],
    scales: Scales,
    repeat: int,
    *,
    arena: bool = False,
) -> dict[str, Any]:
    """Speed by CPU time: each model in a one-thread session, every sentence once per round,
    the two alternating round by round (FP32 first in even rounds, the variant first in odd
    ones), one session alive at a time (a session is made before its round and let go after
    it: the making is not timed). CPU time of this process counts only its own work, so
    another process's load does not enter it (a busy CPU cannot make FP32 look slow); the
    speedup is the median over rounds of FP32's CPU time over the variant's."""
    models = {"fp32": fp32, "int8": variant}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    wall: dict[str, list[float]] = {name: [] for name in models}
    samples = 0
    for round_index in range(repeat):
        order = list(models) if round_index % 2 == 0 else list(models)[::-1]
        for name in order:
            session = open_session(models[name], threads=1, arena=arena)
            session.run(None, make_feed(sentences[0], scales))  # warm: not timed
            started_cpu, started = time.process_time(), time.perf_counter()
            produced = 0
            for ids in sentences:
                produced += int(np.asarray(session.run(None, make_feed(ids, scales))[0]).size)
            cpu[name].append(time.process_time() - started_cpu)
            wall[name].append(time.perf_counter() - started)
            if name == "fp32" and round_index == 0:
                samples = produced
            del session
    ratios = [f / max(i, 1e-9) for f, i in zip(cpu["fp32"], cpu["int8"], strict=True)]
    walls = [f / max(i, 1e-9) for f, i in zip(wall["fp32"], wall["int8"], strict=True)]
    return {
        "speedup": float(np.median(ratios)),
        "speedup_rounds": ratios,
        "wall_speedup": float(np.median(walls)),
        "fp32_cpu_seconds": cpu["fp32"],
        "int8_cpu_seconds": cpu["int8"],
        "audio_samples": samples,
    }


def write_json(path: Path, value: Any) -> None:
    """JSON, indented, with a trailing newline."""
    path.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")


def activation_ranges(variant: Path) -> int:
    """How many activation QuantizeLinear nodes the variant has (for the report)."""
    model = onnx.load(str(variant), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    return sum(
        1
        for node in model.graph.node
        if node.op_type == "QuantizeLinear" and node.input[0] not in initializers
    )


__all__ = [
    "BUDGET_DB",
    "SELECTION_TEXTS",
    "Judge",
    "Options",
    "Selection",
    "Unit",
    "build",
    "build_recipe",
    "calibrate",
    "select",
    "units",
]
