"""The requests whose media the edges may hold (a recording prepared on arrival, the sounds of
the one on stage made at its turn): once a request has left the core, the edges are told to let
go of what they hold for it (`LetGo`). Pure."""

from __future__ import annotations

from collections.abc import Iterable

from agent.core.messages import LetGo


class HandedMedia:
    """The ids of the requests handed to the edges and not yet let go of."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def hand(self, request_id: str) -> None:
        """The edges may hold media for this request from now on."""
        self._ids.add(request_id)

    def let_go(self, here: Iterable[str]) -> list[LetGo]:
        """LetGo for every request handed to the edges that is no longer `here` (waiting or on
        stage), oldest id first in text order."""
        gone = sorted(self._ids - set(here))
        self._ids -= set(gone)
        return [LetGo(request_id) for request_id in gone]
