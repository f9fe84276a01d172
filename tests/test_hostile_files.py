"""Files a person with access to the disk can damage or plant (issue 20, "Files"): journal rows
of the wrong type, a damaged journal file, a stored volume that is no number, symbolic links in
the agent's state and cache directories. Each case on the real files (SQLite written with
`sqlite3`, links planted with `os.symlink`), through the real agent and broker where it
matters; after each, the same agent speaks a control message, and is heard."""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from agent.audio.device import alsa_opener
from agent.audio.player import Player
from agent.core.messages import Event, Priority, SpeakRequest, UtteranceEnded
from agent.formats.chunk import Chunk
from agent.guarded import nofollow
from agent.settings import loading
from agent.settings.declarations import ConfigError
from agent.sounder.kit import Kit, KitFiles
from agent.speech import sessions
from agent.speech.cache_sweep import sweep_models
from agent.speech.chimes import chime_bank
from agent.speech.phrase_cache import PhraseCache
from agent.speech.sessions import cache_stem, cached_session, usable_cache_dir
from agent.speech.voice import Voice
from agent.storage.journal import Journal
from agent.storage.step_marker import StepMarker
from harness import read_pcm, wait_until
from tests import hostile
from tests.conftest import RunningAgent, StartAgent

RATE = 22050
_T = TypeVar("_T")


def control(agent: RunningAgent, request_id: str = "control") -> None:
    """After the hostile input: a normal message is spoken to the end, and heard."""
    text = json.dumps({"id": request_id, "text": "The node still speaks."}).encode()
    agent.watcher.publish(agent.topics.speak, text)
    agent.watcher.wait_event(request_id, "finished")
    wait_until(lambda: audible(agent.capture), what="the control message heard")


def audible(capture: Path) -> bool:
    """The capture holds speech, not silence (a writer thread that died plays nothing)."""
    if not capture.exists() or capture.stat().st_size < 4000:
        return False
    samples = read_pcm(capture).astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) > 50


def storage_state(agent: RunningAgent) -> str:
    states = [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
    return str(states[-1].get("storage")) if states else ""


def journal_path(tmp_path: Path, node: str) -> Path:
    return tmp_path / "storage" / f"journal-{node}.sqlite3"


def planted(path: Path, requests: list[SpeakRequest]) -> None:
    """A journal the agent wrote before: these announcements accepted, none ended."""
    journal = Journal(path, remembered=100)
    for n, request in enumerate(requests):
        journal.record(request, f"fp{n}", 1e9 + n)
    journal.close()


def sql(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        for statement, values in statements:
            db.execute(statement, values)


def body(path: Path, request_id: str) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        (text,) = db.execute(
            "SELECT request FROM announcements WHERE id = ?", (request_id,)
        ).fetchone()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def set_field(
    path: Path, request_id: str, field: str, value: object
) -> tuple[str, tuple[object, ...]]:
    changed = body(path, request_id) | {field: value}
    return "UPDATE announcements SET request = ? WHERE id = ?", (json.dumps(changed), request_id)


def test_damaged_rows_are_set_aside_with_an_event_and_the_node_speaks(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path
) -> None:
    """The issue's rows, planted in the real journal: a `ttl` that is a string or an object,
    text in a number column, an unknown `priority`, a request that is no JSON object or no
    UTF-8, a 400-digit rate, an id that is no text, a stored volume and voice of the wrong
    type, an unsent event with a number for its topic. The agent starts (no traceback, no
    restart loop), ends each row it can name `failed`/`damaged_journal` (with its class and
    text when readable), notes the rest in its state, plays the rows that are fine (one whose
    crash counts are text among them) and is heard at its configured volume."""
    node = "hostile"
    path = journal_path(tmp_path, node)
    path.parent.mkdir()
    names = ["ttl_text", "ttl_object", "received_text", "priority", "not_object", "not_utf8"]
    names += ["huge_rate", "no_id", "counts_text", "fine"]
    planted(path, [SpeakRequest(n, f"Row {n}.", priority=Priority.ALARM) for n in names])
    sql(
        path,
        set_field(path, "ttl_text", "ttl", "soon"),
        set_field(path, "ttl_object", "ttl", {"seconds": 5}),
        ("UPDATE announcements SET received = 'yesterday' WHERE id = ?", ("received_text",)),
        set_field(path, "priority", "priority", 9),
        ("UPDATE announcements SET request = '[1, 2]' WHERE id = ?", ("not_object",)),
        ("UPDATE announcements SET request = CAST(X'7BFF7D' AS TEXT) WHERE id = ?", ("not_utf8",)),
        set_field(path, "huge_rate", "rate", 10**400),
        ("UPDATE announcements SET id = X'FF00' WHERE id = ?", ("no_id",)),
        ("UPDATE announcements SET begun = 'many', crashes = x'00' WHERE id = ?", ("counts_text",)),
        ("INSERT INTO settings (name, value) VALUES ('volume', ?)", (b"\x00loud",)),
        ("INSERT INTO settings (name, value) VALUES ('voice', ?)", (b"\xff",)),
        ("INSERT INTO outbox (topic, payload) VALUES (7, 'x')", ()),
        ("INSERT INTO outbox (topic, payload) VALUES (?, 'x')", (b"voice/#",)),
    )
    agent = start_agent(voice=tiny_voice, node_id=node, audio={"volume": 0.8})
    for name in names[:7]:
        failed = agent.watcher.wait_event(name, "failed")
        assert failed["reason"] == "damaged_journal", name
    assert "ttl" in agent.watcher.wait_event("ttl_text", "failed")["detail"]
    assert "received" in agent.watcher.wait_event("received_text", "failed")["detail"]
    damaged_class = agent.watcher.wait_event("priority", "failed")
    assert "priority" not in damaged_class  # unknown: not made up
    assert damaged_class["text"] == "Row priority."
    assert agent.watcher.wait_event("ttl_text", "failed")["priority"] == "alarm"
    for name in ("counts_text", "fine"):
        agent.watcher.wait_event(name, "finished")
    wait_until(lambda: "more" in storage_state(agent), what="the state to say so")
    assert storage_state(agent).startswith("setting 'volume': expected text")
    log = agent.process.output()
    assert "an announcement without a readable id set aside" in log
    assert "an unsent event is unreadable" in log
    assert "an unsent event for '7' is not this node's" in log
    control(agent)
    states = [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
    assert states[-1]["volume"] == 0.8  # the configured one: the damaged setting was dropped
    agent.process.signal(15)
    agent.process.start()  # set aside once: not reported again at the next start
    agent.wait_online()
    control(agent, "control-2")
    for name in names[:7]:
        assert [e["event"] for e in agent.watcher.events(name)].count("failed") == 1


@pytest.mark.parametrize("volume", [b"0.5\xff", "nan", "-1", "1e999", "{}", 10**18])
def test_a_stored_volume_of_any_type_never_mutes_the_node(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path, volume: object
) -> None:
    """A stored volume that is no number from 0 to 1: dropped, never given to the ALSA writer
    (which died on it: the node reported online and was mute)."""
    node = "volume"
    path = journal_path(tmp_path, node)
    path.parent.mkdir()
    planted(path, [])
    sql(path, ("INSERT INTO settings (name, value) VALUES ('volume', ?)", (volume,)))
    agent = start_agent(voice=tiny_voice, node_id=node)
    control(agent)


def damage_file(path: Path, how: str, outside: Path) -> None:
    if how == "truncated":
        planted(path, [SpeakRequest("a", "A.")])
        path.write_bytes(path.read_bytes()[:1500])
    elif how == "garbage":
        path.write_bytes(os.urandom(16384))
    elif how == "not_a_database":
        path.write_text("voice-agent journal backup, see the wiki\n" * 100)
    elif how == "directory":
        path.mkdir()
    elif how == "symlink":
        path.symlink_to(outside)
    elif how == "wal_symlink":
        planted(path, [SpeakRequest("a", "A.")])
        Path(f"{path}-wal").symlink_to(outside)


@pytest.mark.allow_error_logs(r"journal \S+ unreadable \(.*\); moved to ")
@pytest.mark.parametrize(
    "how", ["truncated", "garbage", "not_a_database", "directory", "symlink", "wal_symlink"]
)
def test_a_damaged_journal_file_is_moved_aside_and_the_node_speaks(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path, how: str
) -> None:
    node = "damagedfile"
    path = journal_path(tmp_path, node)
    path.parent.mkdir()
    outside = tmp_path / "someone-elses.db"
    outside.write_bytes(b"not the agent's")
    damage_file(path, how, outside)
    agent = start_agent(voice=tiny_voice, node_id=node)
    wait_until(lambda: "moved to" in storage_state(agent), what="the state to say so")
    control(agent)
    assert outside.read_bytes() == b"not the agent's"
    assert not path.is_symlink()
    assert list(path.parent.glob(f"{path.name}.damaged-*"))


@pytest.mark.allow_error_logs(r"is a symbolic link: refused, not followed")
def test_a_storage_directory_that_is_a_symbolic_link_is_refused_and_the_node_speaks(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "storage").symlink_to(elsewhere)
    agent = start_agent(voice=tiny_voice, node_id="linked")
    wait_until(lambda: "symbolic link" in storage_state(agent), what="the state to say so")
    control(agent)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("which", ["cache", "phrases", "models"])
def test_cache_directories_that_are_symbolic_links_are_refused_and_the_node_speaks(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path, which: str
) -> None:
    """The cache root, the phrase cache or the optimized models' directory pointing elsewhere:
    nothing is written there (or read, or deleted); the voice is optimized in a temporary
    directory, phrases stay in memory, and the node speaks."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"not the agent's")
    cache = tmp_path / "own-cache"
    if which == "cache":
        cache.symlink_to(elsewhere)
    else:
        cache.mkdir()
        (cache / which).symlink_to(elsewhere)
    agent = start_agent(voice=tiny_voice, sections={"cache": {"dir": str(cache)}})
    control(agent)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]
    assert (elsewhere / "precious").read_bytes() == b"not the agent's"
    if which != "models":
        wait_until(lambda: "phrase cache" in storage_state(agent), what="the state to say so")
    assert "symbolic link" in agent.process.output()


def test_a_cached_optimized_model_replaced_by_a_link_is_refused_and_rebuilt(
    tiny_voice: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    Voice.load(tiny_voice, 1, cache, split=False)
    digest = next(iter((cache / "models").glob("*.onnx"))).name.split("-")[0]
    cached = Path(f"{cache_stem(cache, digest)}.onnx")
    assert cached.is_file()
    outside = tmp_path / "other.onnx"
    outside.write_bytes(cached.read_bytes())
    cached.unlink()
    cached.symlink_to(outside)
    assert cached_session(cached, 1) is None
    assert not cached.exists()  # the link removed, never its target
    assert outside.exists()
    voice = Voice.load(tiny_voice, 1, cache, split=False)  # built again, a file of its own
    assert cached.is_file()
    assert not cached.is_symlink()
    assert voice.sample_rate > 0


def test_a_models_directory_that_is_a_link_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(tmp_path / "elsewhere")
    assert usable_cache_dir(tmp_path / "cache") is None
    assert usable_cache_dir(tmp_path / "fresh") == tmp_path / "fresh"
    assert (tmp_path / "fresh" / "models").is_dir()


@pytest.mark.parametrize(
    "volume", ["0.5", math.nan, math.inf, -0.1, 1.5, 10**400, True, None, [0.5], b"1"]
)
def test_the_alsa_writer_never_meets_a_bad_volume(tmp_path: Path, volume: object) -> None:
    """SetVolume with anything but a number from 0 to 1 keeps the volume as it was; the writer
    plays on."""
    events: queue.Queue[Event] = queue.Queue()
    capture = tmp_path / "out.raw"
    opener = alsa_opener(f"file:FILE={capture},FORMAT=raw", RATE, period_ms=20, periods=4)
    player = Player(opener, RATE, events.put, 0.7)
    player.start()
    try:
        player.volume = volume  # type: ignore[assignment]
        assert player.volume == 0.7
        tone = (np.sin(np.arange(RATE // 2) * 0.12) * 8000).astype(np.int16)
        player.put(Chunk("a", tone.astype("<i2").tobytes()))
        player.put(Chunk("a", end=True))
        ended = events.get(timeout=10)
        while not isinstance(ended, UtteranceEnded):
            ended = events.get(timeout=10)
        assert ended.error is None
    finally:
        player.stop()
    assert audible(capture)


# ---- planted files, reader by reader (the matrix through the agent: test_planted_files.py) ---


def in_time(work: Callable[[], _T], seconds: float = 30.0) -> _T:
    """`work`'s result, run in a thread: a read that blocks (an open of a FIFO without
    O_NONBLOCK) fails the test instead of hanging it."""
    result: list[_T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            failure.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "blocked (a FIFO opened without O_NONBLOCK?)"
    if failure:
        raise failure[0]
    return result[0]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The files planted links point to: a file and a FIFO outside the node's directories."""
    hostile.outside_files(tmp_path / "outside")
    return tmp_path / "outside"


@pytest.mark.parametrize("kind", hostile.PLANTED_KINDS)
def test_a_planted_file_is_refused_by_what_it_is_before_a_byte_is_read(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    """`nofollow.read_file` on each kind: a link, a FIFO (never blocking), a directory, a device,
    a file over the bound are refused with what they are; a truncated or garbage file is read
    (its reader judges its content)."""
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "f").write_bytes(b"x" * 100)
    hostile.plant(folder / "f", kind, outside)
    fd = nofollow.open_directory(folder)
    try:
        if kind in hostile.NOT_REGULAR:
            with pytest.raises(nofollow.FileRefusedError) as refused:
                in_time(lambda: nofollow.read_file(fd, "f", 1 << 20))
            expected = {
                "link_outside": "a symbolic link",
                "link_to_fifo": "a symbolic link",
                "device": "a symbolic link",
                "fifo": "a FIFO",
                "directory": "a directory",
                "huge": f"{hostile.HUGE_BYTES} bytes, over {1 << 20}",
            }
            assert refused.value.found == expected[kind]
        else:
            assert len(in_time(lambda: nofollow.read_file(fd, "f", 1 << 20))) in (50, 4096)
    finally:
        os.close(fd)
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS


def test_the_operators_files_may_be_links_but_never_fifos_devices_or_huge(
    tmp_path: Path, outside: Path
) -> None:
    """`read_regular` (the config, chime and media files): a link to a file is followed, a link
    to a FIFO, /dev/zero or a huge file is refused without blocking."""
    for kind in ("link_outside", "link_to_fifo", "fifo", "device", "huge", "directory"):
        path = tmp_path / f"operator-{kind}"
        hostile.plant(path, kind, outside)
        if kind == "link_outside":
            assert nofollow.read_regular(path, 1000) == hostile.PRECIOUS
            continue
        with pytest.raises(nofollow.FileRefusedError):
            in_time(lambda p=path: nofollow.read_regular(p, 1 << 20))  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["fifo", "link_to_fifo", "device", "huge", "directory"])
def test_a_config_file_that_is_no_regular_file_fails_at_once_with_what_it_is(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    path = tmp_path / "agent.yaml"
    hostile.plant(path, kind, outside)
    with pytest.raises(ConfigError, match="cannot read the file"):
        in_time(lambda: loading.load(path))


def test_a_config_file_that_is_not_utf8_is_one_clear_problem(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"node_id: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        loading.load(path)


@pytest.mark.allow_error_logs(r"Chime 'door' \(.*\) left out: ")
@pytest.mark.parametrize("kind", ["fifo", "link_to_fifo", "device", "huge"])
def test_a_chime_file_that_is_no_regular_file_is_left_out_without_blocking(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    """The chime bank at start: the file is left out (logged), the built-ins stay."""
    path = tmp_path / "chime.wav"
    hostile.plant(path, kind, outside)
    bank = in_time(lambda: chime_bank({"door": path}, RATE))
    assert "door" not in bank
    assert "alarm" in bank


@pytest.mark.parametrize("kind", hostile.PLANTED_KINDS)
def test_a_planted_step_marker_is_replaced_and_said(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / "steps-n").write_bytes(b"S00000000 []\n")
    hostile.plant(storage / "steps-n", kind, outside)
    marker = in_time(lambda: StepMarker(storage, "steps-n", {}))
    try:
        marker.enter("a", "infer 1")
        if kind in hostile.NOT_REGULAR:
            assert marker.problem is not None
            assert marker.problem.startswith("step marker steps-n was ")
        else:
            assert marker.problem is None
        assert (storage / "steps-n").is_file()
        assert not (storage / "steps-n").is_symlink()
    finally:
        marker.close()
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS


@pytest.mark.allow_error_logs(r"journal \S+ unreadable \(.*\); moved to ")
@pytest.mark.parametrize("companion", ["", "-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", sorted(hostile.NOT_REGULAR))
def test_a_planted_journal_or_companion_is_moved_aside_unread(
    tmp_path: Path, outside: Path, kind: str, companion: str
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    path = storage / "journal-n.sqlite3"
    planted(path, [SpeakRequest("a", "A.")])
    hostile.plant(Path(f"{path}{companion}"), kind, outside)
    journal, problem = in_time(lambda: Journal.open_or_renew(path, 100))
    try:
        assert problem is not None
        assert f"{path.name}{companion} is " in problem
        assert "moved to" in problem
        assert journal.path == path
        journal.probe()
    finally:
        journal.close()
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS


def test_what_is_planted_in_the_caches_is_removed_at_start_and_said(
    tmp_path: Path, outside: Path
) -> None:
    """The phrase cache's entries and the model cache's files, each kind: removed (never
    followed), counted, named in `problem`; what is the cache's own stays."""
    cache = tmp_path / "cache"
    phrases = PhraseCache(cache / "phrases", 1 << 20, 1 << 20)
    tone = (np.sin(np.arange(2000) * 0.1) * 5000).astype(np.int16)
    for n in range(len(hostile.NOT_REGULAR) + 1):
        phrases.put(f"{n:02d}" + "a" * 62, tone, RATE)
    models = cache / "models"
    models.mkdir()
    (models / "own.onnx").write_bytes(b"model")
    (models / "tier.int8").mkdir()  # the tier's folder: its own reader's
    for n, kind in enumerate(sorted(hostile.NOT_REGULAR)):
        hostile.plant(
            cache / "phrases" / f"{n:02d}" / (f"{n:02d}" + "a" * 62 + ".pcm"), kind, outside
        )
        hostile.plant(models / f"planted-{n}.onnx.seal", kind, outside)
    (models / "huge-dir.onnx").mkdir()
    again = in_time(lambda: PhraseCache(cache / "phrases", 1 << 20, 1 << 20))
    assert again.problem is not None
    assert again.problem.startswith("phrase cache: ")
    assert again.stats().refused == len(hostile.NOT_REGULAR)
    assert again.stats().disk_entries == 1
    left = sorted(p.name for p in models.iterdir())
    assert left == ["own.onnx", "tier.int8"]
    assert again.get(f"{len(hostile.NOT_REGULAR):02d}" + "a" * 62, RATE) is not None
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS
    assert sweep_models(models) == []  # once removed, nothing more to say


def test_a_cached_weights_file_of_another_size_is_never_hashed(
    tiny_voice: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A huge sparse file in place of the optimized model's weights: found by its size against
    the seal, the copy rebuilt, not a byte hashed (hashing 64 GiB would hold the start)."""
    cache = tmp_path / "cache"
    Voice.load(tiny_voice, 1, cache, split=False)
    cached = next((cache / "models").glob("*.onnx"))
    weights = cached.with_name(cached.name + ".data")
    hostile.plant(weights, "huge", tmp_path)

    def no_hash(path: Path, *, follow: bool = True) -> str:
        raise AssertionError(f"{path} hashed")

    monkeypatch.setattr(sessions, "_sha256_of", no_hash)
    assert in_time(lambda: cached_session(cached, 1)) is None
    assert not weights.exists()  # removed, to be built again


@pytest.mark.parametrize("kind", sorted(hostile.NOT_REGULAR))
def test_a_file_planted_where_the_node_writes_is_replaced_never_written_through(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    """`write_file_atomic` (every cache entry, the sounder's kit, remembered digests) over each
    planted kind: the node's file takes its place (a directory is removed with what it holds),
    nothing outside changes; the sounder's kit is kept again over a planted index."""
    folder = tmp_path / "own"
    folder.mkdir()
    hostile.plant(folder / "entry", kind, outside)
    hostile.plant(folder / "gone", kind, outside)
    fd = nofollow.open_directory(folder)
    try:
        in_time(lambda: nofollow.write_file_atomic(fd, "entry", b"the node's"))
        nofollow.unlink(fd, "gone")
    finally:
        os.close(fd)
    assert (folder / "entry").read_bytes() == b"the node's"
    assert sorted(p.name for p in folder.iterdir()) == ["entry"]
    kit_dir = tmp_path / "sounder"
    kit_dir.mkdir()
    hostile.plant(kit_dir / "index.json", kind, outside)
    files = KitFiles(kit_dir)
    assert in_time(lambda: files.load(RATE)).phrases == {}
    files.save(Kit(RATE, phrases={"Fire.": b"\x01\x00" * 100}))
    assert KitFiles(kit_dir).load(RATE).phrases == {"Fire.": b"\x01\x00" * 100}
    assert (outside / "precious").read_bytes() == hostile.PRECIOUS


def test_a_media_file_replaced_while_the_node_runs_is_refused_without_blocking(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path, outside: Path
) -> None:
    """An `audio.media` file (the operator's, so it may be a link) replaced after the start by
    a FIFO, a link to one, /dev/zero or a sparse 64 GiB file: each request for it ends at once,
    `sound_unavailable` (`too_large` by its size), and the node speaks on (a plain open of the
    FIFO held the media thread, and every sound after it, for good)."""
    door = tmp_path / "door.wav"
    door.write_bytes(b"RIFF")
    agent = start_agent(voice=tiny_voice, audio={"media": {"door": str(door)}})
    for kind in ("fifo", "link_to_fifo", "device", "huge"):
        hostile.plant(door, kind, outside)
        payload = {"id": kind, "text": "The door.", "sound": "door"}
        agent.watcher.publish(agent.topics.speak, json.dumps(payload).encode())
        event = agent.watcher.wait_end(kind)
        assert event["event"] in ("failed", "rejected"), event  # refused on arrival or at play
        expected = "too_large" if kind == "huge" else "sound_unavailable"
        assert event["reason"] == expected, event
    control(agent)
