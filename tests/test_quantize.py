"""The quantization tool: the log-mel/DTW metric, the publish gate, and runs on the tiny voice."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tiers.quantize import (
    frame_distance_db,
    is_publishable,
    log_mel_db,
    log_mel_distance_db,
    main,
    run,
)
from tiers.variants import BuildInputs, Variant, build_dynamic

RATE = 22050


def tones(pitches: list[float], seconds: float = 0.25) -> npt.NDArray[np.float64]:
    """A melody of harmonic tones (fundamental and 4 overtones), one per pitch."""
    t = np.arange(int(seconds * RATE)) / RATE
    notes = [
        sum(0.3 / k * np.sin(2 * np.pi * pitch * k * t) for k in range(1, 6)) for pitch in pitches
    ]
    return np.concatenate(notes)


def silence(seconds: float) -> npt.NDArray[np.float64]:
    return np.zeros(int(seconds * RATE))


MELODY = tones([220.0, 440.0, 330.0, 880.0, 550.0])


def test_log_mel_shape_and_floor() -> None:
    mel = log_mel_db(np.concatenate([silence(0.5), MELODY]), RATE)
    assert mel.shape[1] == 80
    assert mel[:10].max() == pytest.approx(-80.0)  # silence sits on the floor
    assert mel.max() > -30.0


def test_identical_audio_has_zero_distance() -> None:
    audio = np.concatenate([silence(0.2), MELODY, silence(0.2)])
    assert log_mel_distance_db(audio, audio.copy(), RATE) == 0.0


def test_time_shift_and_padding_are_aligned_by_dtw() -> None:
    reference = np.concatenate([silence(0.2), MELODY, silence(0.3)])
    shifted = np.concatenate([silence(0.4), MELODY, silence(0.1)])  # same length, 0.2 s later
    padded = np.concatenate([silence(0.3), MELODY, silence(0.9)])  # longer, 0.1 s later
    for copy in (shifted, padded):
        aligned = log_mel_distance_db(reference, copy, RATE)
        unaligned = frame_distance_db(reference, copy, RATE)
        assert aligned < 1.0
        assert unaligned > 5.0
        assert unaligned > 10 * aligned


def test_white_noise_is_far_from_a_harmonic_signal() -> None:
    noise = np.random.default_rng(7).normal(scale=0.1, size=len(MELODY))
    assert log_mel_distance_db(MELODY, noise, RATE) > 10.0


def test_a_quieter_copy_is_at_its_level_difference() -> None:
    audio = np.concatenate([silence(0.2), MELODY, silence(0.2)])
    distance = log_mel_distance_db(audio, audio * 10 ** (-3 / 20), RATE)  # 3 dB quieter
    assert 0.5 < distance <= 3.0  # 3 dB where there is sound, less near and on the floor


@pytest.mark.parametrize(
    ("speedup", "distance", "expected"),
    [
        (1.3, 2.0, True),  # both limits are inclusive
        (2.5, 0.1, True),
        (1.29, 0.1, False),  # too slow
        (2.5, 2.01, False),  # too far
        (1.0, 0.0, False),  # the baseline itself
        (0.3, 6.2, False),  # dynamic INT8 as measured on the platform
        (None, 0.1, False),  # not timed (failed)
        (2.5, None, False),  # not compared (failed)
        (math.nan, 0.1, False),
        (2.5, math.nan, False),
    ],
)
def test_publish_gate(speedup: float | None, distance: float | None, expected: bool) -> None:
    assert is_publishable(speedup, distance) is expected


def test_cli_builds_every_variant_of_the_tiny_voice(
    tiny_voice: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([str(tiny_voice), "--out-dir", str(out), "--repeat", "2"]) == 0
    report = json.loads((out / "quantize.json").read_text(encoding="utf-8"))
    variants = {v["name"]: v for v in report["variants"]}
    for name in ("fp32", "int8-dynamic"):
        assert variants[name]["error"] is None
        assert variants[name]["size_bytes"] > 0
        assert len(variants[name]["round_seconds"]) == 2
        assert variants[name]["speedup"] > 0
        assert len(variants[name]["sentence_distances_db"]) == report["sentences"] == 9
    assert variants["fp32"]["speedup"] == 1.0
    assert variants["fp32"]["distance_db"] == 0.0  # own session matches the agent's Voice
    assert Path(variants["int8-dynamic"]["file"]).is_file()
    table = [
        line
        for line in (out / "quantize.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and not line.startswith("| variant")
    ]
    assert [row.split(" | ")[0].removeprefix("| ") for row in table] == list(variants)
    assert "| fp32 |" in capsys.readouterr().out


def test_texts_file_and_variant_subset(tiny_voice: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello there.\n\nThe door is open.\n", encoding="utf-8")
    out = tmp_path / "out"
    args = [str(tiny_voice), "--out-dir", str(out), "--texts", str(texts), "--repeat", "1"]
    assert main([*args, "--variants", "int8-dynamic"]) == 0
    report = json.loads((out / "quantize.json").read_text(encoding="utf-8"))
    assert report["texts"] == ["Hello there.", "The door is open."]
    assert [v["name"] for v in report["variants"]] == ["fp32", "int8-dynamic"]
    assert main([*args, "--variants", "int4-magic"]) == 2


def _broken_build(inputs: BuildInputs, destination: Path) -> list[str]:
    raise RuntimeError("no calibration today")


def _garbage_build(inputs: BuildInputs, destination: Path) -> list[str]:
    destination.write_bytes(b"not an onnx model")
    return ["wrote garbage on purpose"]


def test_failing_variants_are_reported_not_raised(tiny_voice: Path, tmp_path: Path) -> None:
    variants = [
        Variant("fp32", "baseline"),
        Variant("broken", "fails to build", _broken_build),
        Variant("garbage", "builds, fails to load", _garbage_build),
        Variant("int8-dynamic", "still measured after the failures", build_dynamic),
    ]
    report = run(tiny_voice, tmp_path, texts=["Hello there."], repeat=1, variants=variants)
    by_name = {r.name: r for r in report.variants}
    assert by_name["broken"].error == "build failed: RuntimeError: no calibration today"
    assert (by_name["garbage"].error or "").startswith("run failed: ")
    assert by_name["garbage"].notes == ["wrote garbage on purpose"]
    for name in ("broken", "garbage"):
        assert by_name[name].publishable is False
        assert by_name[name].speedup is None
    assert by_name["int8-dynamic"].error is None
    assert by_name["int8-dynamic"].speedup is not None
    markdown = (tmp_path / "quantize.md").read_text(encoding="utf-8")
    assert "| broken | — | — | — | no (error) |" in markdown
    assert "no calibration today" in markdown


# ---- selective INT8 (tiers.selective) on a VITS-shaped voice: the search, not the figures ----


def _selection_inputs(model: Path) -> tuple[BuildInputs, list[list[int]]]:
    sentences = [[1, 20, 30, 40, 2], [1, 5, 6, 7, 8, 9, 2], [1, 40, 41, 2]]
    return BuildInputs(model, sentences[:2], (0.667, 1.0, 0.8)), sentences


def test_units_are_the_decoder_layers_and_the_other_parts_with_their_work(
    tmp_path: Path,
) -> None:
    import onnx  # noqa: PLC0415

    from tests.test_voice import write_vits_like_voice  # noqa: PLC0415
    from tiers import selective  # noqa: PLC0415

    model = write_vits_like_voice(tmp_path)
    found = selective.units(onnx.load(str(model)), model, [[1, 20, 30, 2]], (0.667, 1.0, 0.8))
    by_name = {u.name: u for u in found}
    assert set(by_name) == {"flow", "dec/conv_pre", "dec"}, by_name
    assert by_name["dec/conv_pre"].nodes == ("/dec/conv_pre/Conv",)
    assert all(u.cost > 0 for u in found), found
    # a longer sentence is more work, layer by layer
    longer = selective.units(onnx.load(str(model)), model, [[1, *[20] * 40, 2]], (0, 1.0, 0))
    assert all(b.cost > a.cost for a, b in zip(found, longer, strict=True))


def test_the_search_keeps_in_float_what_the_budget_cannot_afford_and_repeats(
    tmp_path: Path,
) -> None:
    """Each unit quantized alone is measured, then the longest cheapest-first prefix within the
    budget is taken (then any later unit that still fits): a budget no unit meets quantizes
    nothing, a generous one everything, and the same inputs choose the same units again. The
    recipe builds a variant whose quantized nodes are the chosen units' only."""
    import onnx  # noqa: PLC0415

    from tests.test_voice import write_vits_like_voice  # noqa: PLC0415
    from tiers import selective  # noqa: PLC0415

    model = write_vits_like_voice(tmp_path)
    inputs, sentences = _selection_inputs(model)
    cache = tmp_path / "calibration.json"
    selective.calibrate(inputs, cache)
    judge = selective.Judge.of(model, sentences, inputs.calibration_scales, RATE, tmp_path)
    everything = selective.select(inputs, judge, cache, budget_db=1000.0, progress=print)
    assert sorted(everything.chosen) == ["dec", "dec/conv_pre", "flow"]
    assert set(everything.sensitivity) == {"dec", "dec/conv_pre", "flow"}
    assert everything.quantized_cost_share == pytest.approx(1.0)
    nothing = selective.select(
        inputs, judge, cache, budget_db=-1.0, progress=print, sensitivity=everything.sensitivity
    )
    assert nothing.chosen == []
    again = selective.select(inputs, judge, cache, budget_db=1000.0, progress=print)
    assert (again.order, again.sensitivity) == (everything.order, everything.sensitivity)

    one: dict[str, Any] = {"units": ["dec/conv_pre"], "options": {"reduce_range": True}}
    variant = tmp_path / "variant.onnx"
    assert selective.build_recipe(model, one, cache, variant) == []
    graph = onnx.load(str(variant)).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    convs = {n.name: n for n in graph.node if n.op_type in ("Conv", "ConvTranspose")}
    int8_weights = {name for name, n in convs.items() if n.input[1] in dequantized}
    assert int8_weights == {"/dec/conv_pre/Conv"}, int8_weights
    missing = selective.build_recipe(model, {"units": ["no/such", "dec/conv_pre"]}, cache, variant)
    assert missing == ["no/such"]
