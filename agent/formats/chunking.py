"""Where to cut a sentence for streaming: at clause boundaries, small first, growing after. Pure.

The sentence's clauses (from espeak-ng: commas, colons, semicolons, dashes) are grouped so that
the first chunk to synthesize is short (early first audio) and each later chunk may be about
twice the previous one: on a device that synthesizes faster than twice real time, the next chunk
is then always ready before the current one has played. On a voice split for chunked decoding,
each clause group's latent frames are cut the same way for the decoder (`frame_chunks`): a small
first chunk for a request, each later one up to four times the one before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MIN_CHUNK: Final = 12
"""Fewest phonemes in a chunk (about two words): tiny chunks sound choppy."""


def split_clause(clause: Sequence[str], cap: int) -> list[tuple[str, ...]]:
    """A clause of more than `cap` phonemes cut into pieces of at most `cap`: at word
    boundaries (spaces) where it can be, a word longer than `cap` cut hard. espeak-ng can make
    one clause of thousands of phonemes (nonsense words without punctuation); one inference over
    it would take seconds and hundreds of MB. The pieces join into the same phonemes."""
    if len(clause) <= cap:
        return [tuple(clause)]
    pieces: list[tuple[str, ...]] = []
    current: list[str] = []
    word: list[str] = []
    for phoneme in [*clause, " "]:
        word.append(phoneme)
        if phoneme != " ":
            continue
        if len(current) + len(word) > cap and current:
            pieces.append(tuple(current))
            current = []
        while len(word) > cap:  # one word longer than the cap
            pieces.append(tuple(word[:cap]))
            word = word[cap:]
        current += word
        word = []
    if current and current[-1] == " ":
        current.pop()  # the space added above
    if current:
        pieces.append(tuple(current))
    return pieces


def group_clauses(lengths: Sequence[int], budget: int, cap: int | None = None) -> list[range]:
    """Group consecutive clauses (their phoneme counts) of one sentence into chunks.

    The first chunk stays within `budget` phonemes where the clauses allow it, and each later
    chunk within twice the one before, but never above `cap` (bounding memory and the time one
    inference takes, so a preemption never waits long). A chunk is never cut inside a clause,
    never smaller than MIN_CHUNK unless the whole sentence is, and a short tail joins the chunk
    before it.
    """
    groups: list[range] = []
    start, size = 0, 0
    remaining = sum(lengths)
    for index, length in enumerate(lengths):
        size += length
        remaining -= length
        last = index == len(lengths) - 1
        if last or (
            size >= MIN_CHUNK and remaining >= MIN_CHUNK and size + lengths[index + 1] > budget
        ):
            groups.append(range(start, index + 1))
            start, size = index + 1, 0
            budget = grow(budget, cap)
    return groups


def grow(budget: int, cap: int | None, chunks: int = 1) -> int:
    """The budget after `chunks` more chunks: doubled each time, up to `cap`."""
    grown: int = budget * 2**chunks
    return grown if cap is None else min(grown, cap)


FIRST_FRAMES: Final = 32
"""Latent frames in the first decoder chunk of a request: 32 x 256 samples, of which the
streaming decoder gives all but its lag (~0.1 s) at once: ~0.25 s of audio at 22050 Hz,
decoded in one run (docs/measurements.md, "Streaming decoder")."""
MAX_FRAMES: Final = 128
"""Most latent frames in one decoder chunk handed to the player (~1.5 s of audio): how far ahead
the player's buffer of two chunks holds audio. The streaming decoder decodes it in runs of
RUN_FRAMES, so its size no longer sets the decoder's memory or what a join costs (nothing)."""
FRAME_GROWTH: Final = 2
"""Each decoder chunk may be this many times the one before: the second chunk (64 frames, two
runs) is decoded in a fraction of the ~0.25 s the first one plays, even on a board several
times slower than this machine, and the chunks reach MAX_FRAMES by the third."""
MIN_FRAMES: Final = 32
"""Fewest frames in a decoder chunk after the first: a shorter tail joins the chunk before."""


def frame_chunks(
    frames: int, budget: int, cap: int, growth: int = FRAME_GROWTH
) -> tuple[list[range], int]:
    """Cut a clause group's latent frames into decoder chunks; returns them with the budget of
    the chunk after the last (the next clause group's first).

    The first chunk has `budget` frames, each later one up to `growth` times the one before but
    never above `cap`; a tail shorter than MIN_FRAMES joins the chunk before it.
    """
    chunks: list[range] = []
    start = 0
    budget = max(1, budget)
    while start < frames:
        stop = start + budget
        if frames - stop < MIN_FRAMES:
            stop = frames
        chunks.append(range(start, stop))
        start = stop
        budget = max(1, min(budget * growth, cap))
    return chunks, budget


RUN_FRAMES: Final = 32
"""Most latent frames the streaming decoder takes in one run: a decoder chunk of the plan above
is decoded in runs of this many frames and yielded whole. Every layer's activations then stay
in the CPU's caches (32 frames: 1 MB per tensor at the last layers), which made decoding 10-17 %
cheaper in CPU time than decoding a clause group whole, and 128-frame runs 6-8 %
(docs/measurements.md, "Streaming decoder"); the decoder carries its context from run to run,
so smaller runs cost only their calls."""
MIN_RUN_FRAMES: Final = 8
"""Fewest frames in a run after the first: a shorter tail joins the run before it."""


def decoder_runs(frames: range, size: int = RUN_FRAMES, first: int = 0) -> list[range]:
    """A decoder chunk's frames cut into runs of `size` (a tail shorter than MIN_RUN_FRAMES
    joins the run before it); a run from frame 0 has at least `first` frames."""
    runs: list[range] = []
    start = frames.start
    while start < frames.stop:
        stop = min(start + (max(size, first) if start == 0 else size), frames.stop)
        if frames.stop - stop < MIN_RUN_FRAMES:
            stop = frames.stop
        runs.append(range(start, stop))
        start = stop
    return runs
