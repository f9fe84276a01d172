"""Model updates, in process: manifests refused for every reason in the threat table, downloads
against a misbehaving real HTTP server, health checks of broken models, cancel, busy, rollback,
and the return to the previous model after failed starts. (With agents and a broker:
test_ota_fleet.py.)"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.core.refusal import Refused
from agent.core.states import FINAL_PHASES, UpdateReason, UpdateReport
from agent.protocol import manifest as manifests
from agent.protocol.manifest import Manifest
from agent.settings.declarations import OtaConfig
from agent.speech.decoder_parts import SPLIT_FORMAT
from agent.speech.voice import Voice
from agent.updates import release_tiers
from agent.updates.model_at_start import fall_back, start_model
from agent.updates.update_store import (
    Pending,
    last_result,
    load_state,
    read_state,
    save_state,
    slot_problem,
)
from agent.updates.updater import Updater
from harness import TIMEOUT, wait_until
from ota import release
from tests.release_server import ReleaseServer
from tests.test_voice import write_vits_like_voice
from tests.tiny_voice import write_tiny_voice


@dataclass
class Release:
    """A signed release laid out for the server."""

    envelope: bytes
    directory: Path
    model: Path

    def offer(self, base_url: str, **extra: Any) -> dict[str, Any]:
        """The body of an offer of this release."""
        return {"manifest": json.loads(self.envelope), "base_url": base_url, **extra}


def make_release(
    root: Path,
    key: Ed25519PrivateKey,
    number: int,
    *,
    gain: float = 0.006,
    fault: str | None = None,
    expires_in: timedelta = timedelta(days=1),
    device_class: str = "voice-agent",
    split: bool = False,
) -> Release:
    """A release of a tiny voice (its own gain, so its own sha256) in root/r<number>/; with
    `split`, of a VITS-shaped voice that splits for chunked decoding."""
    source = root / f"src{number}"
    source.mkdir(parents=True, exist_ok=True)
    if split:
        model = write_vits_like_voice(source, f"voice{number}.onnx", hop=256)
    else:
        model = write_tiny_voice(source, f"voice{number}.onnx", gain=gain, fault=fault)
    body = release.build_manifest(
        model, number, f"{number}.0", expires_in=expires_in, device_class=device_class
    )
    envelope = release.sign(body, [key])
    directory = release.publish_release(root / f"r{number}", model, envelope)
    return Release(envelope, directory, model)


MODEL_SHA256 = hashlib.sha256(b"model").hexdigest()
"""The digest of what `installed` writes by default."""


def installed(directory: Path, slot: str, name: str, data: bytes = b"model") -> Path:
    """A model file in a slot, as an install leaves it."""
    path = directory / "slots" / slot / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def load_prewarmed(model: Path, cache: Path | None = None) -> Voice:
    """The candidate as the agent loads it: loaded (through the model cache) and prewarmed."""
    voice = Voice.load(model, 1, cache)
    voice.prewarm()
    return voice


@dataclass
class Harness:
    """An Updater with a recording report and swap, and the server it downloads from."""

    updater: Updater[Voice]
    server: ReleaseServer
    directory: Path
    reports: list[UpdateReport] = field(default_factory=list)
    swapped: list[Voice] = field(default_factory=list)
    cache: Path | None = None
    """The model cache the updater's check and loader share (the agent's `cache.dir`)."""

    def run(self, body: dict[str, Any], offer: str = "o1") -> UpdateReport:
        """Send a command and wait for its final report."""
        self.updater.command(offer, body)
        return self.final(offer)

    def final(self, offer: str) -> UpdateReport:
        """Wait for the final report of an offer."""
        wait_until(lambda: bool(self.finals(offer)), TIMEOUT, f"final report of {offer}")
        return self.finals(offer)[-1]

    def finals(self, offer: str) -> list[UpdateReport]:
        """Final reports of an offer so far."""
        return [r for r in list(self.reports) if r.offer == offer and r.state in FINAL_PHASES]

    def files_written(self) -> list[Path]:
        """Everything under the update directory except the state."""
        return [p for p in self.directory.rglob("*") if p.is_file() and p.name != "state.json"]


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    """The release signing key."""
    return Ed25519PrivateKey.generate()


@pytest.fixture
def harness(
    tmp_path: Path, tiny_voice: Path, key: Ed25519PrivateKey, request: pytest.FixtureRequest
) -> Iterator[Harness]:
    """An updater trusting `key`, serving tmp_path/releases; knobs via indirect params."""
    overrides: dict[str, Any] = getattr(request, "param", {})
    server = ReleaseServer(tmp_path / "releases")
    config = OtaConfig(
        trusted_keys=(release.public_text(key),),
        hosts=overrides.get("hosts", (f"127.0.0.1:{server.port}",)),  # the release server
        download_timeout=overrides.get("download_timeout", 5.0),
        download_retries=overrides.get("download_retries", 3),
        download_deadline=overrides.get("download_deadline", 1800.0),
        health_timeout=overrides.get("health_timeout", 60.0),
        health_memory_mb=overrides.get("health_memory_mb", 2048),
    )
    server.start()
    reports: list[UpdateReport] = []
    swapped: list[Voice] = []
    cache = tmp_path / "cache"
    updater = Updater(
        config,
        tmp_path / "ota",
        tiny_voice,
        22050,
        1,
        reports.append,
        lambda model: load_prewarmed(model, cache),
        lambda voice: not swapped.append(voice),  # type: ignore[func-returns-value]
        cache_dir=cache,
    )
    updater.start()
    yield Harness(updater, server, tmp_path / "ota", reports, swapped, cache)
    updater.stop()
    server.stop()


def released(harness: Harness, key: Ed25519PrivateKey, number: int, **kwargs: Any) -> Release:
    """A release published where the harness's server serves."""
    return make_release(harness.server.directory, key, number, **kwargs)


def url(harness: Harness, item: Release) -> str:
    """The base URL of a release on the harness's server."""
    return f"{harness.server.url}{item.directory.name}/"


# ---- manifests: refused before any model byte is written ---------------------------------------


def _envelope(body: dict[str, Any], key: Ed25519PrivateKey) -> bytes:
    return manifests.sign(json.dumps(body).encode(), [key])


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "format": 1,
        "release": 2,
        "expires": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
        "target": {"device_class": "voice-agent", "voice": "default"},
        "version": "2.0",
        "notes": "",
        "files": [
            {"path": "v.onnx", "length": 10, "sha256": "a" * 64},
            {"path": "v.onnx.json", "length": 10, "sha256": "b" * 64},
        ],
    }
    return body | changes


def _trusted(*keys: Ed25519PrivateKey) -> dict[str, Any]:
    return {manifests.key_id(k.public_key()): k.public_key() for k in keys}


def _reason(result: Manifest | Refused[UpdateReason]) -> str:
    return result.reason if isinstance(result, Refused) else "accepted"


def test_a_signed_manifest_is_read_and_any_trusted_key_may_sign(key: Ed25519PrivateKey) -> None:
    """Two trusted keys (rotation): a manifest signed by the second is accepted."""
    newer = Ed25519PrivateKey.generate()
    result = manifests.verify(_envelope(_body(), newer), _trusted(key, newer))
    assert isinstance(result, Manifest), result
    assert (result.release, result.version, result.model.path) == (2, "2.0", "v.onnx")


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 1]) + data[index + 1 :]


def test_signature_refusals(key: Ed25519PrivateKey) -> None:
    """Unsigned, a flipped byte in the manifest or in the signature, an unknown key."""
    trusted = _trusted(key)
    signed = json.loads(_envelope(_body(), key))
    raw = base64.b64decode(signed["manifest"])
    sig = base64.b64decode(signed["signatures"][0]["sig"])
    flipped_manifest = signed | {"manifest": base64.b64encode(_flip(raw, 40)).decode()}
    flipped_sig = signed | {
        "signatures": [signed["signatures"][0] | {"sig": base64.b64encode(_flip(sig, 5)).decode()}]
    }
    cases = {
        "unsigned": signed | {"signatures": []},
        "bad_signature": flipped_manifest,
        "bad_signature ": flipped_sig,
        "unknown_key": json.loads(_envelope(_body(), Ed25519PrivateKey.generate())),
        "malformed": {"manifest": "%%%", "signatures": []},
    }
    for expected, envelope in cases.items():
        result = manifests.verify(json.dumps(envelope).encode(), trusted)
        assert _reason(result) == expected.strip(), (expected, result)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"files": [{"path": "../v.onnx", "length": 1, "sha256": "a" * 64}]}, "malformed"),
        ({"files": [{"path": "/etc/v.onnx", "length": 1, "sha256": "a" * 64}]}, "malformed"),
        ({"files": [{"path": "sub/v.onnx", "length": 1, "sha256": "a" * 64}]}, "malformed"),
        ({"files": [{"path": "v.onnx", "length": -1, "sha256": "a" * 64}]}, "malformed"),
        ({"files": [{"path": "v.onnx", "length": 1, "sha256": "XYZ"}]}, "malformed"),
        ({"files": [{"path": "v.onnx", "length": 1, "sha256": "a" * 64}]}, "malformed"),
        ({"release": "2"}, "malformed"),
        ({"expires": "2030-01-01T00:00:00"}, "malformed"),
        ({"format": 2}, "malformed"),
    ],
)
def test_malformed_manifests_are_refused(
    key: Ed25519PrivateKey, changes: dict[str, Any], reason: str
) -> None:
    """Path traversal names, bad lengths or hashes, a model without its .onnx.json, wrong types."""
    assert _reason(manifests.verify(_envelope(_body(**changes), key), _trusted(key))) == reason


def test_admissible_refuses_expired_downgrade_same_and_wrong_target(
    key: Ed25519PrivateKey,
) -> None:
    """Order and target are checked after the signature, with the node's own facts."""
    result = manifests.verify(_envelope(_body(), key), _trusted(key))
    assert isinstance(result, Manifest)
    now = datetime.now(UTC)

    def reason(when: datetime = now, installed: int = 1, device: str = "voice-agent") -> str:
        refusal = manifests.admissible(result, when, installed, device, "default")
        return "ok" if refusal is None else refusal.reason

    assert reason() == "ok"
    assert reason(when=now + timedelta(days=2)) == "expired"
    assert reason(installed=3) == "downgrade"
    assert reason(installed=2) == "already_installed"
    assert reason(device="pi-zero") == "wrong_target"


@pytest.mark.parametrize(
    ("number", "kwargs", "reason"),
    [
        (1, {"expires_in": timedelta(seconds=-5)}, "expired"),
        (1, {"device_class": "pi-zero"}, "wrong_target"),
    ],
)
def test_refused_offers_write_nothing_and_fetch_nothing(
    harness: Harness, key: Ed25519PrivateKey, number: int, kwargs: dict[str, Any], reason: str
) -> None:
    """An inadmissible manifest: refused with its reason, no request to the server, no file."""
    item = released(harness, key, number, **kwargs)
    report = harness.run(item.offer(url(harness, item)))
    assert (report.state, report.reason) == ("failed", reason)
    assert harness.server.behaviour.requests == []
    assert harness.files_written() == []
    assert harness.swapped == []


def test_a_manifest_signed_by_an_untrusted_key_fetches_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    """The same release signed by a stranger's key."""
    item = make_release(harness.server.directory, Ed25519PrivateKey.generate(), 1)
    report = harness.run(item.offer(url(harness, item)))
    assert (report.state, report.reason) == ("failed", "unknown_key")
    assert harness.server.behaviour.requests == []
    assert harness.files_written() == []


# ---- the whole path, and the order of releases ------------------------------------------------


def test_install_switches_and_a_lower_or_same_release_is_refused(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """Release 2 installs into a slot and is swapped in; 2 again is a no-op; 1 is a downgrade."""
    second = released(harness, key, 2)
    first = released(harness, key, 1)
    report = harness.run(second.offer(url(harness, second)))
    assert (report.state, report.release, report.version) == ("installed", 2, "2.0")
    assert [v.sha256 for v in harness.swapped] == [Voice.load(second.model, 1, None).sha256]
    state = load_state(harness.directory)
    assert (state.release, state.active, state.pending) == (2, "a", None)
    assert harness.updater.active_model().read_bytes() == second.model.read_bytes()
    requests = len(harness.server.behaviour.requests)

    again = harness.run(second.offer(url(harness, second)), "o2")
    older = harness.run(first.offer(url(harness, first)), "o3")
    assert (again.state, older.state, older.reason) == ("already_installed", "failed", "downgrade")
    assert len(harness.server.behaviour.requests) == requests  # nothing fetched for either
    assert len(harness.swapped) == 1
    progress = [r.progress or 0 for r in harness.reports if r.state == "downloading"]
    assert progress == sorted(progress)
    assert progress[-1] == 100


def test_the_check_builds_the_candidates_parts_in_the_cache_and_the_agent_only_loads_them(
    harness: Harness, key: Ed25519PrivateKey, caplog: pytest.LogCaptureFixture
) -> None:
    """The health check gets the model cache: the candidate's split parts are built there (by
    the check's own child processes), so the updater's load finds them and builds nothing."""
    item = released(harness, key, 2, split=True)
    with caplog.at_level(logging.INFO, logger="agent"):
        report = harness.run(item.offer(url(harness, item)))
    assert report.state == "installed", report
    (voice,) = harness.swapped
    assert voice.chunked
    assert harness.cache is not None
    (record,) = harness.cache.glob(f"models/{voice.sha256}-*.split{SPLIT_FORMAT}.json")
    assert json.loads(record.read_text())["parts"] == ["prior", "flow", "decoder"]
    assert "analysed for chunked decoding" not in caplog.text  # not in this process
    assert "Saved optimized model" not in caplog.text


def test_files_mixed_from_two_releases_are_refused(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """Release 3's manifest over a folder holding release 2's .onnx.json: the hash differs."""
    second = released(harness, key, 2)
    third = released(harness, key, 3, gain=0.007)
    mixed = third.directory / f"{third.model.name}.json"
    other = json.loads((second.directory / f"{second.model.name}.json").read_text())
    mixed.write_text(json.dumps(other | {"language": "mixed"}), encoding="utf-8")
    report = harness.run(third.offer(url(harness, third)))
    assert (report.state, report.reason) == ("failed", "checksum_mismatch")
    assert load_state(harness.directory).release == 0
    assert harness.swapped == []
    assert not (harness.directory / "slots").exists()


def test_a_file_of_another_length_is_refused(harness: Harness, key: Ed25519PrivateKey) -> None:
    """The server's model is one byte short of the manifest: retried, then refused."""
    item = released(harness, key, 2)
    model = item.directory / item.model.name
    model.write_bytes(model.read_bytes()[:-1])
    report = harness.run(item.offer(url(harness, item)))
    assert report.state == "failed"
    assert report.reason == "download_failed"
    assert "incomplete" in report.detail
    assert harness.swapped == []


def test_not_enough_disk_is_refused_before_downloading(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """A manifest whose files need more than the free disk: `no_space`, nothing fetched."""
    body = _body(
        release=5,
        files=[
            {"path": "v.onnx", "length": 10**15, "sha256": "a" * 64},
            {"path": "v.onnx.json", "length": 10, "sha256": "b" * 64},
        ],
    )
    offer = {"manifest": json.loads(_envelope(body, key)), "base_url": harness.server.url}
    report = harness.run(offer)
    assert (report.state, report.reason) == ("failed", "no_space")
    assert harness.server.behaviour.requests == []


# ---- downloads against a misbehaving server ---------------------------------------------------


def test_a_cut_download_is_resumed_with_range(harness: Harness, key: Ed25519PrivateKey) -> None:
    """The connection closes after 700 bytes: the next request asks for the rest."""
    item = released(harness, key, 2)
    harness.server.behaviour.cut_after = 700
    report = harness.run(item.offer(url(harness, item)))
    assert report.state == "installed", report
    ranges = [r for _, r in harness.server.behaviour.requests if r is not None]
    assert ranges[:2] == ["bytes=700-", "bytes=700-"]  # the model, then its .onnx.json
    assert harness.updater.active_model().read_bytes() == item.model.read_bytes()


def test_a_server_without_range_fails_cleanly(harness: Harness, key: Ed25519PrivateKey) -> None:
    """Cut, and the server answers the resume with the whole file (200): refused, cleaned up."""
    item = released(harness, key, 2)
    harness.server.behaviour.cut_after = 700
    harness.server.behaviour.honour_range = False
    report = harness.run(item.offer(url(harness, item)))
    assert (report.state, report.reason) == ("failed", "no_range_support")
    assert list((harness.directory / "staging").glob("*.part")) == []
    assert harness.swapped == []


def test_endless_data_is_cut_at_the_manifest_length(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """The server sends the file, then zeros forever: the agent reads exactly the length."""
    item = released(harness, key, 2)
    harness.server.behaviour.endless = True
    report = harness.run(item.offer(url(harness, item)))
    assert report.state == "installed", report
    installed = harness.updater.active_model()
    assert installed.read_bytes() == item.model.read_bytes()
    assert (installed.parent / f"{item.model.name}.json").stat().st_size == Path(
        f"{item.model}.json"
    ).stat().st_size


@pytest.mark.parametrize(
    "harness", [{"download_timeout": 1.0, "download_retries": 2}], indirect=True
)
def test_a_stalled_server_times_out(harness: Harness, key: Ed25519PrivateKey) -> None:
    """The server stops sending after 500 bytes and holds the connection: retried, then failed."""
    item = released(harness, key, 2)
    harness.server.behaviour.stall_after = 500
    report = harness.run(item.offer(url(harness, item)))
    assert (report.state, report.reason) == ("failed", "download_failed")
    assert "timeout" in report.detail  # a stall, published as a timeout
    names = [name for name, _ in harness.server.behaviour.requests]
    assert names.count(f"r2/{item.model.name}.json") == 2  # two attempts, then it gave up


# ---- health checks of broken models -----------------------------------------------------------


ANSWERS: Final = {"health_timeout": 120.0, "health_memory_mb": 300}
"""A check that answers: its process (Python, ONNX Runtime, the model) may take more than 5 s to
start on a busy machine; only the hang is judged by its timeout."""


@pytest.mark.parametrize(
    ("harness", "kwargs", "expected"),
    [
        pytest.param(ANSWERS, {"gain": float("nan")}, "non_finite_audio", id="nan"),
        pytest.param(ANSWERS, {"gain": 0.0}, "silent", id="silent"),
        pytest.param(
            {**ANSWERS, "health_timeout": 5.0}, {"fault": "hang"}, "no answer in 5 s", id="hang"
        ),
        pytest.param(ANSWERS, {"fault": "heavy"}, "the check process failed", id="memory"),
        pytest.param(ANSWERS, {"fault": "slow"}, "slower than the current model", id="slow"),
    ],
    indirect=["harness"],
)
def test_a_broken_model_fails_the_health_check_and_nothing_changes(
    harness: Harness, key: Ed25519PrivateKey, kwargs: dict[str, Any], expected: str
) -> None:
    """NaN, silence, a hang, a memory blow-up, a model thousands of times slower (CPU time):
    reported with the reason, the old model stays."""
    item = released(harness, key, 2, **kwargs)
    report = harness.run(item.offer(url(harness, item)))
    assert (report.state, report.reason) == ("failed", "health_check")
    assert expected in report.detail, report.detail
    assert harness.swapped == []
    state = load_state(harness.directory)
    assert (state.release, state.active, state.pending) == (0, None, None)


def test_a_model_that_is_not_a_model_fails_the_health_check(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """Garbage with the right hash (signed as it is): the check process fails to load it."""
    item = released(harness, key, 2)
    item.model.write_bytes(b"not an onnx model" * 50)
    envelope = release.sign(release.build_manifest(item.model, 2, "2.0"), [key])
    release.publish_release(item.directory, item.model, envelope)
    report = harness.run({"manifest": json.loads(envelope), "base_url": url(harness, item)})
    assert (report.state, report.reason) == ("failed", "health_check")
    assert "the check process failed" in report.detail
    assert harness.swapped == []


# ---- commands: busy, cancel, rollback ---------------------------------------------------------


def test_a_second_offer_while_one_runs_is_answered_busy_and_cancel_stops_the_first(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """A slow download: a second offer gets `busy`; cancel ends the first; nothing switched."""
    item = released(harness, key, 2)
    harness.server.behaviour.bytes_per_second = 1000
    harness.updater.command("first", item.offer(url(harness, item)))
    wait_until(lambda: any(r.state == "downloading" for r in harness.reports), what="downloading")
    second = harness.run(item.offer(url(harness, item)), "second")
    assert (second.state, second.reason) == ("busy", "already_in_progress")
    harness.updater.command("c", {"cancel": True})
    assert harness.final("first").state == "cancelled"
    assert harness.swapped == []
    assert load_state(harness.directory).release == 0
    # Cancelled, not lost: the next offer resumes from what was downloaded.
    harness.server.behaviour.bytes_per_second = None
    requests = len(harness.server.behaviour.requests)
    assert harness.run(item.offer(url(harness, item)), "third").state == "installed"
    assert harness.server.behaviour.requests[requests][1] is not None  # a Range request


def test_rollback_returns_to_the_previous_model(
    harness: Harness, key: Ed25519PrivateKey, tiny_voice: Path
) -> None:
    """Install 2 then 3; rollback goes to 2, a second rollback to 3 (the other slot)."""
    for number, gain in ((2, 0.006), (3, 0.007)):
        item = released(harness, key, number, gain=gain)
        assert harness.run(item.offer(url(harness, item)), f"o{number}").state == "installed"
    back = harness.run({"rollback": True}, "back")
    assert (back.state, back.release, back.version) == ("rolled_back", 2, "2.0")
    assert harness.updater.active_model().name == "voice2.onnx"
    assert harness.swapped[-1].path == harness.updater.active_model()
    state = load_state(harness.directory)
    assert (state.release, state.previous_release) == (2, 3)


def test_rollback_with_nothing_installed_is_refused(harness: Harness) -> None:
    """The factory model has nothing before it."""
    report = harness.run({"rollback": True})
    assert (report.state, report.reason) == ("failed", "nothing_to_roll_back")


# ---- starts with an unconfirmed model --------------------------------------------------------


def test_failed_starts_return_to_the_previous_slot(tmp_path: Path, tiny_voice: Path) -> None:
    """A switch no start ever confirmed: each start counts; after the limit, the old slot."""
    config = OtaConfig(trusted_keys=("x",), max_start_attempts=3)
    directory = tmp_path / "ota"
    state = load_state(directory)
    state.release, state.active, state.model, state.version = 4, "b", "voice4.onnx", "4.0"
    state.previous, state.previous_release, state.previous_model = "a", 3, "voice3.onnx"
    state.model_sha256 = state.previous_model_sha256 = MODEL_SHA256  # as `installed` writes
    state.pending = Pending("b", 4, "4.0")
    save_state(directory, state)
    installed(directory, "b", "voice4.onnx")
    installed(directory, "a", "voice3.onnx")
    starts = [start_model(config, directory, tiny_voice) for _ in range(4)]
    assert [p.name for p in starts] == ["voice4.onnx"] * 3 + ["voice3.onnx"]
    after = load_state(directory)
    assert (after.release, after.active, after.pending) == (3, "a", None)
    assert after.reports[0]["state"] == "rolled_back"
    assert after.reports[0]["reason"] == "start_failed"
    assert start_model(config, directory, tiny_voice).name == "voice3.onnx"  # and stays there


@pytest.mark.allow_error_logs(r"state\.json.*: set aside, the configured model speaks$")
def test_an_unreadable_state_file_starts_the_factory_model(
    tmp_path: Path, tiny_voice: Path
) -> None:
    """A state file damaged by hand or disk: the configured model, and an error in the log."""
    directory = tmp_path / "ota"
    directory.mkdir()
    (directory / "state.json").write_text("{not json", encoding="utf-8")
    assert start_model(OtaConfig(trusted_keys=("x",)), directory, tiny_voice) == tiny_voice


def test_reports_reached_before_a_start_are_delivered_by_started(
    tmp_path: Path, tiny_voice: Path
) -> None:
    """The rollback after failed starts is reported once the agent is up."""
    directory = tmp_path / "ota"
    state = load_state(directory)
    state.reports.append({"offer": "start", "state": "rolled_back", "reason": "start_failed"})
    save_state(directory, state)
    reports: queue.Queue[UpdateReport] = queue.Queue()
    key = Ed25519PrivateKey.generate()
    updater = Updater(
        OtaConfig(trusted_keys=(release.public_text(key),)),
        directory,
        tiny_voice,
        22050,
        1,
        reports.put,
        load_prewarmed,
        lambda _voice: True,
    )
    updater.started()
    assert reports.get_nowait().state == "rolled_back"
    assert load_state(directory).reports == []


@pytest.mark.allow_error_logs(r"set aside the last result \(not one\)")
def test_the_last_result_outlives_a_restart_and_a_damaged_one_is_set_aside(
    harness: Harness, key: Ed25519PrivateKey, tiny_voice: Path
) -> None:
    """The last result of an update job is kept in `state.json`: an updater made after a restart
    (of the agent, or of its engine alone) has it, with when it was reached, for the state's
    `last_update`. A result that is not one is set aside, the rest of the state kept."""
    second = released(harness, key, 2)
    before = time.time()
    assert harness.run(second.offer(url(harness, second)), "up2").state == "installed"
    assert harness.run({"rollback": True}, "back").state == "rolled_back"

    def restarted() -> Updater[Voice]:
        config = OtaConfig(trusted_keys=(release.public_text(key),))
        return Updater(config, harness.directory, tiny_voice, 22050, 1, print, load_prewarmed, bool)

    last = last_result(restarted().state)
    assert last is not None
    report, at = last
    assert (report.offer, report.state, report.release) == ("back", "rolled_back", 0)
    assert before <= at <= time.time()
    state = json.loads((harness.directory / "state.json").read_text())
    state["last"]["at"] = "yesterday"
    (harness.directory / "state.json").write_text(json.dumps(state))
    found = read_state(harness.directory)
    assert (found.state.last, found.unusable, found.set_aside) == (
        None,
        None,
        ("the last result (not one)",),
    )
    assert last_result(restarted().state) is None


# ---- review fixes: slots, rollback targets, leftovers, redelivery ---------------------------


def test_a_failed_install_into_the_rollback_slot_never_becomes_a_rollback_target(
    harness: Harness, key: Ed25519PrivateKey, tiny_voice: Path
) -> None:
    """2 in slot a, 3 in slot b (previous: a); 4 goes to slot a and fails its health check:
    slot a no longer holds 2, so a rollback goes to the configured model, never into 4."""
    for number, gain in ((2, 0.006), (3, 0.007)):
        item = released(harness, key, number, gain=gain)
        assert harness.run(item.offer(url(harness, item)), f"o{number}").state == "installed"
    broken = released(harness, key, 4, gain=float("nan"))
    report = harness.run(broken.offer(url(harness, broken)), "o4")
    assert (report.state, report.reason) == ("failed", "health_check")
    assert (load_state(harness.directory).previous, harness.updater.state.release) == (None, 3)
    back = harness.run({"rollback": True}, "back")
    assert (back.state, back.release) == ("rolled_back", 0)
    assert harness.updater.active_model() == tiny_voice
    assert harness.swapped[-1].path == tiny_voice


def test_a_rollback_to_a_slot_whose_model_changed_changes_nothing(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """The previous slot's model replaced by other bytes: the rollback is refused `damaged`
    before anything is loaded, and the pointer stays where it was."""
    for number, gain in ((2, 0.006), (3, 0.007)):
        item = released(harness, key, number, gain=gain)
        assert harness.run(item.offer(url(harness, item)), f"o{number}").state == "installed"
    previous = harness.directory / "slots" / "a" / "voice2.onnx"
    previous.unlink()
    previous.write_bytes(b"not a model")
    report = harness.run({"rollback": True}, "back")
    assert (report.state, report.reason) == ("failed", "damaged")
    assert "slots/a/voice2.onnx no longer has the digest" in report.detail
    assert (load_state(harness.directory).release, len(harness.swapped)) == (3, 2)


def test_a_download_complete_before_a_restart_is_only_checked(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """Killed after the last byte, before the rename: no request for that file again."""
    item = released(harness, key, 2)
    staging = harness.directory / "staging"
    staging.mkdir(parents=True)
    digest = hashlib.sha256(item.model.read_bytes()).hexdigest()
    (staging / f"{digest}.part").write_bytes(item.model.read_bytes())
    assert harness.run(item.offer(url(harness, item))).state == "installed"
    names = [name for name, _ in harness.server.behaviour.requests]
    assert item.model.name not in names, names


def test_the_running_offer_delivered_again_is_ignored(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """QoS 1 redelivery of the offer being carried out: no `busy` under its own id."""
    item = released(harness, key, 2)
    harness.server.behaviour.bytes_per_second = 2000
    harness.updater.command("same", item.offer(url(harness, item)))
    wait_until(lambda: any(r.state == "downloading" for r in harness.reports), what="downloading")
    harness.updater.command("same", item.offer(url(harness, item)))
    harness.server.behaviour.bytes_per_second = None
    assert harness.final("same").state == "installed"
    assert [r.state for r in harness.finals("same")] == ["installed"]


def test_a_manifest_url_must_be_http(harness: Harness) -> None:
    """`file:` and other schemes are refused before anything is read."""
    report = harness.run({"manifest_url": "file:///etc/passwd", "base_url": "http://x/"})
    assert (report.state, report.reason) == ("failed", "malformed")


def test_failed_starts_leave_no_rollback_target_and_leftovers_are_removed(
    tmp_path: Path, tiny_voice: Path
) -> None:
    """After the automatic rollback the slot that failed is no target; at start, a slot that
    is neither active nor previous and temporary state files are removed."""
    config = OtaConfig(trusted_keys=("x",), max_start_attempts=1)
    directory = tmp_path / "ota"
    state = load_state(directory)
    state.release, state.active, state.model, state.version = 4, "b", "voice4.onnx", "4.0"
    state.previous, state.previous_release, state.previous_model = "a", 3, "voice3.onnx"
    state.model_sha256 = state.previous_model_sha256 = MODEL_SHA256
    state.pending = Pending("b", 4, "4.0", offer="o4")
    save_state(directory, state)
    installed(directory, "b", "voice4.onnx")
    installed(directory, "a", "voice3.onnx")
    for _ in range(2):
        start_model(config, directory, tiny_voice)
    after = load_state(directory)
    assert (after.active, after.previous, after.reports[0]["offer"]) == ("a", None, "o4")
    (directory / "slots" / "b").mkdir(parents=True, exist_ok=True)
    (directory / "leftover.partial").write_text("{", encoding="utf-8")
    trusting = OtaConfig(trusted_keys=(release.public_text(Ed25519PrivateKey.generate()),))
    updater = Updater(
        trusting, directory, tiny_voice, 22050, 1, lambda _r: None, load_prewarmed, lambda _v: True
    )
    updater.start()
    updater.stop()
    assert sorted(p.name for p in (directory / "slots").iterdir()) == ["a"]
    assert not list(directory.glob("*.partial"))


def test_download_progress_is_reported_once_per_percent(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """A 1 MB model arriving 256 bytes at a time (4,000 reads): at most one report a percent."""
    source = harness.server.directory / "src-big"
    source.mkdir(parents=True)
    model = source / "big.onnx"
    model.write_bytes(os.urandom(1 << 20))  # not a model: only the download is looked at
    Path(f"{model}.json").write_text("{}", encoding="utf-8")
    envelope = release.sign(release.build_manifest(model, 2, "2.0"), [key])
    directory = release.publish_release(harness.server.directory / "r-big", model, envelope)
    harness.server.behaviour.bytes_per_second = 50_000_000
    body = {"manifest": json.loads(envelope), "base_url": f"{harness.server.url}{directory.name}/"}
    assert harness.run(body).reason == "health_check"
    progress = [r.progress for r in harness.reports if r.state == "downloading"]
    assert len(progress) == len(set(progress)) <= 101
    assert progress[-1] == 100


# ---- never down: OTA control, damaged and revoked models, staging -----------------------------


def test_a_manifest_url_that_redirects_to_another_host_is_refused(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """The manifest is fetched before any signature can be checked: no redirect leaves
    `ota.hosts` (127.0.0.2 is another host, and a loopback address it does not name)."""
    item = released(harness, key, 2)
    port = harness.server.port
    harness.server.behaviour.redirect["r2/manifest.json"] = f"http://127.0.0.2:{port}/r2/x"
    body = {"manifest_url": f"{url(harness, item)}manifest.json", "base_url": url(harness, item)}
    report = harness.run(body)
    assert (report.state, report.reason) == ("failed", "download_failed")
    assert report.detail == f"manifest: refused_by_policy: {url(harness, item)}manifest.json"
    assert [name for name, _ in harness.server.behaviour.requests] == ["r2/manifest.json"]


@pytest.mark.parametrize("harness", [{"hosts": ()}], indirect=True)
def test_no_download_until_ota_hosts_names_the_release_server(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """`ota.hosts` empty: neither a manifest_url nor a base_url is fetched (a publisher on the
    ota topic cannot make the node fetch a URL before any signature is checked)."""
    item = released(harness, key, 2)
    for number, body in enumerate(
        [
            {"manifest_url": f"{url(harness, item)}manifest.json", "base_url": url(harness, item)},
            item.offer(url(harness, item)),
        ]
    ):
        report = harness.run(body, offer=f"o{number}")
        assert (report.state, report.reason) == ("failed", "url_not_allowed")
        assert "ota.hosts is empty" in report.detail
    assert harness.server.behaviour.requests == []
    assert harness.swapped == []


@pytest.mark.parametrize(
    "url_of",
    [
        "http://127.0.0.1:{port}/relay/0?turn=on",  # another port of the same host
        "http://localhost:{port}/r2/manifest.json",  # another name for it
        "http://169.254.169.254/latest/meta-data/",
        "http://operator:pw@127.0.0.1:{port}/r2/manifest.json",
    ],
)
def test_a_manifest_url_or_base_url_outside_ota_hosts_is_refused_before_any_request(
    harness: Harness, key: Ed25519PrivateKey, url_of: str
) -> None:
    item = released(harness, key, 2)
    port = harness.server.port
    other = url_of.format(port=port + 1 if "relay" in url_of else port)
    for number, body in enumerate(
        [{"manifest_url": other, "base_url": url(harness, item)}, item.offer(other)]
    ):
        report = harness.run(body, offer=f"o{number}")
        print(report.detail)
        assert (report.state, report.reason) == ("failed", "url_not_allowed")
        assert "pw" not in report.detail
        assert "turn=on" not in report.detail
    assert harness.server.behaviour.requests == []


def test_a_cancel_takes_effect_against_a_server_that_drips_bytes(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """One byte every two seconds is never a stall; the cancel still ends the download."""
    item = released(harness, key, 2)
    harness.server.behaviour.drip_seconds = 2.0
    harness.updater.command("drip", item.offer(url(harness, item)))
    wait_until(lambda: harness.server.behaviour.sent >= 1, what="the first byte")
    asked = time.monotonic()
    harness.updater.command("c", {"cancel": True})
    assert harness.final("drip").state == "cancelled"
    print(f"cancel against a dripping server: over {time.monotonic() - asked:.2f} s after asked")
    assert harness.swapped == []


@pytest.mark.parametrize("harness", [{"download_deadline": 3.0}], indirect=True)
def test_a_server_that_drips_bytes_is_cut_by_the_download_deadline(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    item = released(harness, key, 2)
    harness.server.behaviour.drip_seconds = 0.5
    report = harness.run(item.offer(url(harness, item)))
    assert (report.state, report.reason) == ("failed", "download_failed")
    assert "timeout" in report.detail


@pytest.mark.allow_error_logs(r"Release \d+ cannot be used \(damaged\)")
def test_a_damaged_installed_model_falls_back_to_the_previous_verified_slot(
    tmp_path: Path, tiny_voice: Path
) -> None:
    """The active slot's model no longer has its digest (a bad SD card sector): the previous
    slot, which still has its own, is started instead, and `rolled_back` `damaged` reported."""
    directory = tmp_path / "ota"
    good = installed(directory, "a", "voice3.onnx", b"release three")
    installed(directory, "b", "voice4.onnx", b"release four, now damaged")
    state = load_state(directory)
    state.release, state.active, state.model, state.version = 4, "b", "voice4.onnx", "4.0"
    state.model_sha256 = hashlib.sha256(b"release four").hexdigest()
    state.previous, state.previous_release, state.previous_model = "a", 3, "voice3.onnx"
    state.previous_model_sha256 = hashlib.sha256(b"release three").hexdigest()
    save_state(directory, state)
    assert start_model(OtaConfig(trusted_keys=("x",)), directory, tiny_voice) == good
    after = load_state(directory)
    assert (after.release, after.active, after.previous) == (3, "a", None)
    assert (after.reports[0]["state"], after.reports[0]["reason"]) == ("rolled_back", "damaged")


@pytest.mark.allow_error_logs(r"Release \d+ cannot be used \(damaged\)")
def test_a_damaged_model_with_no_good_previous_falls_back_to_the_configured_one(
    tmp_path: Path, tiny_voice: Path
) -> None:
    directory = tmp_path / "ota"
    state = load_state(directory)
    state.release, state.active, state.model, state.version = 4, "b", "gone.onnx", "4.0"
    save_state(directory, state)  # its file is missing altogether
    assert start_model(OtaConfig(trusted_keys=("x",)), directory, tiny_voice) == tiny_voice
    assert load_state(directory).release == 0
    assert fall_back(directory, tiny_voice, "does not load") == tiny_voice  # and stays there


def revocation(key: Ed25519PrivateKey, min_release: int = 0, revoked: tuple[int, ...] = ()) -> Any:
    """A signed revocation envelope, as the operator's tool makes it."""
    body = {
        "format": 1,
        "kind": "revocation",
        "issued": datetime.now(UTC).isoformat(),
        "target": {"device_class": "voice-agent"},
        "min_release": min_release,
        "revoked": list(revoked),
    }
    return json.loads(manifests.sign(json.dumps(body).encode(), [key]))


def test_a_revoked_release_is_left_at_once_and_never_installed_again(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    item = released(harness, key, 2)
    assert harness.run(item.offer(url(harness, item)), "o2").state == "installed"
    unsigned = revocation(Ed25519PrivateKey.generate(), revoked=(2,))
    assert harness.run({"revocation": unsigned}, "fake").reason == "unknown_key"
    assert harness.run({"revocation": revocation(key, revoked=(2,))}, "rv").reason == "revoked"
    assert load_state(harness.directory).release == 0  # back on the configured model
    assert len(harness.swapped) == 2  # to release 2, then away from it
    again = harness.run(item.offer(url(harness, item)), "o2b")
    assert (again.state, again.reason) == ("failed", "revoked")
    assert start_model(harness.updater._config, harness.directory, Path("factory")).name == (
        "factory"
    )


@pytest.mark.allow_error_logs(r"Release \d+ cannot be used \(revoked\)")
def test_an_installed_release_revoked_while_the_node_was_down_is_left_at_start(
    tmp_path: Path, tiny_voice: Path
) -> None:
    directory = tmp_path / "ota"
    installed(directory, "a", "voice3.onnx")
    state = load_state(directory)
    state.release, state.active, state.model, state.version = 3, "a", "voice3.onnx", "3.0"
    state.revocation = {"issued": "2026-01-01T00:00:00+00:00", "min_release": 4, "revoked": []}
    save_state(directory, state)
    assert start_model(OtaConfig(trusted_keys=("x",)), directory, tiny_voice) == tiny_voice
    report = load_state(directory).reports[0]
    assert (report["state"], report["reason"]) == ("rolled_back", "revoked")


def test_staged_downloads_of_releases_never_installed_are_removed_after_a_while(
    tmp_path: Path, tiny_voice: Path
) -> None:
    directory = tmp_path / "ota"
    staging = directory / "staging"
    staging.mkdir(parents=True)
    old, recent = staging / ("a" * 64), staging / ("b" * 64 + ".part")
    old.write_bytes(b"x")
    recent.write_bytes(b"y")
    week = time.time() - 8 * 86400
    os.utime(old, (week, week))
    trusting = OtaConfig(trusted_keys=(release.public_text(Ed25519PrivateKey.generate()),))
    updater = Updater(
        trusting, directory, tiny_voice, 22050, 1, lambda _r: None, load_prewarmed, lambda _v: True
    )
    updater.start()
    updater.stop()
    assert [p.name for p in staging.iterdir()] == [recent.name]


# ---- tiers carried by a release (issue 35: "a tier a small board gets without building it") ----

_TIER_FILES = [
    {"path": "v.int8.onnx", "length": 10, "sha256": "c" * 64},
    {"path": "v.int8.onnx.json", "length": 10, "sha256": "b" * 64},
    {"path": "v.int8.result.json", "length": 10, "sha256": "d" * 64},
]


def test_a_manifest_carries_tiers_signed_with_the_model(key: Ed25519PrivateKey) -> None:
    tiers = [{"name": "int8", "requires": ["avx512_vnni", "avx_vnni"], "files": _TIER_FILES}]
    read = manifests.verify(_envelope(_body(tiers=tiers), key), _trusted(key))
    assert isinstance(read, Manifest), read
    (tier,) = read.tiers
    assert (tier.name, tier.requires) == ("int8", ("avx512_vnni", "avx_vnni"))
    assert (tier.variant.path, tier.json.path) == ("v.int8.onnx", "v.int8.onnx.json")
    assert tier.result is not None
    assert tier.result.path == "v.int8.result.json"
    assert read.total_bytes == 50  # the tiers' files are downloaded too
    assert manifests.verify(_envelope(_body(), key), _trusted(key)).tiers == ()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "tiers",
    [
        [{"name": "INT8!", "files": _TIER_FILES}],  # not a plain name
        [{"name": "int8", "files": _TIER_FILES[:1]}],  # no .onnx.json
        [{"name": "int8", "files": [*_TIER_FILES, {**_TIER_FILES[2], "path": "w.json"}]}],
        [{"name": "int8", "files": [{**_TIER_FILES[0], "path": "../x.onnx"}, _TIER_FILES[1]]}],
        [{"name": "int8", "files": [{**_TIER_FILES[0], "path": "v.onnx"}, _TIER_FILES[1]]}],
        [{"name": "int8", "requires": ["no such flag!"], "files": _TIER_FILES}],
        [{"name": "int8", "files": _TIER_FILES}, {"name": "int8", "files": _TIER_FILES}],
        [{"name": f"t{i}", "files": _TIER_FILES} for i in range(5)],
        {"name": "int8"},
    ],
)
def test_malformed_tiers_refuse_the_whole_manifest(key: Ed25519PrivateKey, tiers: Any) -> None:
    """A tier whose name or files are not plain, whose file repeats another (the model's
    included), without its JSON, with flags that are no flag names, too many: malformed."""
    assert _reason(manifests.verify(_envelope(_body(tiers=tiers), key), _trusted(key))) == (
        "malformed"
    )


def _tiered_release(harness: Harness, key: Ed25519PrivateKey, requires: list[str]) -> Release:
    """Release 2 of a tiny voice with an `int8` tier (another tiny voice stands for the
    variant: the updater never looks inside), served by the harness's server."""
    root = harness.server.directory
    source = root / "src2"
    source.mkdir(parents=True, exist_ok=True)
    model = write_tiny_voice(source, "voice2.onnx", gain=0.006)
    variant = write_tiny_voice(source, "voice2.int8.onnx", gain=0.005)
    result = {"tier": "int8", "requires": requires, "distance_db": 1.0, "speedup": 1.5}
    (source / "voice2.int8.result.json").write_text(json.dumps(result), encoding="utf-8")
    body = release.build_manifest(model, 2, "2.0", tiers=[variant])
    envelope = release.sign(body, [key])
    directory = release.publish_release(root / "r2", model, envelope, tiers=[variant])
    return Release(envelope, directory, model)


def test_an_installed_release_offers_its_tiers_while_their_signed_files_are_whole(
    harness: Harness, key: Ed25519PrivateKey
) -> None:
    """The release's tier is downloaded and installed into the slot beside the model, with
    the signed envelope; at start it is offered only while each of its files is the one the
    manifest signed and the CPU has what it relies on. A damaged tier is refused with its
    reason, and the model's slot stays usable (the tier is no part of the model's files)."""
    item = _tiered_release(harness, key, ["avx512_vnni", "avx_vnni"])
    report = harness.run(item.offer(url(harness, item)))
    assert report.state == "installed", report
    state = load_state(harness.directory)
    trusted = [release.public_text(key)]
    found = release_tiers.carried(harness.directory, state, trusted, frozenset({"avx_vnni"}))
    (tier,) = found.tiers
    assert (tier.name, tier.release, found.refused) == ("int8", 2, ())
    assert tier.path == harness.directory / "slots" / str(state.active) / "voice2.int8.onnx"
    assert tier.path.read_bytes() == (item.directory / "voice2.int8.onnx").read_bytes()

    without = release_tiers.carried(harness.directory, state, trusted, frozenset({"avx2"}))
    assert without.tiers == ()
    assert "none of avx512_vnni, avx_vnni" in without.refused[0]
    elsewhere = release_tiers.carried(harness.directory, state, trusted, frozenset(), "aarch64")
    assert len(elsewhere.tiers) == 1  # x86's flags ask nothing of another machine

    other_key = Ed25519PrivateKey.generate()
    untrusted = release_tiers.carried(
        harness.directory, state, [release.public_text(other_key)], frozenset({"avx_vnni"})
    )
    assert untrusted.tiers == ()
    assert "trusted" in untrusted.refused[0]

    json_file = Path(f"{tier.path}.json")
    voice = json.loads(json_file.read_text(encoding="utf-8"))
    voice["inference"] = {"length_scale": 3.0}
    json_file.unlink()  # the model's JSON has the same bytes: one file, linked under both names
    json_file.write_text(json.dumps(voice), encoding="utf-8")  # a forged JSON of its own
    damaged = release_tiers.carried(harness.directory, state, trusted, frozenset({"avx_vnni"}))
    assert damaged.tiers == ()
    assert "no longer has the digest" in damaged.refused[0]
    assert slot_problem(harness.directory, state) is None  # the model itself is whole
