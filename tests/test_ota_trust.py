"""Model updates against a revoked release, a damaged disk and a hostile update directory, with
the real agent on a real broker and signed releases: every point that picks a model (a
rollback, a second rollback, a rollback with no target, the start, a revocation of the active
release, a model that does not load) never picks a revoked release or a slot whose files lost
their digests (truncated, a flipped byte, replaced by a link to the right bytes, the slot
itself a link); `state.json` damaged or hostile never stops a start; links planted in the
staging area are never followed. After each, the agent speaks a control message.

The slots are laid out as the updater leaves them (`seed`: the release's files and the state
with their digests) where a real install adds nothing to the case; the issue's own case
(releases 2 and 3 installed over the air, 2 revoked) goes through real installs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from wyoming.audio import AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from agent.core.states import FINAL_PHASES
from agent.updates.update_store import UpdateState, save_state
from harness import free_port, wait_until
from ota import release
from tests.conftest import RunningAgent, StartAgent
from tests.release_server import ReleaseServer
from tests.test_ota import Release, make_release, revocation
from tests.test_ota_fleet import speaks as state_after_speaking

DAMAGES = ("truncated", "flipped", "json_changed", "symlink", "slot_symlink")
"""How a slot is damaged: its model cut in half, one bit of it flipped, its voice JSON
changed, the model replaced by a link to a copy of the very same bytes (refused all the same),
the slot directory replaced by a link to a copy of itself."""


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    """The fleet's release signing key."""
    return Ed25519PrivateKey.generate()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    """The release server on the LAN."""
    started = ReleaseServer(tmp_path / "releases").start()
    yield started
    started.stop()


@pytest.fixture
def releases(server: ReleaseServer, key: Ed25519PrivateKey) -> dict[int, Release]:
    """Releases 2 and 3, signed and published (each its own model, so its own digest)."""
    return {n: make_release(server.directory, key, n, gain=0.004 + n / 1000) for n in (2, 3)}


@dataclass
class Setup:
    """What every test here starts from: the agent starter, the release server and its
    signed releases 2 and 3, the key, the test's directory, the configured (tiny) voice."""

    start_agent: StartAgent
    server: ReleaseServer
    releases: dict[int, Release]
    key: Ed25519PrivateKey
    tmp_path: Path
    tiny_voice: Path

    def start(self, node: str) -> RunningAgent:
        """Start the agent of `node` on the configured voice, trusting the key."""
        sections = ota_section(self.key, self.server.port)
        return self.start_agent(self.tiny_voice, node_id=node, sections=sections)


@pytest.fixture
def setup(  # noqa: PLR0917 - the fixtures the tests share
    start_agent: StartAgent,
    server: ReleaseServer,
    releases: dict[int, Release],
    key: Ed25519PrivateKey,
    tmp_path: Path,
    tiny_voice: Path,
) -> Setup:
    """See `Setup`."""
    return Setup(start_agent, server, releases, key, tmp_path, tiny_voice)


def ota_section(key: Ed25519PrivateKey, port: int) -> dict[str, dict[str, Any]]:
    """The agent config section that trusts `key` and fetches from the release server."""
    ota = {"trusted_keys": [release.public_text(key)], "health_timeout": 60}
    return {"ota": {**ota, "hosts": [f"127.0.0.1:{port}"]}}


def ota_dir(tmp_path: Path, node: str) -> Path:
    """Where the agent of `node` keeps its update state (the harness's storage)."""
    return tmp_path / "storage" / "ota" / node


def sha256(path: Path) -> str:
    """The file's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def seed(
    directory: Path,
    active: tuple[int, Release] | None,
    previous: tuple[int, Release] | None = None,
    revoked: tuple[int, ...] = (),
) -> None:
    """An update directory as the updater leaves it after installing `previous` into slot a,
    then `active` into slot b (each slot's files with their digests in the state)."""
    shutil.rmtree(directory, ignore_errors=True)
    state = UpdateState()
    if revoked:
        issued = (datetime.now(UTC) - timedelta(days=1)).isoformat()
        state.revocation = {"issued": issued, "min_release": 0, "revoked": list(revoked)}
    for slot, entry in (("a", previous), ("b", active)):
        if entry is None:
            continue
        number, item = entry
        folder = directory / "slots" / slot
        folder.mkdir(parents=True)
        files = {}
        for name in (item.model.name, f"{item.model.name}.json"):
            shutil.copyfile(item.directory / name, folder / name)
            files[name] = sha256(folder / name)
        fields = (number, f"{number}.0", slot, item.model.name, files[item.model.name], files)
        if slot == "a":
            (
                state.previous_release,
                state.previous_version,
                state.previous,
                state.previous_model,
                state.previous_model_sha256,
                state.previous_files,
            ) = fields
        else:
            (state.release, state.version, state.active, state.model, state.model_sha256) = fields[
                :5
            ]
            state.files = files
    save_state(directory, state)


def damage(directory: Path, slot: str, how: str, outside: Path) -> str:
    """Damage a slot's files `how` (see DAMAGES); the words the refusal names it with."""
    folder = directory / "slots" / slot
    model = next(folder.glob("*.onnx"))
    data = model.read_bytes()
    outside.mkdir(parents=True, exist_ok=True)
    if how == "truncated":
        model.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        model.write_bytes(data[:200] + bytes([data[200] ^ 0x10]) + data[201:])
    elif how == "json_changed":
        config = Path(f"{model}.json")
        body = json.loads(config.read_text(encoding="utf-8"))
        config.write_text(json.dumps(body | {"dataset": "changed"}), encoding="utf-8")
        return f"slots/{slot}/{model.name}.json no longer has the digest"
    elif how == "symlink":  # the very bytes it was installed with, behind a link
        copy = outside / f"{slot}-{model.name}"
        copy.write_bytes(data)
        model.unlink()
        model.symlink_to(copy)
        return f"slots/{slot}/{model.name} is a symbolic link"
    elif how == "slot_symlink":
        copy = outside / f"slot-{slot}"
        shutil.copytree(folder, copy)
        shutil.rmtree(folder)
        folder.symlink_to(copy, target_is_directory=True)
        return f"slots/{slot} is a symbolic link"
    else:
        raise ValueError(how)
    return f"slots/{slot}/{model.name} no longer has the digest"


def restore(directory: Path, slot: str, item: Release) -> None:
    """Put a slot's files back as they were installed."""
    folder = directory / "slots" / slot
    if folder.is_symlink():
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    for name in (item.model.name, f"{item.model.name}.json"):
        (folder / name).unlink(missing_ok=True)
        shutil.copyfile(item.directory / name, folder / name)


def updates(agent: RunningAgent, offer_id: str) -> list[dict[str, Any]]:
    """The final update events of an offer or command so far."""
    return [
        e
        for e in agent.watcher.events(offer_id)
        if e["event"] == "update" and e["state"] in FINAL_PHASES
    ]


def result(agent: RunningAgent, offer_id: str, state: str | None = None) -> dict[str, Any]:
    """Wait for the final update event of an offer (with `state`, if given); that event."""

    def found() -> list[dict[str, Any]]:
        return [e for e in updates(agent, offer_id) if state is None or e["state"] == state]

    wait_until(lambda: bool(found()) or not agent.process.alive(), what=f"result of {offer_id}")
    assert found(), (updates(agent, offer_id), agent.process.output()[-3000:])
    return found()[-1]


def results(agent: RunningAgent, offer_id: str, count: int) -> list[dict[str, Any]]:
    """Wait for `count` final update events of an offer; those events."""
    wait_until(lambda: len(updates(agent, offer_id)) >= count, what=f"{count} of {offer_id}")
    return updates(agent, offer_id)


def command(agent: RunningAgent, offer_id: str, **body: Any) -> dict[str, Any]:
    """Publish an update command on the node's ota topic; its final event."""
    agent.watcher.publish(agent.topics.ota, json.dumps({"id": offer_id, **body}).encode())
    return result(agent, offer_id)


def speaks(agent: RunningAgent, request_id: str) -> tuple[str, int]:
    """The control message: say something, wait until it finished; (model sha256, release)
    of a state published after it."""
    last = state_after_speaking(agent, request_id)
    return last["model_sha256"], last["model_release"]


def model_of(item: Release) -> tuple[str, int]:
    """(sha256, release) a state shows when `item` speaks."""
    return sha256(item.model), int(item.directory.name.removeprefix("r"))


def stop(agent: RunningAgent) -> None:
    """Stop the agent as systemd does."""
    agent.process.signal(signal.SIGTERM)
    agent.watcher.close()


# ---- rollback ------------------------------------------------------------------------------


def test_a_rollback_never_goes_to_a_revoked_release(setup: Setup) -> None:
    """The issue's case: releases 2 and 3 installed over the air, a signed revocation of 2
    (`noted`: 3 speaks). A rollback is refused `revoked`, and so is a second one; 3 goes on
    speaking, after a restart too."""
    server, releases, key = setup.server, setup.releases, setup.key
    agent = setup.start("revoked-target")
    for number in (2, 3):
        item = releases[number]
        body = item.offer(f"{server.url}{item.directory.name}/")
        assert command(agent, f"o{number}", **body)["state"] == "installed"
    noted = command(agent, "rv", revocation=revocation(key, revoked=(2,)))
    assert (noted["state"], noted["release"]) == ("noted", 3)
    for attempt in ("back", "back-again"):
        refused = command(agent, attempt, rollback=True)
        assert (refused["state"], refused["reason"]) == ("failed", "revoked"), refused
        assert "release 2" in refused["detail"]
        assert speaks(agent, f"after-{attempt}") == model_of(releases[3])
    agent.process.signal(signal.SIGTERM)
    agent.process.start()
    agent.wait_online()
    assert speaks(agent, "after-restart") == model_of(releases[3])


def test_a_rollback_to_a_damaged_slot_is_refused_and_the_model_speaking_goes_on(
    setup: Setup,
) -> None:
    """2 in slot a (the rollback target), 3 active in slot b. Each damage of slot a refuses the
    rollback `damaged`, naming the file; 3 speaks after each. Slot a put back, the rollback
    goes to 2, and a second rollback back to 3."""
    releases, tmp_path = setup.releases, setup.tmp_path
    node = "damaged-target"
    directory = ota_dir(tmp_path, node)
    seed(directory, (3, releases[3]), (2, releases[2]))
    agent = setup.start(node)
    assert speaks(agent, "first") == model_of(releases[3])
    for how in DAMAGES:
        words = damage(directory, "a", how, tmp_path / "outside")
        refused = command(agent, f"back-{how}", rollback=True)
        assert (refused["state"], refused["reason"]) == ("failed", "damaged"), (how, refused)
        assert words in refused["detail"], (how, refused["detail"])
        assert speaks(agent, f"control-{how}") == model_of(releases[3]), how
        restore(directory, "a", releases[2])
    back = command(agent, "back", rollback=True)
    assert (back["state"], back["release"]) == ("rolled_back", 2)
    assert speaks(agent, "on-2") == model_of(releases[2])
    again = command(agent, "back-again", rollback=True)
    assert (again["state"], again["release"]) == ("rolled_back", 3)
    assert speaks(agent, "on-3") == model_of(releases[3])


# ---- the start --------------------------------------------------------------------------------


@pytest.mark.allow_error_logs(r"Release \d+ cannot be used \(damaged\)")
@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_active_slot_is_left_at_start_for_a_sound_previous_one(
    how: str,
    setup: Setup,
) -> None:
    """Slot b (release 3, active) damaged while the node was down: the start takes release 2
    from slot a at once, reports `rolled_back`, `damaged` (naming the file), and 2 speaks.
    With slot a damaged too, the configured model speaks."""
    releases, tmp_path, tiny_voice = setup.releases, setup.tmp_path, setup.tiny_voice
    node = f"start-{how.replace('_', '-')}"
    directory = ota_dir(tmp_path, node)
    seed(directory, (3, releases[3]), (2, releases[2]))
    words = damage(directory, "b", how, tmp_path / "outside")
    agent = setup.start(node)
    left = result(agent, "start", "rolled_back")
    assert (left["reason"], left["release"]) == ("damaged", 3), left
    assert words in left["detail"]
    assert speaks(agent, "on-2") == model_of(releases[2])
    stop(agent)

    seed(directory, (3, releases[3]), (2, releases[2]))
    damage(directory, "b", how, tmp_path / "outside-b")
    damage(directory, "a", "flipped", tmp_path / "outside-a")
    agent = setup.start(node)
    left = result(agent, "start", "rolled_back")
    assert "not release 2: slots/a/" in left["detail"], left
    assert speaks(agent, "on-factory") == (sha256(tiny_voice), 0)
    assert not any(p.is_symlink() for p in (directory / "slots").rglob("*"))  # removed


@pytest.mark.allow_error_logs(r"Release \d+ cannot be used \(revoked\)")
def test_a_revoked_active_release_at_start_is_never_left_for_a_revoked_previous_one(
    setup: Setup,
) -> None:
    """The kept revocation withdraws 2 and 3 (the node was down when it came): the start takes
    the configured model, not 2."""
    releases, tmp_path, tiny_voice = setup.releases, setup.tmp_path, setup.tiny_voice
    node = "start-revoked"
    seed(ota_dir(tmp_path, node), (3, releases[3]), (2, releases[2]), revoked=(2, 3))
    agent = setup.start(node)
    left = result(agent, "start", "rolled_back")
    assert (left["reason"], left["release"]) == ("revoked", 3)
    assert "not release 2: release 2 was revoked" in left["detail"]
    assert speaks(agent, "on-factory") == (sha256(tiny_voice), 0)


@pytest.mark.allow_error_logs(
    r"Release \d+ cannot be used \(damaged\)", r"The installed model \S+ does not load"
)
def test_an_installed_model_that_does_not_load_is_left_for_the_next_that_does(setup: Setup) -> None:
    """Slot b holds bytes that are not a model but have the digests recorded for them (as if
    a broken model had been installed): the load fails, release 2 loads instead. With slot a
    the same, the configured model: never a failed start."""
    releases, tmp_path, tiny_voice = setup.releases, setup.tmp_path, setup.tiny_voice
    node = "not-loading"
    directory = ota_dir(tmp_path, node)
    for broken in (("b",), ("b", "a")):
        seed(directory, (3, releases[3]), (2, releases[2]))
        state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        for slot in broken:
            model = next((directory / "slots" / slot).glob("*.onnx"))
            model.write_bytes(b"not an onnx model")
            key_of = "files" if slot == "b" else "previous_files"
            state[key_of][model.name] = sha256(model)
            state["model_sha256" if slot == "b" else "previous_model_sha256"] = sha256(model)
        (directory / "state.json").write_text(json.dumps(state), encoding="utf-8")
        agent = setup.start(node)
        left = results(agent, "start", len(broken))
        assert [(e["state"], e["reason"]) for e in left] == [("rolled_back", "damaged")] * len(
            broken
        ), left
        assert [e["release"] for e in left] == [3, 2][: len(broken)]
        expected = model_of(releases[2]) if broken == ("b",) else (sha256(tiny_voice), 0)
        assert speaks(agent, f"control-{len(broken)}") == expected
        stop(agent)


# ---- a revocation of the active release ------------------------------------------------------


@pytest.mark.parametrize(
    ("previous_is", "revoked"),
    [("sound", (3,)), ("damaged", (3,)), ("revoked", (2, 3)), ("a link", (3,))],
)
def test_a_revocation_of_the_active_release_lands_on_a_sound_release_only(
    previous_is: str,
    revoked: tuple[int, ...],
    setup: Setup,
) -> None:
    """3 active, 2 the rollback target; a signed revocation of 3 arrives: the node goes to 2
    only if 2 is neither revoked nor damaged, else to the configured model; a rollback after
    the configured model has nothing to go to."""
    releases, key, tmp_path, tiny_voice = (
        setup.releases,
        setup.key,
        setup.tmp_path,
        setup.tiny_voice,
    )
    node = f"revoke-{previous_is.replace(' ', '-')}"
    directory = ota_dir(tmp_path, node)
    seed(directory, (3, releases[3]), (2, releases[2]))
    agent = setup.start(node)
    assert speaks(agent, "before") == model_of(releases[3])
    if previous_is == "damaged":
        damage(directory, "a", "truncated", tmp_path / "outside")
    elif previous_is == "a link":
        damage(directory, "a", "symlink", tmp_path / "outside")
    left = command(agent, "rv", revocation=revocation(key, revoked=revoked))
    assert (left["state"], left["reason"]) == ("rolled_back", "revoked"), left
    if previous_is == "sound":
        assert left["release"] == 2
        assert speaks(agent, "after") == model_of(releases[2])
        return
    assert left["release"] == 0
    assert "not release 2" in left["detail"]
    assert speaks(agent, "after") == (sha256(tiny_voice), 0)
    nothing = command(agent, "back", rollback=True)
    assert (nothing["state"], nothing["reason"]) == ("failed", "nothing_to_roll_back")
    assert speaks(agent, "after-rollback") == (sha256(tiny_voice), 0)


# ---- state.json damaged or hostile ---------------------------------------------------------


def _valid_state() -> dict[str, Any]:
    """A state as the updater writes it (release 3 in slot b, files that exist nowhere)."""
    files = {"voice3.onnx": "a" * 64, "voice3.onnx.json": "b" * 64}
    state = UpdateState(3, "3.0", "b", "voice3.onnx", files=files, model_sha256="a" * 64)
    return asdict(state)


HOSTILE_STATES: dict[str, Any] = {
    "release a string": lambda s: s | {"release": "3"},
    "release 400 digits": lambda s: s | {"release": 10**400},
    "release negative": lambda s: s | {"release": -1},
    "release a float": lambda s: s | {"release": 3.0},
    "release NaN": lambda s: s | {"release": float("nan")},
    "release true": lambda s: s | {"release": True},
    "active outside the slots": lambda s: s | {"active": "../../.."},
    "model a path": lambda s: s | {"model": "../../../etc/passwd.onnx"},
    "files not digests": lambda s: s | {"files": {"voice3.onnx": 7}},
    "pending attempts text": lambda s: (
        s | {"pending": {"slot": "b", "release": 3, "version": "3.0", "attempts": "x"}}
    ),
    "revocation min_release text": lambda s: (
        s
        | {"revocation": {"issued": "2026-01-01T00:00:00+00:00", "min_release": "x", "revoked": []}}
    ),
    "revocation issued year 99999": lambda s: (
        s | {"revocation": {"issued": "99999-01-01", "min_release": 0, "revoked": []}}
    ),
    "version a lone surrogate": lambda s: s | {"version": "\ud800"},
    "version control characters": lambda s: s | {"version": "3\x1b[2J"},
    "an array": lambda s: [s],
    "deep JSON": b"[" * 100_000 + b"]" * 100_000,
    "not UTF-8": b'{"release": 3, "version": "\xff\xfe"}',
    "over a MiB": b'{"release": 0, "version": "' + b"x" * (2 << 20) + b'"}',
    "truncated": b'{"release": 3, "act',
    "empty": b"",
}
"""What someone with disk access (or a bad card) leaves in state.json: each one alone is
refused as a whole (a start on the configured model)."""


def _write_hostile(path: Path, case: str) -> None:
    made = HOSTILE_STATES[case]
    if isinstance(made, bytes):
        path.write_bytes(made)
    else:
        path.write_text(json.dumps(made(_valid_state())), encoding="utf-8")


PLANTED: tuple[str, ...] = ("a link to a valid state", "a directory", "a FIFO")
"""Not a file at all where state.json goes."""
THROUGH_THE_AGENT: tuple[str, ...] = (
    "release a string",
    "release 400 digits",
    "active outside the slots",
    "version a lone surrogate",
    "deep JSON",
    "not UTF-8",
    "over a MiB",
    *PLANTED,
)
"""One case of each class with the agent (every one of HOSTILE_STATES, and generated ones,
in-process: tests/test_update_store.py)."""


@pytest.mark.allow_error_logs(r"state\.json.*: set aside, the configured model speaks$")
@pytest.mark.parametrize("case", THROUGH_THE_AGENT)
def test_a_damaged_or_hostile_state_file_never_stops_the_start(
    case: str,
    setup: Setup,
) -> None:
    """The agent comes up on the configured model, reports `rolled_back`, `state_damaged`
    (id `start`), sets the file aside, speaks; the next start is a clean one (tried for two
    of the cases)."""
    releases, tmp_path, tiny_voice = setup.releases, setup.tmp_path, setup.tiny_voice
    node = "hostile-state"
    directory = ota_dir(tmp_path, node)
    seed(directory, (3, releases[3]), (2, releases[2]))  # slots that a valid state would pick
    path = directory / "state.json"
    if case in HOSTILE_STATES:
        _write_hostile(path, case)
    elif case == "a link to a valid state":
        real = tmp_path / "elsewhere.json"
        path.rename(real)
        path.symlink_to(real)
    elif case == "a directory":
        path.unlink()
        (path / "inner").mkdir(parents=True)
    else:
        path.unlink()
        os.mkfifo(path)
    agent = setup.start(node)
    said = result(agent, "start", "rolled_back")
    assert said["reason"] == "state_damaged", said
    assert "\ud800" not in json.dumps(said, ensure_ascii=False)
    assert speaks(agent, "control") == (sha256(tiny_voice), 0)
    if case == "a link to a valid state":
        assert (tmp_path / "elsewhere.json").is_file()  # the link moved aside, never followed
    if case not in {"deep JSON", "a directory"}:
        return
    stop(agent)
    agent = setup.start(node)
    assert speaks(agent, "clean") == (sha256(tiny_voice), 0)
    assert not [e for e in agent.watcher.events("start") if e.get("reason") == "state_damaged"]


@pytest.mark.allow_error_logs("state.json: set aside the rollback target")
def test_an_unusable_rollback_target_in_the_state_is_dropped_and_the_active_kept(
    setup: Setup,
) -> None:
    """Only the rollback target is wrong (its slot is the active one): it is dropped (`noted`,
    `state_damaged`), release 3 speaks, and a rollback goes to the configured model."""
    releases, tmp_path = setup.releases, setup.tmp_path
    node = "bad-previous"
    directory = ota_dir(tmp_path, node)
    seed(directory, (3, releases[3]), (2, releases[2]))
    state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
    (directory / "state.json").write_text(json.dumps(state | {"previous": "b"}), encoding="utf-8")
    agent = setup.start(node)
    noted = result(agent, "start", "noted")
    assert noted["reason"] == "state_damaged"
    assert "rollback target" in noted["detail"]
    assert speaks(agent, "on-3") == model_of(releases[3])
    back = command(agent, "back", rollback=True)
    assert (back["state"], back["release"]) == ("rolled_back", 0)


# ---- links in the staging area ---------------------------------------------------------------


@pytest.mark.allow_error_logs(
    r"was a symbolic link \(never followed\)$",
    r"refused a file: \S+ is a symbolic link \(refused, not followed\)$",
)
def test_links_planted_in_the_staging_area_are_never_followed(setup: Setup) -> None:
    """`staging` itself a link to a folder of old files: the start's clean-up removes the link,
    not one of those files (`noted`, `unsafe_file`). A `.part` planted as a link to a file
    outside: the download refuses it (`failed`, `unsafe_file`), the file is untouched; the next
    start removes the link and the offer then installs."""
    server, releases, tmp_path, tiny_voice = (
        setup.server,
        setup.releases,
        setup.tmp_path,
        setup.tiny_voice,
    )
    node = "staging-links"
    directory = ota_dir(tmp_path, node)
    outside = tmp_path / "outside"
    outside.mkdir()
    old = [outside / f"keep{i}" for i in range(10)]
    week = datetime.now(UTC).timestamp() - 8 * 86400
    for path in old:
        path.write_bytes(b"not the updater's")
        os.utime(path, (week, week))
    directory.mkdir(parents=True)
    (directory / "staging").symlink_to(outside, target_is_directory=True)
    agent = setup.start(node)
    noted = result(agent, "start", "noted")
    assert (noted["reason"], noted["detail"]) == (
        "unsafe_file",
        "staging was a symbolic link: removed, never followed",
    )
    assert all(path.read_bytes() == b"not the updater's" for path in old)
    assert speaks(agent, "control") == (sha256(tiny_voice), 0)

    item = releases[2]
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    (directory / "staging").mkdir(exist_ok=True)
    (directory / "staging" / f"{sha256(item.model)}.part").symlink_to(victim)
    body = item.offer(f"{server.url}{item.directory.name}/")
    refused = command(agent, "o2", **body)
    assert (refused["state"], refused["reason"]) == ("failed", "unsafe_file"), refused
    assert "is a symbolic link" in refused["detail"]
    assert victim.read_bytes() == b"precious"
    assert speaks(agent, "control-2") == (sha256(tiny_voice), 0)

    stop(agent)
    agent = setup.start(node)
    result(agent, "start", "noted")
    assert command(agent, "o2-again", **body)["state"] == "installed"
    assert victim.read_bytes() == b"precious"
    assert speaks(agent, "on-2") == model_of(item)


# ---- voice switches while Wyoming renders (issue 34, point 8) ---------------------------------


def test_rollbacks_while_wyoming_renders_leave_no_client_waiting(setup: Setup) -> None:
    """The render worker's command queue held 2: voice switches during a render (an install,
    then a rollback, ...) raised `queue.Full` in it, and every Wyoming client after waited
    forever. Through the agent: a client of the real `wyoming` library asks for a long text and
    reads nothing (the render waits on its socket: `wyoming.write_seconds` 120) while four
    rollbacks switch the voice between releases 3 and 2; then it reads its answer to
    `audio-stop`, a client after it is answered too, and the control message is spoken on the
    release the last rollback chose."""
    releases, tmp_path = setup.releases, setup.tmp_path
    node = "renders-switched"
    seed(ota_dir(tmp_path, node), (3, releases[3]), (2, releases[2]))
    port = free_port()
    sections = ota_section(setup.key, setup.server.port)
    sections["wyoming"] = {"enabled": True, "host": "127.0.0.1", "port": port, "write_seconds": 120}
    sections["speak"] = {"max_text_chars": 20_000, "max_audio_seconds": 1200}
    agent = setup.start_agent(setup.tiny_voice, node_id=node, sections=sections)
    agent.wait_voice_ready()
    long_text = " ".join(
        f"Part {n} of the long answer goes on, and then it ends." for n in range(300)
    )
    go = threading.Event()

    async def render(words: str, wait: threading.Event | None = None) -> list[str]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize(text=words).event())
            if wait is not None:  # the render fills the socket and waits on it meanwhile
                await asyncio.get_running_loop().run_in_executor(None, wait.wait, 240)
            kinds = []
            while (event := await asyncio.wait_for(client.read_event(), 240)) is not None:
                kinds.append(event.type)
                if AudioStop.is_type(event.type):
                    break
            return kinds

    held: list[list[str]] = []
    reader = threading.Thread(target=lambda: held.append(asyncio.run(render(long_text, go))))
    reader.start()
    try:
        time.sleep(2.0)  # the render under way, then stuck on the client's socket
        for n in range(4):
            back = command(agent, f"switch-{n}", rollback=True)
            assert back["state"] == "rolled_back", back
    finally:
        go.set()
        reader.join(300)
    assert not reader.is_alive(), "the held client still waits"
    after = asyncio.run(render("After the switches."))
    chunks = held[0].count("audio-chunk") if held else 0
    print(f"held render: {chunks} chunks, then {held[0][-1:] if held else None}; after: {after}")
    assert held, "the held client got no answer"
    assert held[0][-1] == "audio-stop", held
    assert after[-1] == "audio-stop", after
    assert "audio-chunk" in after
    assert speaks(agent, "control") == model_of(releases[3])  # 3 -> 2 -> 3 -> 2 -> 3
    assert agent.process.alive()
