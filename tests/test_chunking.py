"""Clause grouping and decoder chunks: everything once, in order; small first; no tiny chunks."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from piper.phonemize_espeak import EspeakPhonemizer

from agent.formats.chunking import (
    FIRST_FRAMES,
    FRAME_GROWTH,
    MAX_FRAMES,
    MIN_CHUNK,
    MIN_FRAMES,
    frame_chunks,
    group_clauses,
    grow,
)
from agent.speech.voice import Voice


@given(
    st.lists(st.integers(min_value=1, max_value=120), min_size=1, max_size=30), st.integers(8, 400)
)
@settings(max_examples=500, deadline=None)
def test_groups_partition_the_clauses_in_order(lengths: list[int], budget: int) -> None:
    groups = group_clauses(lengths, budget)
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    sizes = [sum(lengths[i] for i in g) for g in groups]
    if len(groups) > 1:
        assert min(sizes) >= MIN_CHUNK  # no tiny chunk once a sentence is split


@given(
    st.lists(st.integers(min_value=1, max_value=30), min_size=2, max_size=30), st.integers(20, 200)
)
@settings(max_examples=300, deadline=None)
def test_the_first_chunk_stays_within_budget_when_clauses_allow(
    lengths: list[int], budget: int
) -> None:
    first = group_clauses(lengths, budget)[0]
    size = sum(lengths[i] for i in first)
    # either within budget, or the split was not possible without a tiny piece
    fits = size <= budget
    smallest_prefix_ok = sum(lengths[: first.stop - 1]) < MIN_CHUNK
    tail_too_small = sum(lengths[first.stop :]) < MIN_CHUNK
    assert fits or smallest_prefix_ok or tail_too_small or len(first) == 1


def test_a_long_sentence_splits_small_first_then_growing() -> None:
    groups = group_clauses([15, 15, 15, 15, 15, 15, 15, 15], budget=20)
    sizes = [len(g) * 15 for g in groups]
    assert sizes[0] == 15
    assert sizes == sorted(sizes)
    assert sum(sizes) == 120


def test_short_sentences_are_not_split() -> None:
    assert group_clauses([30], 40) == [range(1)]
    assert group_clauses([5, 5], 8) == [range(2)]  # both pieces would be tiny


def test_clauses_join_to_exactly_the_phonemes_piper_makes(tiny_voice: Path) -> None:
    voice = Voice.load(tiny_voice, threads=1, cache_dir=None)
    piper = EspeakPhonemizer()
    texts = [
        "Attention please, the delivery van has arrived at the loading dock; someone from "
        "receiving should come: now — before the driver leaves. Thank you!",
        "Dr. Smith arrived at 5 p.m. today, and then - without warning - the alarm sounded.",
        "Wait… what? Really, truly, honestly; yes.",
    ]
    for text in texts:
        ours = [[p for clause in sentence for p in clause] for sentence in voice.sentences(text)]
        assert ours == [s for s in piper.phonemize("en-us", text) if s]
        assert any(len(sentence) > 1 for sentence in voice.sentences(text))  # clauses found


def test_chunks_never_grow_past_the_cap_where_clauses_allow() -> None:
    groups = group_clauses([20] * 20, budget=20, cap=60)
    sizes = [len(g) * 20 for g in groups]
    assert max(sizes) <= 60
    assert sum(sizes) == 400
    assert grow(40, 160, 3) == 160
    assert grow(40, None, 3) == 320


@given(st.integers(1, 5000), st.integers(1, 600), st.integers(1, 1000))
@settings(max_examples=500, deadline=None)
def test_frame_chunks_cover_the_frames_in_order_growing_to_the_cap(
    frames: int, budget: int, cap: int
) -> None:
    chunks, following = frame_chunks(frames, budget, cap)
    assert [i for chunk in chunks for i in chunk] == list(range(frames))
    sizes = [len(chunk) for chunk in chunks]
    assert sizes[0] <= max(budget, frames)
    if len(chunks) > 1:
        limits = [budget]
        for _ in sizes[1:]:
            limits.append(max(1, min(limits[-1] * FRAME_GROWTH, cap)))
        assert sizes[:-1] == limits[:-1]  # the first is the budget, each next grows to the cap
        assert MIN_FRAMES <= sizes[-1] < limits[-1] + MIN_FRAMES  # a short tail joined it
    assert 1 <= following <= max(budget, cap)


def test_frame_chunks_start_small_then_grow_twofold_up_to_the_cap() -> None:
    chunks, following = frame_chunks(653, FIRST_FRAMES, MAX_FRAMES)
    assert [len(chunk) for chunk in chunks] == [32, 64, 128, 128, 128, 128, 45]
    assert following == MAX_FRAMES
    assert frame_chunks(40, 32, 256) == ([range(40)], 64)  # an 8-frame tail joins
    assert [len(c) for c in frame_chunks(780, 256, 256)[0]] == [256, 256, 268]  # 12 joined
    assert frame_chunks(2000, 512, 512)[0][-1] == range(1536, 2000)
