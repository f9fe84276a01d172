"""Where to cut a sentence for streaming: at clause boundaries, small first, growing after. Pure.

The sentence's clauses (from espeak-ng: commas, colons, semicolons, dashes) are grouped so that
the first chunk to synthesize is short (early first audio) and each later chunk may be about
twice the previous one: on a device that synthesizes faster than twice real time, the next chunk
is then always ready before the current one has played. Allowed imports: stdlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MIN_CHUNK: Final = 12
"""Fewest phonemes in a chunk (about two words): tiny chunks sound choppy."""


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
