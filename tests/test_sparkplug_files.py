"""The Sparkplug bdSeq file (`sparkplug-<node>.bdseq` in the storage directory) against files
planted beside it by a local user (tests/hostile.py: `plant`): a link, a FIFO, a directory, a
huge, truncated, empty or garbage file, and the link planted as the old temporary file. Never
followed, never blocking the start, a fresh value with a warning; through the agent, each case
ends with the node born on the broker and a control message spoken.

docs/security.md, "The node's files" (bdSeq) and docs/sparkplug.md.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from agent.link.sparkplug.session import BdSeq
from agent.protocol.sparkplug_schema import Payload
from harness import Watcher, wait_until
from tests.conftest import StartAgent
from tests.hostile import PLANTED_KINDS, PRECIOUS, outside_files, plant

OUTSIDE = PRECIOUS


def bdseq_of(payload: bytes) -> int:
    message = Payload()
    message.ParseFromString(payload)
    [value] = [m.long_value for m in message.metrics if m.name == "bdSeq"]
    return int(value)


def started(path: Path) -> tuple[BdSeq | None, threading.Thread]:
    """BdSeq(path) on a thread of its own (a FIFO read would hang it)."""
    made: list[BdSeq] = []
    thread = threading.Thread(target=lambda: made.append(BdSeq(path)), daemon=True)
    thread.start()
    thread.join(30)
    return (made[0] if made else None), thread


KINDS = (*PLANTED_KINDS, "dangling_link", "empty")
"""tests/hostile.py's planted kinds, and two of the bdSeq file's own: a link to nothing, an
empty file."""


def planted(path: Path, kind: str, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("17\n")  # the value a truncated file was cut from
    if kind == "dangling_link":
        path.unlink()
        path.symlink_to(outside / "nothing-here")
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        plant(path, kind, outside)


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_bdseq_file_is_not_followed_read_or_waited_for(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    storage, outside = tmp_path / "storage", tmp_path / "outside"
    outside_files(outside)
    path = storage / "sparkplug-n1.bdseq"
    planted(path, kind, outside)
    with caplog.at_level(logging.WARNING):
        bd_seq, thread = started(path)
    assert not thread.is_alive(), "the start hangs on it"
    assert bd_seq is not None
    assert bd_seq.problem, "a planted file goes unreported"
    assert "Sparkplug bdSeq" in caplog.text
    first = bd_seq.take()
    assert 0 <= first <= 255
    assert path.is_file()
    assert not path.is_symlink()
    assert path.read_text() == f"{(first + 1) % 256}\n"
    assert (outside / "precious").read_bytes() == OUTSIDE
    assert bd_seq.take() == (first + 1) % 256


def test_the_old_attack_a_link_planted_as_the_temporary_file_writes_nothing_outside(
    tmp_path: Path,
) -> None:
    """The issue's case: a link planted as `sparkplug-<node>.tmp` had the agent write `1\\n`
    over a file outside the storage directory, and the `.bdseq` became a link to it."""
    storage = tmp_path / "storage"
    storage.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(OUTSIDE)
    (storage / "sparkplug-n1.tmp").symlink_to(outside)
    path = storage / "sparkplug-n1.bdseq"
    path.write_text("7\n")
    bd_seq = BdSeq(path)
    assert bd_seq.problem is None
    assert bd_seq.take() == 7
    assert outside.read_bytes() == OUTSIDE
    assert not path.is_symlink()
    assert path.read_text() == "8\n"


def test_a_good_file_is_read_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "storage" / "sparkplug-n1.bdseq"
    path.parent.mkdir()
    path.write_text("255\n")
    bd_seq = BdSeq(path)
    assert (bd_seq.take(), bd_seq.take()) == (255, 0)
    assert BdSeq(path).take() == 1
    fresh = BdSeq(tmp_path / "storage" / "sparkplug-n2.bdseq")
    assert (fresh.problem, fresh.take()) == (None, 0)


AGENT_KINDS = ("fifo", "link_outside")
"""The issue's two kinds through the agent in `make test`; every other kind in
`make test-slow` (the reader's test above takes each of them in `make test`)."""


@pytest.mark.broker
@pytest.mark.parametrize(
    "kind",
    [
        *AGENT_KINDS,
        *(pytest.param(k, marks=pytest.mark.slow) for k in KINDS if k not in AGENT_KINDS),
    ],
)
def test_the_agent_starts_born_and_speaks_with_a_planted_bdseq_file(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path, kind: str
) -> None:
    """The issue's cases through the agent: a FIFO planted as the `.bdseq` hung the agent before
    it served anything; a link made it write outside. Now: born, the file outside unchanged,
    and the node speaks."""
    node = f"files{os.getpid() % 1000}{len(kind)}"
    outside = tmp_path / "outside-file"
    outside.write_bytes(OUTSIDE)
    outside_files(tmp_path / "elsewhere")
    planted(tmp_path / "storage" / f"sparkplug-{node}.bdseq", kind, tmp_path / "elsewhere")
    (tmp_path / "storage" / f"sparkplug-{node}.tmp").symlink_to(outside)
    sections = {"sparkplug": {"enabled": True, "group_id": "plant"}}
    agent = start_agent(voice=tiny_voice, node_id=node, sections=sections, wait=False)
    births = Watcher(agent.watcher.broker, f"spBv1.0/plant/NBIRTH/{node}")
    try:
        agent.wait_online()
        wait_until(lambda: bool(births.snapshot()), what="the NBIRTH")
        assert 0 <= bdseq_of(births.snapshot()[0].payload) <= 255
        assert "Sparkplug bdSeq:" in agent.process.output()
        agent.watcher.publish(agent.topics.speak, b'{"id": "control", "text": "Hello."}')
        agent.watcher.wait_event("control", "finished")
        assert outside.read_bytes() == OUTSIDE
        assert (tmp_path / "elsewhere" / "precious").read_bytes() == OUTSIDE
    finally:
        births.close()
