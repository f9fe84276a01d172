"""The loop's housekeeping after each event: the flood's summary, the journal's recovery, the
watchdog's ping, discovery and the state when due. Part of the composition root: it runs on the
loop's thread only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.assembly import Parts, new_id
from agent.core.messages import Lifecycle, Notify
from agent.execution import Execution
from agent.protocol.status import NodeFacts

_LOGGER = logging.getLogger(__name__)


class Housekeeping:
    """What is due between events; `facts` reads the node's facts when they are published."""

    def __init__(
        self, parts: Parts, execution: Execution, facts: Callable[[float], NodeFacts], prefix: str
    ) -> None:
        self._inbox = parts.inbox
        self._link = parts.link
        self._flood = parts.flood
        self._ledger = parts.ledger
        self._systemd = parts.systemd
        self._status = parts.status
        self._sparkplug = parts.sparkplug
        self._execution = execution
        self._facts = facts
        self._discovery_prefix = prefix
        self._next_ping = 0.0

    def __call__(self, now: float) -> None:
        """Watchdog pings, discovery when due, the state when changed or due."""
        self._ledger.settle()
        held = self._flood.summary(now)
        if held is not None:
            count = sum(held.values())
            _LOGGER.warning("Flood: %d rejections not reported one by one: %s", count, held)
            suppressed = Notify(
                f"flood-{new_id()[:8]}", Lifecycle.SUPPRESSED, {"count": count, "reasons": held}
            )
            self._execution.notify_guarded(suppressed, now)
        if self._ledger.recovered(now):
            self._status.changed()
            if self._ledger.held_back:  # not recorded, so not acknowledged: get them again
                self._ledger.held_back = 0
                self._link.redeliver()
        interval = self._systemd.watchdog_interval
        if interval is not None and now >= self._next_ping:
            self._systemd.notify("WATCHDOG=1")  # from the main loop: a stuck loop stops pinging
            self._next_ping = now + interval
        if self._status.announce_due(now):
            self._announce(now)
        if self._status.state_due(now):
            topic, payload, retain = self._status.state(self._facts(now), now, time.time())
            self._execution.publish(topic, payload, retain)
            if self._sparkplug is not None:
                self._sparkplug.state_published(payload)  # DDATA by exception

    def _announce(self, now: float) -> None:
        messages = self._status.announce(self._facts(now))
        for topic, payload, retain in messages:
            self._execution.publish(topic, payload, retain)
        if len(messages) > 1:
            _LOGGER.info("Published Home Assistant discovery under %s/", self._discovery_prefix)
