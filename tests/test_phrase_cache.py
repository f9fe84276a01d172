"""The phrase cache: content-addressed keys, two LRU tiers bounded in bytes, corruption caught."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from agent.speech.phrase_cache import PhraseCache, cache_key

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


# ---- symbolic links planted in the cache: refused, never followed -----------------------------


def someone_elses(folder: Path) -> Path:
    """A file outside the cache the agent must never read, overwrite or delete."""
    folder.mkdir(exist_ok=True)
    target = folder / "precious"
    target.write_bytes(b"not the agent's")
    return target


def test_a_cache_directory_that_is_a_symbolic_link_leaves_the_cache_in_memory(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    target = someone_elses(elsewhere)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "phrases").symlink_to(elsewhere)
    cache = PhraseCache(tmp_path / "cache" / "phrases", 10**6, 10**7)
    assert cache.problem is not None
    assert "symbolic link" in cache.problem
    cache.put("k1", pcm(0.2), RATE)
    assert cache.get("k1", RATE) is not None  # served from memory
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]
    assert target.read_bytes() == b"not the agent's"


def test_a_cache_root_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    someone_elses(elsewhere)
    (tmp_path / "cache").symlink_to(elsewhere)
    cache = PhraseCache(tmp_path / "cache" / "phrases", 10**6, 10**7)
    assert cache.problem is not None
    cache.put("k1", pcm(0.2), RATE)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]


@pytest.mark.parametrize("where", ["entry", "subdirectory", "partial"])
def test_links_inside_the_cache_are_refused_and_their_targets_untouched(
    tmp_path: Path, where: str
) -> None:
    """A link planted as an entry (to a file elsewhere), as a key's subdirectory, or as a
    leftover temporary: not read, not written through, not deleted through; the entry is
    synthesized again, and the cache goes on."""
    target = someone_elses(tmp_path / "elsewhere")
    folder = tmp_path / "phrases"
    PhraseCache(folder, 10**6, 10**7).put("k1", pcm(0.2), RATE)
    (entry,) = folder.glob("*/*.pcm")
    if where == "entry":
        entry.unlink()
        entry.symlink_to(target)
    elif where == "subdirectory":
        entry.unlink()
        entry.parent.rmdir()
        entry.parent.symlink_to(tmp_path / "elsewhere")
    else:
        (entry.parent / "x.partial").symlink_to(target)
    fresh = PhraseCache(folder, 10**6, 10**7)
    got = fresh.get("k1", RATE)
    assert (got is None) == (where != "partial")
    fresh.put("k1", pcm(0.2), RATE)  # written again, never through the link
    fresh.put("k2", pcm(0.2, 2), RATE)
    assert target.read_bytes() == b"not the agent's"
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["precious"]
    if where == "subdirectory":
        assert fresh.stats().refused >= 1
    else:
        assert fresh.get("k1", RATE) is not None
