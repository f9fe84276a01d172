"""The rooms bench's reading of its recording (bench/rooms.py): announcements split on silence,
each one's pair of marks or none, so one node starting far off is counted, never a crash."""

from __future__ import annotations

import numpy as np

from bench.rooms import MARKS, RATE, announcements, mark_offsets


def _announcement(offset: int, speech_after_ms: int = 100) -> np.ndarray:
    """One announcement as the sink mixes it: A's mark, B's `offset` samples later, then each
    node's speech 100 ms after its own mark (a quiet tone of 0.5 s)."""
    length = RATE
    mix = np.zeros(length, dtype=np.int32)
    a_at, b_at = 1000, 1000 + offset
    mix[a_at] += MARKS["a"]
    mix[b_at] += MARKS["b"]
    speech = (300 * np.sin(np.arange(RATE // 2) / 5)).astype(np.int32) + 301  # never zero
    for at in (a_at, b_at):
        begin = at + RATE * speech_after_ms // 1000
        mix[begin : begin + len(speech)] += speech
    return mix


def test_each_announcement_gives_its_pair_or_none_and_the_split_follows_silence() -> None:
    silence = np.zeros(3 * RATE, dtype=np.int32)
    parts = [silence]
    for offset in (3, 0, -7, 4000):  # the last: B 181 ms late, its mark under A's speech
        parts += [_announcement(offset), silence]
    samples = np.concatenate(parts).astype(np.int16)
    spans = announcements(samples)
    assert len(spans) == 4
    pairs = [mark_offsets(samples[begin:end]) for begin, end in spans]
    assert pairs == [[3], [0], [-7], []]
    assert mark_offsets(samples) == [3, 0, -7]  # the whole mix: the same pairs, in order


def test_a_gap_shorter_than_the_split_silence_keeps_one_announcement() -> None:
    one = _announcement(2)
    gap = np.zeros(RATE, dtype=np.int32)  # 1 s, e.g. words late after the chime
    samples = np.concatenate([one, gap, one[2000:]]).astype(np.int16)
    assert len(announcements(samples)) == 1
    assert announcements(np.zeros(RATE, dtype=np.int16)) == []
