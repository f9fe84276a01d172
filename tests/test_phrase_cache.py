"""The phrase cache: content-addressed keys, two LRU tiers bounded in bytes, corruption caught."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from agent.phrase_cache import PhraseCache, cache_key

RATE = 22050


def pcm(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-20000, 20000, int(RATE * seconds), dtype=np.int16)


def test_the_key_covers_model_voice_parameters_and_phonemes() -> None:
    base = cache_key("a" * 64, "default", (0.667, 1.0, 0.8), [1, 5, 2])
    assert base == cache_key("a" * 64, "default", (0.667, 1.0, 0.8), [1, 5, 2])
    variants = [
        cache_key("b" * 64, "default", (0.667, 1.0, 0.8), [1, 5, 2]),
        cache_key("a" * 64, "other", (0.667, 1.0, 0.8), [1, 5, 2]),
        cache_key("a" * 64, "default", (0.667, 1.25, 0.8), [1, 5, 2]),
        cache_key("a" * 64, "default", (0.0, 1.0, 0.8), [1, 5, 2]),
        cache_key("a" * 64, "default", (0.667, 1.0, 0.8), [1, 5, 3, 2]),
    ]
    assert len({base, *variants}) == 6


def test_entries_survive_a_restart_through_the_disk_tier(tmp_path: Path) -> None:
    audio = pcm(0.5)
    PhraseCache(tmp_path, 10**6, 10**7).put("k1", audio, RATE)
    fresh = PhraseCache(tmp_path, 10**6, 10**7)
    got = fresh.get("k1", RATE)
    assert got is not None
    assert np.array_equal(got, audio)
    assert fresh.get("k1", RATE) is not None
    stats = fresh.stats()
    assert (stats.disk_hits, stats.memory_hits, stats.misses) == (1, 1, 0)
    assert fresh.get("absent", RATE) is None
    assert fresh.stats().hit_rate == pytest.approx(2 / 3)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "rate"])
def test_a_damaged_entry_is_dropped(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    PhraseCache(tmp_path, 10**6, 10**7).put("k1", pcm(0.2), RATE)
    (entry,) = tmp_path.glob("*/*.pcm")
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[-7] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    entry.write_bytes(bytes(data))
    fresh = PhraseCache(tmp_path, 10**6, 10**7)
    with caplog.at_level(logging.WARNING):
        got = fresh.get("k1", 16000 if damage == "rate" else RATE)
    assert got is None
    assert fresh.stats().corrupt == 1
    assert not entry.exists()
    assert "corrupt" in caplog.text


def test_disk_tier_stays_within_its_bound_dropping_the_least_recently_used(tmp_path: Path) -> None:
    one = pcm(0.25).nbytes + 64  # entry size with its header (rounded up)
    cache = PhraseCache(tmp_path, memory_bytes=0, disk_bytes=3 * one)
    for n in range(3):
        cache.put(f"k{n}", pcm(0.25, n), RATE)
    assert cache.get("k0", RATE) is not None  # k0 is now the most recently used
    cache.put("k3", pcm(0.25, 3), RATE)
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("*/*.pcm"))
    assert on_disk <= 3 * one
    assert cache.stats().disk_bytes == on_disk
    assert cache.contains("k0")
    assert not cache.contains("k1")  # the least recently used went first
    assert cache.stats().evictions >= 1


def test_memory_tier_stays_within_its_bound(tmp_path: Path) -> None:
    cache = PhraseCache(None, memory_bytes=pcm(0.3).nbytes * 2, disk_bytes=0)
    for n in range(5):
        cache.put(f"k{n}", pcm(0.3, n), RATE)
        assert cache.stats().memory_bytes <= pcm(0.3).nbytes * 2
    assert cache.get("k4", RATE) is not None
    assert cache.get("k0", RATE) is None
    assert not list(tmp_path.iterdir())  # no directory: nothing written anywhere


def test_recency_on_disk_survives_a_restart(tmp_path: Path) -> None:
    one = pcm(0.25).nbytes + 64
    first = PhraseCache(tmp_path, 0, 3 * one)
    for n in range(3):
        first.put(f"k{n}", pcm(0.25, n), RATE)
    first.get("k0", RATE)  # touch: k0 becomes the newest on disk
    second = PhraseCache(tmp_path, 0, 3 * one)
    second.put("k3", pcm(0.25, 3), RATE)
    assert second.contains("k0")
    assert not second.contains("k1")
