"""The Hermes bridge: what the agent owes Rhasspy for each request, from arrival to its reply.

It owns the reply contexts of the requests in flight, the audio toggle, and the replies. It is
fed by the same events as everything else (a Hermes request, the lifecycle event that ended it,
a toggle) and answers with replies to publish and, for a request to serve, the event the core
schedules. Pure: one thread (the app loop) calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from agent.core.catalog import Catalog
from agent.core.messages import (
    FINAL_EVENTS,
    Event,
    Lifecycle,
    Notify,
    Rejection,
    SpeakInvalid,
    SpeakReceived,
)
from agent.protocol import hermes
from agent.protocol.hermes import HermesContext, Reply
from agent.protocol.inputs import HermesRequest

MAX_IN_FLIGHT: Final = 4096
"""Reply contexts kept at most (every request ends, so this only bounds a pathological case)."""


class HermesBridge:
    """Reply contexts, the toggle, and the replies of one Hermes site."""

    def __init__(self, site_id: str, catalog: Catalog | None = None) -> None:
        self._site_id = site_id
        self.catalog = catalog or Catalog()
        """The node's voices: a say in a language none speaks is said by the selected one."""
        self._contexts: OrderedDict[str, HermesContext] = OrderedDict()
        self.muted = False
        """Toggled off: requests are answered as done without playing."""

    def request(self, event: HermesRequest) -> tuple[list[Reply], Event | None]:
        """A say or playBytes: the replies due now, and the event for the core (None when it
        is answered here and only needs acknowledging)."""
        context, parsed = event.context, event.parsed
        if isinstance(parsed, Rejection):
            replies = [hermes.error(context, parsed.detail), hermes.finished(context)]
            return replies, SpeakInvalid(parsed, event.delivery)
        if self.muted:
            return [hermes.finished(context)], None
        self._contexts[parsed.id] = context
        while len(self._contexts) > MAX_IN_FLIGHT:
            self._contexts.popitem(last=False)
        if parsed.lang is not None and self.catalog.voice_for(parsed.lang) is None:
            # Rhasspy sends its profile's language with every say: refusing would leave it
            # silent, so the selected voice says it
            parsed = replace(parsed, lang=None)
        return [], SpeakReceived(parsed, event.delivery)

    def notified(self, notify: Notify) -> list[Reply]:
        """The replies owed when a request's lifecycle event goes out."""
        if notify.event not in FINAL_EVENTS:
            return []
        context = self._contexts.pop(notify.id, None)
        if context is None:
            return []
        if notify.event in (Lifecycle.FAILED, Lifecycle.REJECTED):
            error = hermes.error(context, str(notify.details.get("reason")))
            return [error, hermes.finished(context)]  # Rhasspy always says it finished
        return [hermes.finished(context)]

    def toggle(self, on: bool) -> None:
        """Hermes audio on or off."""
        self.muted = not on

    def voices(self, request_id: object, voices: Mapping[str, str]) -> Reply:
        """The answer to getVoices."""
        return hermes.voices_reply(request_id, self._site_id, voices)
