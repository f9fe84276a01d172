"""Where the node's two MQTT sessions are, and what follows from it (`docs/brokers.md`,
"Failover"; `docs/architecture.md`, "Two processes").

The sounder's session leads: the server it connected to last is told to the engine (at once,
and to each new engine), whose link follows it there (`MqttLink.follow`). The engine says the
server its session is subscribed on each time the broker acknowledged its subscriptions (and
when that connection ends): the sounder says `online` on a server only while the engine's session
is subscribed on that same one, so that a speak published there after `online` reaches a
session that consumes it. An engine found subscribed elsewhere (its own connection dropped and it
went round the ring) is told the leader again, at most once in `RETELL_SECONDS`: a server that
takes the sounder's session and refuses the engine's must not send it back and forth.

The methods are called on the pipe's and the keeper's threads and on paho's: each reads or
assigns one attribute and sends through the pipe's queue, never waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from agent.protocol import engine_wire as wire
from agent.protocol.engine_wire import Frame

_LOGGER = logging.getLogger(__name__)

RETELL_SECONDS: Final = 30.0
"""At most how often an engine whose session went to another server than the sounder's is told
the sounder's again."""


class SessionServers:
    """The sounder's server (the leader), the engine's, and the frames that keep them one."""

    def __init__(self, send: Callable[[bytes], object]) -> None:
        self._send = send
        self.leader: str | None = None
        """The server of the sounder's session (the last it connected to)."""
        self.engine: str | None = None
        """The server the engine's session is subscribed on now (`host:port`), None while it
        has no connection or there is no engine."""
        self.on_engine: Callable[[str], object] = lambda _server: None
        """Hears that server each time the engine's session is subscribed there (the sounder
        then says `online` if its own session is on the same one)."""
        self._retold = -RETELL_SECONDS

    def lead(self, server: str) -> None:
        """The sounder's session is on this server (paho's thread): the engine's follows it."""
        self.leader = server
        self._tell(server)

    def engine_changed(self) -> None:
        """An engine came or went (the keeper's thread): it has no session yet, and a new one
        hears at once where to connect (before its link starts, most likely)."""
        self.engine = None
        if self.leader is not None:
            self._tell(self.leader)

    def frame(self, frame: Frame) -> None:
        """A `connected` or `disconnected` frame from the engine (the pipe's thread)."""
        if frame.kind == "disconnected":
            self.engine = None
            return
        server = frame.text("server", limit=wire.MAX_ADDRESS)
        self.engine = server
        self.on_engine(server)
        leader, now = self.leader, time.monotonic()
        if leader is not None and server != leader and now - self._retold >= RETELL_SECONDS:
            self._retold = now
            _LOGGER.info("The engine's session is on %s, the sounder's on %s", server, leader)
            self._tell(leader)

    def _tell(self, server: str) -> None:
        self._send(wire.encode("server", {"server": server}))
