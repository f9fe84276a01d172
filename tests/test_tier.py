"""The default voice's tier (`tts.tier`): the choice (pure), the gate refusing a variant built
from a damaged calibration (the real child's build on the bundled voice), and the real agent
switching to its own INT8 variant when the speed it measured is below the threshold (lowered
past this machine's speed: x86 is fast enough for FP32 at the default)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent.core.tiers import (
    MAX_DISTANCE_DB,
    MEASURED_BY,
    MIN_SPEEDUP,
    TierState,
    best,
    passes,
    verdict,
    wants_int8,
)
from agent.speech.tier_build import (
    KEY_FILE,
    RESULT,
    RESULT_MAX_BYTES,
    SEAL,
    known,
    seal_key,
    write_seal,
)
from harness import Broker, publish, wait_until
from tests.conftest import RunningAgent, StartAgent


@pytest.mark.parametrize(
    ("setting", "speed", "wanted"),
    [
        ("auto", 2.9, True),
        ("auto", 3.0, False),
        ("auto", 40.0, False),
        ("auto", None, False),  # unmeasured: FP32 kept
        ("fp32", 0.5, False),
        ("int8", 40.0, True),
        ("int8", None, True),
    ],
)
def test_the_int8_variant_is_built_below_the_threshold_or_when_forced(
    setting: str, speed: float | None, wanted: bool
) -> None:
    assert wants_int8(setting, speed, 3.0) is wanted


@pytest.mark.parametrize(
    ("setting", "speedup", "distance", "used"),
    [
        ("auto", MIN_SPEEDUP, MAX_DISTANCE_DB, True),
        ("auto", MIN_SPEEDUP - 0.01, 0.5, False),  # not fast enough
        ("auto", 2.0, MAX_DISTANCE_DB + 0.01, False),  # not close enough
        ("auto", None, 0.5, False),
        ("auto", 2.0, math.nan, False),
        ("int8", 0.9, 1.0, True),  # forced: closeness alone
        ("int8", 2.0, 2.5, False),
        ("int8", None, None, False),
    ],
)
def test_the_gate_asks_speed_and_closeness_of_auto_and_closeness_of_a_forced_int8(
    setting: str, speedup: float | None, distance: float | None, used: bool
) -> None:
    assert passes(setting, speedup, distance) is used
    assert (verdict(setting, speedup, distance) == "passed") is used


def test_the_state_shows_the_choice_and_the_figures() -> None:
    state = TierState(
        "auto", "int8", 2.345, 3.0, "passed", 1.4567, 1.2345, "release:int8", 0.123, ("x: y",)
    )
    assert state.as_json() == {
        "setting": "auto",
        "used": "int8",
        "fp32_speed": 2.35,
        "min_speed": 3.0,
        "int8": "passed",
        "int8_speedup": 1.457,
        "int8_distance_db": 1.234,
        "int8_source": "release:int8",
        "busy_share": 0.12,
        "measured_by": MEASURED_BY,
        "notes": ["x: y"],
    }


@pytest.mark.parametrize(
    ("judged", "chosen"),
    [
        ([("a", 1.4, 1.0), ("b", 1.6, 1.9)], "b"),  # the fastest that passes
        ([("a", 1.4, 1.0), ("b", 1.6, 2.1)], "a"),  # b is not close enough
        ([("a", 1.2, 1.0)], None),  # not fast enough
        ([("a", 1.5, 1.0), ("b", 1.5, 0.5)], "b"),  # as fast: the closer
    ],
)
def test_the_fastest_variant_that_passes_is_chosen(
    judged: list[tuple[str, float | None, float | None]], chosen: str | None
) -> None:
    found = best("auto", judged)
    assert (found[0] if found else None) == chosen


@pytest.mark.voice
@pytest.mark.slow
def test_a_variant_built_from_a_damaged_calibration_is_refused(tmp_path: Path) -> None:
    """The child builds the default recipe's variant; its calibration (the activation ranges
    it wrote into the graph's QuantizeLinear scales) is then damaged, every range an eighth of
    what was measured, as a calibration that saw a fraction of the real signal would leave it:
    the speech clips, the distance to FP32 grows past the gate and the variant is refused,
    forced or not. The undamaged build passes the closeness half."""
    import onnx  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    from agent.speech.voice import bundled_voice  # noqa: PLC0415
    from tiers import recipes  # noqa: PLC0415
    from tiers.auto import build_here, judge  # noqa: PLC0415

    model = bundled_voice()
    built = build_here(model, tmp_path / "built", recipes.DEFAULT, 1)
    assert "error" not in built, built
    assert built["distance_db"] <= MAX_DISTANCE_DB, built
    graph = onnx.load(built["file"])
    initializers = {i.name: i for i in graph.graph.initializer}
    activation_scales = {
        node.input[1]
        for node in graph.graph.node
        if node.op_type == "QuantizeLinear" and node.input[0] not in initializers
    }
    assert activation_scales
    for name in activation_scales:
        scale = numpy_helper.to_array(initializers[name])
        initializers[name].CopyFrom(numpy_helper.from_array(scale / 8, name))
    damaged = tmp_path / "damaged.onnx"
    onnx.save(graph, damaged)
    judged = judge(model, damaged, 1)
    assert "error" not in judged, judged
    assert judged["distance_db"] > MAX_DISTANCE_DB, (built, judged)
    assert not passes("auto", judged["speedup"], judged["distance_db"])
    assert not passes("int8", judged["speedup"], judged["distance_db"])
    assert verdict("int8", judged["speedup"], judged["distance_db"]).startswith("refused")


# ---- sealed results (issue 34: "tier variants verified as a whole") ----------------------------

SOURCE = "a" * 64
VOICE_JSON = {"audio": {"sample_rate": 22050}, "inference": {"length_scale": 1.0}}


def _sealed_tier(folder: Path, key: bytes, distance: float = 2.31) -> Path:
    """A tier folder as the agent leaves it: the variant, its JSON, the child's result (a
    variant refused at 2.31 dB by default) and the node's seal over the three."""
    folder.mkdir(parents=True, exist_ok=True)
    variant = folder / "v.int8.onnx"
    variant.write_bytes(b"int8 weights")
    Path(f"{variant}.json").write_text(json.dumps(VOICE_JSON), encoding="utf-8")
    result = {
        "source_sha256": SOURCE,
        "file": str(variant),
        "sha256": hashlib.sha256(b"int8 weights").hexdigest(),
        "speedup": 1.4,
        "distance_db": distance,
    }
    (folder / RESULT).write_text(json.dumps(result), encoding="utf-8")
    write_seal(
        folder,
        key,
        {
            RESULT: _digest(folder / RESULT),
            "variant": _digest(variant),
            "variant.json": _digest(Path(f"{variant}.json")),
        },
    )
    return variant


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_a_sealed_result_is_used_while_it_and_its_files_are_whole(tmp_path: Path) -> None:
    key = seal_key(tmp_path / "storage")
    assert seal_key(tmp_path / "storage") == key  # made once, kept
    assert (tmp_path / "storage" / KEY_FILE).stat().st_mode & 0o077 == 0
    variant = _sealed_tier(tmp_path / "x.int8", key, distance=1.3)
    found = known(tmp_path / "x.int8", SOURCE, key)
    assert found is not None
    assert (found.path, found.speedup, found.distance_db) == (variant, 1.4, 1.3)
    assert known(tmp_path / "x.int8", "b" * 64, key) is None  # built from another model
    assert known(tmp_path / "x.int8", SOURCE, secrets.token_bytes(32)) is None  # another key


@pytest.mark.parametrize("changed", ["result", "variant", "json", "seal"])
def test_a_byte_changed_in_any_sealed_file_means_the_work_is_done_again(
    tmp_path: Path, changed: str
) -> None:
    key = seal_key(tmp_path / "storage")
    folder = tmp_path / "x.int8"
    variant = _sealed_tier(folder, key, distance=1.3)
    target = {
        "result": folder / RESULT,
        "variant": variant,
        "json": Path(f"{variant}.json"),
        "seal": folder / SEAL,
    }[changed]
    _flip_last_byte(target)
    assert known(folder, SOURCE, key) is None


def test_the_forged_tier_of_issue_34_is_refused(tmp_path: Path) -> None:
    """The forgery found from outside: after the variant was refused (2.31 dB), only
    `result.json`'s `distance_db` and the variant's `.onnx.json` (`length_scale` x 3) edited,
    the `.onnx` untouched. The seal no longer checks: the figures are not used (the worker
    builds and judges again), never `passed`. Re-sealing needs the node's key, which is in the
    storage directory, not beside the cache."""
    key = seal_key(tmp_path / "storage")
    folder = tmp_path / "x.int8"
    variant = _sealed_tier(folder, key)
    found = known(folder, SOURCE, key)
    assert found is not None
    assert verdict("auto", found.speedup, found.distance_db).startswith("refused")
    result = json.loads((folder / RESULT).read_text(encoding="utf-8"))
    result["distance_db"] = 1.0
    (folder / RESULT).write_text(json.dumps(result), encoding="utf-8")
    voice = json.loads(Path(f"{variant}.json").read_text(encoding="utf-8"))
    voice["inference"]["length_scale"] *= 3
    Path(f"{variant}.json").write_text(json.dumps(voice), encoding="utf-8")
    assert known(folder, SOURCE, key) is None
    # A seal recomputed by the forger (the format is no secret, the key is):
    forged = {
        RESULT: _digest(folder / RESULT),
        "variant": _digest(variant),
        "variant.json": _digest(Path(f"{variant}.json")),
    }
    write_seal(folder, secrets.token_bytes(32), forged)
    assert known(folder, SOURCE, key) is None


@pytest.mark.parametrize("planted", ["link", "fifo", "directory", "huge"])
def test_a_planted_result_is_not_used_and_never_blocks(tmp_path: Path, planted: str) -> None:
    key = seal_key(tmp_path / "storage")
    folder = tmp_path / "x.int8"
    _sealed_tier(folder, key, distance=1.3)
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes((folder / RESULT).read_bytes())
    (folder / RESULT).unlink()
    if planted == "link":
        (folder / RESULT).symlink_to(outside)
    elif planted == "fifo":
        os.mkfifo(folder / RESULT)
    elif planted == "directory":
        (folder / RESULT).mkdir()
    else:
        (folder / RESULT).write_bytes(b" " * (RESULT_MAX_BYTES + 10))
    assert known(folder, SOURCE, key) is None  # returns at once (a FIFO is not waited on)


def _tier(agent: RunningAgent) -> dict[str, Any] | None:
    for message in reversed(agent.watcher.snapshot()):
        if message.topic == agent.topics.state:
            tier: dict[str, Any] | None = json.loads(message.payload).get("tier")
            return tier
    return None


@pytest.mark.broker
@pytest.mark.voice
@pytest.mark.slow
def test_a_node_too_slow_for_fp32_builds_judges_and_uses_its_int8_variant(
    start_agent: StartAgent, broker: Broker, tmp_path: Path
) -> None:
    agent = start_agent(
        sections={"tts": {"tier": "auto", "tier_min_speed": 10000}, "state": {"interval": 1}}
    )
    verdicts = ("passed", "refused", "failed")
    wait_until(lambda: str((_tier(agent) or {}).get("int8")).startswith(verdicts), timeout=600)
    tier = _tier(agent)
    assert tier is not None
    assert tier["setting"] == "auto"
    assert 0 < tier["fp32_speed"] < 10000
    assert tier["int8_distance_db"] <= MAX_DISTANCE_DB, tier
    if tier["int8_speedup"] >= MIN_SPEEDUP:  # this CPU's measured gain decides
        assert (tier["used"], tier["int8"]) == ("int8", "passed"), tier
    else:
        assert tier["used"] == "fp32", tier
        assert tier["int8"].startswith("refused"), tier
    request = uuid.uuid4().hex
    publish(broker, agent.topics.speak, json.dumps({"id": request, "text": "Tier check."}).encode())
    assert agent.watcher.wait_event(request, "finished")["audio_seconds"] > 0.3
    # Forced INT8 on the next start: the variant and its figures come from the cache (no
    # second build), the node switches to it, still names the FP32 model, and speaks with it.
    assert agent.process.signal(signal.SIGTERM) == 0
    again = start_agent(
        sections={"tts": {"tier": "int8"}, "state": {"interval": 1}},
        node_id=agent.topics.node_id,
    )
    # (the first node's retained state may come first: this one's says `setting` int8)
    wait_until(lambda: (_tier(again) or {}).get("setting") == "int8", timeout=120)
    wait_until(lambda: (_tier(again) or {}).get("used") == "int8", timeout=300)
    forced = _tier(again)
    assert forced is not None
    assert forced["int8"] == "passed"
    assert forced["int8_distance_db"] == tier["int8_distance_db"]  # the cached figures
    assert forced["fp32_speed"] is None  # not measured when forced
    assert "building it" not in again.process.output()
    assert "Switched to the model" in again.process.output()
    state = json.loads(
        next(m for m in reversed(again.watcher.snapshot()) if m.topic == again.topics.state).payload
    )
    assert state["model"] == "en_US-joe-medium"  # the FP32 model it stands for
    request = uuid.uuid4().hex
    publish(broker, again.topics.speak, json.dumps({"id": request, "text": "Tier check."}).encode())
    assert again.watcher.wait_event(request, "finished")["audio_seconds"] > 0.3
