"""The sounder's chimes: the built-in tones rendered when first needed (then kept in the kit, so
a later start has them at once) and the chime files as the engine decoded them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from agent.core.messages import Priority, SpeakRequest
from agent.formats.chimes import BUILTIN, ChimePlan, render_notes
from agent.settings.declarations import DEFAULT_CHIMES
from agent.sounder.kit import Kit

_BUILTIN_PREFIX = "builtin:"


class ChimeBank(Mapping[str, bytes]):
    """Every chime by name, at the kit's rate: a decoded file first, else the built-in."""

    def __init__(self, kit: Kit) -> None:
        self._kit = kit

    def __getitem__(self, name: str) -> bytes:
        decoded = self._kit.chimes.get(name)
        if decoded is not None:
            return decoded
        notes = BUILTIN.get(name)
        if notes is None:
            raise KeyError(name)
        key = _BUILTIN_PREFIX + name
        rendered = self._kit.chimes.get(key)
        if rendered is None:
            rendered = render_notes(notes, self._kit.rate)
            self._kit.chimes[key] = rendered  # kept with the kit at its next save
        return rendered

    def __iter__(self) -> Iterator[str]:
        names = {n for n in self._kit.chimes if not n.startswith(_BUILTIN_PREFIX)}
        return iter(sorted(names | set(BUILTIN)))

    def __len__(self) -> int:
        return len(list(iter(self)))

    def plan(
        self, by_class: Mapping[str, str], rate: int
    ) -> Callable[[SpeakRequest], bytes | None]:
        """Which chime goes before a request, as the engine decides it (`ChimePlan`)."""
        del rate
        plan = ChimePlan(
            self,
            {p: by_class[p.label] for p in Priority if by_class.get(p.label, "none") != "none"},
            defaults={p: DEFAULT_CHIMES[p.label] for p in Priority},
        )
        return plan.for_request
