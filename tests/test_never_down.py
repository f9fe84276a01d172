"""Never down: no message, file or request stops a node, tried from the outside with real agents,
a real Mosquitto and real clients (issue: "Never down")."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.protocol import hermes
from harness import (
    AgentProcess,
    Broker,
    Watcher,
    agent_config,
    process_tree_peak_rss,
    reset_peak_rss,
    wait_until,
    write_config,
)
from ota import release
from tests.conftest import StartAgent

pytestmark = [pytest.mark.broker]

POISON = b'{"text": "The front door is open.", "\\ud800": true}'
"""The message that crash-looped every node: a lone surrogate escape in a field's name."""


def first_events(watcher: Watcher, event: str) -> list[dict[str, object]]:
    """Events of a kind, each once (events are at least once: a reconnect may repeat one)."""
    seen: dict[tuple[object, object], dict[str, object]] = {}
    for e in watcher.events():
        if e["event"] == event:
            seen.setdefault((e["id"], e["ts"]), e)
    return list(seen.values())


def rejected_for(watcher: Watcher, reason: str) -> list[dict[str, object]]:
    return [e for e in first_events(watcher, "rejected") if e.get("reason") == reason]


def test_a_poison_message_to_every_node_is_refused_by_both_and_never_seen_again(
    start_agent: StartAgent, tiny_voice: Path
) -> None:
    """With broker persistence, the poison on `<prefix>/all/speak` to two running agents: both
    stay up and report it rejected, both speak the next message, and after a restart neither
    sees it again."""
    agents = [start_agent(voice=tiny_voice, node_id=f"p{n}") for n in range(2)]
    agents[0].watcher.publish("voice/all/speak", POISON)
    for agent in agents:
        watcher = agent.watcher
        wait_until(lambda: bool(rejected_for(watcher, "invalid_utf8")), what="refused")  # noqa: B023
        agent.watcher.publish(agent.topics.speak, b'{"id": "after", "text": "Still here."}')
        agent.watcher.wait_event("after", "finished")
        assert agent.process.alive()
    for agent in agents:
        refused = agent.process.output().count("invalid_utf8")
        assert agent.process.signal(signal.SIGTERM) == 0
        agent.process.start()
        agent.wait_online()
        agent.watcher.publish(agent.topics.speak, b'{"id": "again", "text": "Back."}')
        agent.watcher.wait_event("again", "finished")
        assert agent.process.output().count("invalid_utf8") == refused  # not delivered again
        assert agent.process.alive()


def test_poison_in_a_hermes_id_and_an_offer_id_is_answered_and_the_node_speaks_on(
    start_agent: StartAgent, tiny_voice: Path
) -> None:
    key = release.public_text(Ed25519PrivateKey.generate())
    agent = start_agent(
        voice=tiny_voice,
        sections={"hermes": {"enabled": True, "site_id": "hall"}, "ota": {"trusted_keys": [key]}},
    )
    rhasspy = Watcher(agent.watcher.broker, "hermes/#")
    try:
        say = b'{"text": "Hello.", "siteId": "hall", "id": "\\udfff\\n[forged]", "sessionId": "s"}'
        rhasspy.publish(hermes.SAY, say)
        wait_until(lambda: any(m.topic == hermes.SAY_FINISHED for m in rhasspy.snapshot()))
        offer = b'{"id": "\\ud800", "manifest": {}, "base_url": "http://127.0.0.1:9/"}'
        agent.watcher.publish(agent.topics.ota, offer)
        wait_until(
            lambda: any(e.get("reason") == "malformed" for e in agent.watcher.events()),
            what="the offer refused as malformed",
        )
        agent.watcher.publish(agent.topics.speak, b'{"id": "ok", "text": "Still speaking."}')
        agent.watcher.wait_event("ok", "finished")
        assert agent.process.alive()
        assert "[forged]" not in agent.process.output()  # no forged log line
    finally:
        rhasspy.close()


@pytest.mark.voice
def test_a_pathological_clause_and_a_long_cjk_text_stay_within_their_bounds(
    start_agent: StartAgent,
) -> None:
    """espeak makes one clause of ~1,900 phonemes from 140 nonsense words: it is synthesized in
    pieces of at most `tts.max_chunk_phonemes`, within a memory bound; 15 KB of CJK text (~40
    minutes of speech) is refused before a sound; the configured phrases stay cached.

    Memory: the peak resident set (VmHWM) of each of the agent's processes is reset after a
    warm-up announcement (/proc/PID/clear_refs), then their sum read after each request.
    Unbounded, the clause took +812 MB; bounded, +96 MB was measured; the bound here is
    200 MB."""
    phrase = "Fire alarm in hall two. Leave the building now."
    agent = start_agent(sections={"cache": {"phrases": [phrase]}})
    agent.wait_voice_ready()  # online comes first; a new cache: a minute of graph analysis
    wait_until(lambda: "Phrase cache ready" in agent.process.output(), what="the phrases cached")
    agent.watcher.publish(agent.topics.speak, b'{"id": "warm", "text": "Warm up, please."}')
    agent.watcher.wait_event("warm", "finished")

    def peak_mb() -> float:  # the whole agent: the sounder, the engine, the decoder child
        return process_tree_peak_rss(agent.process.pid) / 2**20

    reset_peak_rss(agent.process.pid)
    before = peak_mb()
    rng = random.Random(1)
    syllables = "".join(rng.choice("bcdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3))
    words = " ".join(syllables[rng.randrange(3) :] + rng.choice("aeiou") for _ in range(140))
    agent.watcher.publish(
        agent.topics.speak, json.dumps({"id": "nonsense", "text": words}).encode()
    )
    finished = agent.watcher.wait_event("nonsense", "finished", timeout=300)
    grown = peak_mb() - before
    print(f"140 nonsense words: {finished['audio_seconds']} s of speech, peak RSS +{grown:.0f} MB")
    assert grown < 200
    cjk = json.dumps({"id": "cjk", "text": "今日は良い天気です。" * 490}, ensure_ascii=False)
    agent.watcher.publish(agent.topics.speak, cjk.encode())
    refused = agent.watcher.wait_event("cjk", "rejected")
    assert refused["reason"] == "too_long"
    assert "started" not in [e["event"] for e in agent.watcher.events("cjk")]
    agent.watcher.publish(agent.topics.speak, json.dumps({"id": "alarm", "text": phrase}).encode())
    alarm = agent.watcher.wait_event("alarm", "finished")
    assert alarm["cached_sentences"] == alarm["sentences"] == 2  # still in the cache


@pytest.mark.allow_error_logs(r"journal \S+ unreadable \(.*\); moved to ")
def test_a_damaged_journal_is_moved_aside_and_the_node_starts(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path
) -> None:
    """Power lost mid-write on an SD card: the journal is cut short. The node moves it aside,
    says so in its state, and speaks."""
    node = "damaged"
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / f"journal-{node}.sqlite3").write_bytes(b"SQLite format 3\x00" + os.urandom(3000))
    agent = start_agent(voice=tiny_voice, node_id=node)
    agent.watcher.publish(agent.topics.speak, b'{"id": "ok", "text": "I started anyway."}')
    agent.watcher.wait_event("ok", "finished")
    assert list(storage.glob(f"journal-{node}.sqlite3.damaged-*"))

    def storage_state() -> str:
        states = [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
        return str(states[-1].get("storage")) if states else ""

    wait_until(lambda: "moved to" in storage_state(), what="the state to say so")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs: a storage directory that can fill up (as root, as CI is)."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.allow_error_logs("The journal cannot be written")
def test_a_full_disk_leaves_messages_unacknowledged_and_the_node_speaks_on(
    broker: Broker, tmp_path: Path, tiny_voice: Path, small_disk: Path
) -> None:
    """The journal's disk fills up: the node keeps speaking, leaves what it could not record
    unacknowledged (the broker keeps it), reports the problem, and when space returns records
    again and takes the held-back message once more without speaking it twice."""
    config = agent_config(
        broker, tmp_path, "full", voice=tiny_voice, storage={"dir": str(small_disk)}
    )
    process = AgentProcess(write_config(tmp_path / "full.yaml", config), tmp_path / "full.log")
    watcher = Watcher(broker, "voice/full/#")
    process.start()
    try:
        watcher.wait_payload("voice/full/status", b"online")
        filler = small_disk / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as out:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        watcher.publish("voice/full/speak", b'{"id": "during", "text": "The disk is full."}')
        watcher.wait_event("during", "finished")  # spoken all the same

        def storage() -> str:
            states = [m.json() for m in watcher.snapshot() if m.topic == "voice/full/state"]
            return str(states[-1].get("storage")) if states else ""

        wait_until(lambda: storage() not in ("", "ok"), what="the state to report the disk")
        filler.unlink()
        wait_until(lambda: storage() == "ok", what="the journal used again")
        watcher.publish("voice/full/speak", b'{"id": "after", "text": "Space again."}')
        watcher.wait_event("after", "finished")
        # the held-back message is asked for again: a reconnect, and the broker resends it
        wait_until(lambda: process.output().count("Connected to") >= 2, what="the redelivery")
        starts = [e for e in first_events(watcher, "started") if e["id"] == "during"]
        assert len(starts) == 1  # taken again after the recovery, recognised, not spoken twice
        assert process.alive()
    finally:
        process.signal(signal.SIGTERM)
        watcher.close()


def test_a_flood_of_bad_messages_is_summarised_not_answered_one_by_one(
    start_agent: StartAgent, tiny_voice: Path
) -> None:
    """200 malformed messages: the first ones are rejected one by one, the rest are counted in a
    `suppressed` event; every one is accounted for, and the node speaks on."""
    agent = start_agent(voice=tiny_voice)
    for n in range(200):
        agent.watcher.publish(agent.topics.speak, b"{not json " + str(n).encode(), qos=0)
    agent.watcher.publish(agent.topics.speak, b'{"id": "ok", "text": "Still speaking."}')
    agent.watcher.wait_event("ok", "finished")
    wait_until(lambda: bool(first_events(agent.watcher, "suppressed")), what="a summary")

    def counted() -> int:
        total = 0
        for summary in first_events(agent.watcher, "suppressed"):
            reasons = summary["reasons"]
            assert isinstance(reasons, dict)
            total += int(reasons.get("invalid_json", 0))
        return total

    one_by_one = len(rejected_for(agent.watcher, "invalid_json"))
    assert one_by_one < 200
    wait_until(lambda: one_by_one + counted() == 200, what="every message accounted for")
    print(f"flood: {one_by_one} rejected one by one, {counted()} counted in summaries")
    assert agent.process.output().count("invalid_json") < 100  # the log is not flooded either
