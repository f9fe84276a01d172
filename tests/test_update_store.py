"""The updater's files in process: `state.json` as a person with disk access (or a bad card)
leaves it, generated (hypothesis, 300 examples of each of three strategies: any JSON type at
any depth in any field, integers of any size, NaN and infinities, lone surrogates, control
characters, raw bytes), read back without a failure and never picking a path outside the
slots; links and special files refused at every level of the update directory. (Through the
broker with the agent: test_ota_trust.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.settings.declarations import OtaConfig
from agent.updates import update_store as store
from agent.updates.clean_up import clean_up
from agent.updates.model_at_start import start_model
from agent.updates.update_store import Pending, UnsafeFileError, UpdateState, read_state, save_state
from tests import hostile
from tests.test_ota_trust import HOSTILE_STATES, _write_hostile

GENERATED = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
FACTORY = Path("/factory/voice.onnx")
CONFIG = OtaConfig(trusted_keys=("x",), max_start_attempts=2)

hostile_text = (
    st.text(max_size=20)
    | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
    | st.sampled_from(["a", "b", "../..", "voice3.onnx", "../x.onnx", "\x1b[2J", "a" * 64, ""])
    | st.text(min_size=129, max_size=200)
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(2**53 - 2, 2**53 + 2)
    | st.integers(10**100, 10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | hostile_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=16,
)
FIELDS = [f.name for f in fields(UpdateState)]


def _valid() -> dict[str, Any]:
    """A state as the updater writes it: 3 active in slot b, 2 the target in slot a, a pending
    switch, a revocation, a kept result."""
    state = UpdateState(
        release=3,
        version="3.0",
        active="b",
        model="voice3.onnx",
        previous="a",
        previous_release=2,
        previous_version="2.0",
        previous_model="voice2.onnx",
        pending=Pending("b", 3, "3.0", 1, "o3"),
        reports=[
            {"offer": "o1", "state": "installed", "detail": "", "release": 1}
            | {"reason": None, "version": None}
        ],
        model_sha256="a" * 64,
        previous_model_sha256="b" * 64,
        revocation={"issued": "2026-01-01T00:00:00+00:00", "min_release": 0, "revoked": [1]},
        files={"voice3.onnx": "a" * 64, "voice3.onnx.json": "c" * 64},
        previous_files={"voice2.onnx": "b" * 64, "voice2.onnx.json": "d" * 64},
    )
    return asdict(state)


def _picks_only_the_slots(directory: Path) -> None:
    """The property: reading never fails; what was read saves and reads back the same; the
    start picks the configured model or a plain .onnx name in slot a or b."""
    found = read_state(directory)
    assert isinstance(found.state, UpdateState)
    save_state(directory, found.state)
    again = read_state(directory)
    assert (again.unusable, again.set_aside, again.state) == (None, (), found.state)
    json.dumps(asdict(found.state), ensure_ascii=False).encode("utf-8")  # no lone surrogate
    chosen = start_model(CONFIG, directory, FACTORY)
    if chosen != FACTORY:
        assert chosen.parent.parent == directory / "slots"
        assert chosen.parent.name in store.SLOTS
        assert chosen.suffix == ".onnx"


@GENERATED
@given(name=st.sampled_from([*FIELDS, "unknown"]), value=json_values)
@pytest.mark.allow_error_logs(
    r"Release \d+ cannot be used \((damaged|revoked)\)",
    r"state\.json.*: set aside, the configured model speaks$",
)
def test_any_value_in_any_field_never_stops_a_start(name: str, value: Any) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        body = _valid() | {name: value}
        (directory / "state.json").write_text(json.dumps(body), encoding="utf-8")
        _picks_only_the_slots(directory)


@GENERATED
@given(document=json_values)
def test_any_json_document_never_stops_a_start(document: Any) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        (directory / "state.json").write_text(json.dumps(document), encoding="utf-8")
        _picks_only_the_slots(directory)


@GENERATED
@given(data=st.binary(max_size=400) | st.integers(1, 200_000).map(lambda n: b"[" * n))
def test_any_bytes_never_stop_a_start(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        (directory / "state.json").write_bytes(data)
        _picks_only_the_slots(directory)


@pytest.mark.allow_error_logs(r"state\.json.*: set aside, the configured model speaks$")
@pytest.mark.parametrize("case", HOSTILE_STATES)
def test_each_hostile_state_is_set_aside_for_the_configured_model(
    case: str, tmp_path: Path
) -> None:
    """Every case of test_ota_trust's table: the configured model, the file set aside, a
    `rolled_back` `state_damaged` result kept for after the start."""
    _write_hostile(tmp_path / "state.json", case)
    assert read_state(tmp_path).unusable is not None
    assert start_model(CONFIG, tmp_path, FACTORY) == FACTORY
    assert (tmp_path / "state.json.damaged").exists()
    (report,) = read_state(tmp_path).state.reports
    assert (report["state"], report["reason"]) == ("rolled_back", "state_damaged")


def test_a_valid_state_reads_back_whole(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps(_valid()), encoding="utf-8")
    found = read_state(tmp_path)
    assert (found.unusable, found.set_aside) == (None, ())
    assert asdict(found.state) == _valid()


def test_a_state_of_an_earlier_version_is_read_and_its_model_checked(tmp_path: Path) -> None:
    """No `files` (written before this version): the model is checked by `model_sha256`."""
    model = tmp_path / "slots" / "b" / "voice3.onnx"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"release three")
    body = {k: v for k, v in _valid().items() if k not in {"files", "previous_files"}}
    body |= {"model_sha256": hashlib.sha256(b"release three").hexdigest()}
    (tmp_path / "state.json").write_text(json.dumps(body), encoding="utf-8")
    state = read_state(tmp_path).state
    assert store.slot_problem(tmp_path, state) is None
    model.write_bytes(b"release thre3")
    problem = store.slot_problem(tmp_path, state)
    assert problem is not None
    assert (problem.reason, problem.detail) == (
        "damaged",
        "slots/b/voice3.onnx no longer has the digest it was installed with",
    )
    body.pop("model_sha256")
    (tmp_path / "state.json").write_text(json.dumps(body), encoding="utf-8")
    problem = store.slot_problem(tmp_path, read_state(tmp_path).state)
    assert problem is not None
    assert (problem.reason, problem.detail) == (
        "damaged",
        "slots/b: no digest was recorded for it",
    )


# ---- links and special files -----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """An update directory with slots/a/voice.onnx, and a copy of it outside."""
    root = tmp_path / "ota"
    (root / "slots" / "a").mkdir(parents=True)
    (root / "slots" / "a" / "voice.onnx").write_bytes(b"model")
    (tmp_path / "outside" / "a").mkdir(parents=True)
    (tmp_path / "outside" / "a" / "voice.onnx").write_bytes(b"model")
    return root


@pytest.mark.parametrize("level", ["file", "slot", "slots"])
def test_a_link_at_any_level_is_refused(tree: Path, level: str) -> None:
    """The file, its slot or the slots directory a link to identical content: refused."""
    outside = tree.parent / "outside"
    if level == "file":
        (tree / "slots" / "a" / "voice.onnx").unlink()
        (tree / "slots" / "a" / "voice.onnx").symlink_to(outside / "a" / "voice.onnx")
        where = "slots/a/voice.onnx"
    elif level == "slot":
        (tree / "slots" / "a" / "voice.onnx").unlink()
        (tree / "slots" / "a").rmdir()
        (tree / "slots" / "a").symlink_to(outside / "a", target_is_directory=True)
        where = "slots/a"
    else:
        for path in ((tree / "slots" / "a" / "voice.onnx"), (tree / "slots" / "a")):
            path.unlink() if path.is_file() else path.rmdir()
        (tree / "slots").rmdir()
        (tree / "slots").symlink_to(outside, target_is_directory=True)
        where = "slots"
    with pytest.raises(UnsafeFileError, match=f"] {where} is a symbolic link"):
        store.sha256_of(tree, ("slots", "a", "voice.onnx"))
    with pytest.raises(UnsafeFileError):
        store.open_append(tree, ("slots", "a", "voice.onnx"))
    assert (outside / "a" / "voice.onnx").read_bytes() == b"model"


def test_a_fifo_is_refused_without_blocking(tree: Path) -> None:
    """A FIFO where a file should be: refused at once (opened non-blocking), for reading and
    for appending."""
    fifo = tree / "slots" / "a" / "voice.onnx"
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        store.sha256_of(tree, ("slots", "a", "voice.onnx"))
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        store.open_append(tree, ("slots", "a", "voice.onnx"))


@pytest.mark.parametrize("kind", sorted(hostile.NOT_REGULAR))
def test_each_planted_kind_in_a_slot_makes_it_damaged_unread(tree: Path, kind: str) -> None:
    """A slot's file replaced by a link, a FIFO, a directory, a device or a sparse 64 GiB file:
    the slot is `damaged`, saying what was found, at once (nothing hashed, nothing followed);
    the clean-up at start removes what is no file."""
    outside = tree.parent / "outside"
    hostile.outside_files(outside)
    hostile.plant(tree / "slots" / "a" / "voice.onnx", kind, outside)
    state = UpdateState(release=1, version="1", active="a", model="voice.onnx")
    state.files = {"voice.onnx": hashlib.sha256(b"model").hexdigest()}
    problem = store.slot_problem(tree, state)
    assert problem is not None
    assert problem.reason == "damaged"
    assert problem.detail.startswith("slots/a/voice.onnx is ")
    if kind == "huge":
        assert f"over {store.MAX_SLOT_FILE_BYTES}" in problem.detail
    unsafe = clean_up(tree, state)
    assert unsafe == ([] if kind == "huge" else [f"slots/a/voice.onnx was {_kind(kind)}"])
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS


def _kind(kind: str) -> str:
    return {"fifo": "a FIFO", "directory": "a directory"}.get(kind, "a symbolic link")


def test_a_staged_download_over_the_bound_is_removed_at_start(tree: Path) -> None:
    """A sparse file of 64 GiB in the staging area is no download of a release: removed at
    start, reported, never hashed; a staged file of a sane size stays."""
    (tree / "staging").mkdir()
    hostile.plant(tree / "staging" / ("0" * 64), "huge", tree)
    (tree / "staging" / ("1" * 64)).write_bytes(b"part of a release")
    unsafe = clean_up(tree, UpdateState())
    assert unsafe == [
        f"staging/{'0' * 64} was a file of {hostile.HUGE_BYTES} bytes, "
        f"over {store.MAX_SLOT_FILE_BYTES}"
    ]
    assert [p.name for p in (tree / "staging").iterdir()] == ["1" * 64]


def test_a_dangling_link_is_never_created_through(tree: Path, tmp_path: Path) -> None:
    """Appending to a `.part` that is a link to a file not yet there: refused, nothing made."""
    (tree / "staging").mkdir()
    target = tmp_path / "would-be-made"
    (tree / "staging" / "x.part").symlink_to(target)
    with pytest.raises(UnsafeFileError):
        store.open_append(tree, ("staging", "x.part"))
    assert not target.exists()


def test_saving_over_a_linked_state_replaces_the_link(tmp_path: Path) -> None:
    """state.json a link to a file elsewhere: refused when read; a save replaces the link
    itself, the file it pointed to is untouched."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(_valid()), encoding="utf-8")
    root = tmp_path / "ota"
    root.mkdir()
    (root / "state.json").symlink_to(elsewhere)
    found = read_state(root)
    assert found.unusable == "state.json is a symbolic link (refused, not followed)"
    save_state(root, UpdateState())
    assert not (root / "state.json").is_symlink()
    assert json.loads(elsewhere.read_text(encoding="utf-8")) == _valid()


def test_remove_takes_a_link_never_what_it_points_to(tree: Path) -> None:
    outside = tree.parent / "outside"
    (tree / "slots" / "b").symlink_to(outside, target_is_directory=True)
    with store.directory(tree, "slots") as slots:
        store.remove(slots, "b")
        store.remove(slots, "a")
    assert not (tree / "slots" / "b").exists()
    assert not (tree / "slots" / "a").exists()
    assert (outside / "a" / "voice.onnx").read_bytes() == b"model"
