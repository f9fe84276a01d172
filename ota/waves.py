"""Waves of a rollout: how the target nodes are split, and when a wave passes or halts. Pure.

`--waves` lists cumulative sizes: `1,10,50,100` are percentages of the target nodes (the list
must end at 100), `2,10,all` are counts (a list that ends with `all`); `N%` is a percentage
anywhere. Wave k offers to the nodes between the previous size and its own (rounded up, at least
one node per wave; a size that adds nobody is dropped).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Final

from agent.core.states import UpdatePhase

ERROR_STATES: Final = frozenset({UpdatePhase.FAILED, UpdatePhase.ROLLED_BACK})
"""Answers that count against the release: it failed, or the node went back by itself."""


def parse_waves(text: str) -> list[tuple[str, float]]:
    """The cumulative sizes as ("percent", p), ("count", n) or ("all", 0)."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("--waves: expected sizes such as 1,10,50,100 or 2,10,all")
    counts = items[-1] == "all"
    sizes: list[tuple[str, float]] = []
    for index, item in enumerate(items):
        if item == "all":
            if index != len(items) - 1:
                raise ValueError("--waves: `all` can only be the last wave")
            sizes.append(("all", 0.0))
            continue
        percent = item.endswith("%") or not counts
        number_text = item.removesuffix("%")
        try:
            number = float(number_text)
        except ValueError:
            raise ValueError(f"--waves: {item!r} is not a number, a percentage or all") from None
        if number <= 0 or (percent and number > 100) or (not percent and number != int(number)):
            raise ValueError(f"--waves: {item!r} must be a percentage 0-100 or a whole count")
        sizes.append(("percent", number) if percent else ("count", number))
    last_kind, last = sizes[-1]
    if last_kind == "count" or (last_kind == "percent" and last != 100):
        raise ValueError("--waves: the last wave must reach every node (end with 100 or all)")
    return sizes


def split(nodes: Sequence[str], text: str) -> list[list[str]]:
    """The nodes (in the given order) split into waves by the cumulative sizes."""
    total = len(nodes)
    waves: list[list[str]] = []
    done = 0
    for kind, number in parse_waves(text):
        if kind == "all":
            upto = total
        elif kind == "percent":
            upto = math.ceil(number * total / 100 - 1e-9)
        else:
            upto = int(number)
        upto = min(total, max(upto, done + 1))
        if upto > done:
            waves.append(list(nodes[done:upto]))
            done = upto
    return waves


@dataclass
class Tally:
    """A wave's answers so far."""

    nodes: int = 0
    offline: int = 0
    """Offline (or never announced) when the wave began: not offered."""
    offered: int = 0
    good: int = 0
    """installed or already_installed."""
    states: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    """Failure reasons of the errors."""
    no_answer: int = 0
    """Offered, and no final answer within the node timeout."""
    pending: int = 0

    @property
    def errors(self) -> int:
        """Answers that count against the release."""
        return sum(self.states[s] for s in ERROR_STATES)

    def error_share(self) -> float:
        """Errors over the nodes offered (0 when none was)."""
        return self.errors / self.offered if self.offered else 0.0

    def success_share(self) -> float:
        """Good answers over the nodes offered (1 when none was: nothing to judge)."""
        return self.good / self.offered if self.offered else 1.0


def tally(
    nodes: Iterable[str],
    offline: AbstractSet[str],
    answers: Mapping[str, tuple[str, str | None]],
    no_answer: AbstractSet[str],
) -> Tally:
    """Count a wave: answers maps node -> (final state, reason)."""
    result = Tally()
    for node in nodes:
        result.nodes += 1
        if node in offline:
            result.offline += 1
            continue
        result.offered += 1
        if node in answers:
            state, reason = answers[node]
            result.states[state] += 1
            if state in {UpdatePhase.INSTALLED, UpdatePhase.ALREADY_INSTALLED}:
                result.good += 1
            elif state in ERROR_STATES:
                result.failures[reason or state] += 1
        elif node in no_answer:
            result.no_answer += 1
        else:
            result.pending += 1
    return result


def verdict(counts: Tally, success_threshold: float, error_threshold: float) -> str | None:
    """Why the wave halts the rollout, or None. Errors over the threshold halt at once; the
    success share is judged once nothing is pending."""
    if counts.error_share() > error_threshold:
        return (
            f"{counts.errors} of {counts.offered} offered failed "
            f"({counts.error_share():.0%} > error threshold {error_threshold:.0%})"
        )
    if counts.pending == 0 and counts.success_share() < success_threshold:
        return (
            f"{counts.good} of {counts.offered} offered installed "
            f"({counts.success_share():.0%} < success threshold {success_threshold:.0%})"
        )
    return None
