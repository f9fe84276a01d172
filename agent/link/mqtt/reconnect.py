"""The MQTT link's reconnect policy: one connect attempt on the ring's current server (the ring
moves on after a failure, and learns which servers take MQTT 5 only), retried by tenacity with
the ring's delays (a short one to the next server, full-jitter exponential backoff per round of
failures), the first attempt at once before tenacity is even imported; and the jittered pause
before a reconnect, growing while connections keep dropping. A stop ends every wait at once.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.link.mqtt.servers import Ring, Step, Version, delay
from agent.settings.declarations import MqttConfig

if TYPE_CHECKING:  # tenacity loads only once a connect failed
    from tenacity import RetryCallState

_LOGGER = logging.getLogger("agent.link.mqtt.link")  # the link's log, as before its split


class MaybeNotV5Error(ConnectionError):
    """An MQTT 5 CONNECT was refused as an unsupported version (`refused`), or the connection
    closed before any CONNACK: the server may speak MQTT 3.1.1 only."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Reconnect:
    """Connect attempts, their retries and pauses, on a ring of servers."""

    def __init__(self, config: MqttConfig, ring: Ring, stopping: threading.Event) -> None:
        self._config = config
        self._ring = ring
        self._stopping = stopping
        self._step = Step.ROUND
        self._failed_at = ""

    @property
    def server(self) -> str:
        """host:port of the ring's current server."""
        return self._ring.servers[self._ring.index].address

    def pause(self, short_sessions: int) -> bool:
        """Wait a jittered delay that grows while connections keep dropping; False if stopping.

        Without it a fleet reconnects in lockstep after a broker restart, and two agents with
        the same client id would take the session from each other in a tight loop.
        """
        low, high = self._config.reconnect_min, self._config.reconnect_max
        pause = random.uniform(low, min(high, low * 2 ** (short_sessions + 1)))  # noqa: S311
        _LOGGER.info("Reconnecting in %.2f s (to %s)", pause, self.server)
        return not self._stopping.wait(pause)

    def connect(self, use: Callable[[int, Version], None], handshake: Callable[[], None]) -> None:
        """Connect, retrying with tenacity's backoff: each attempt makes the client for the
        ring's current server and version (`use`) and shakes hands (`handshake`); the first
        attempt at once, before tenacity is even imported (a node's start waits on nothing it
        does not need)."""
        try:
            self._attempt(use, handshake)
        except OSError as err:
            if self._stopping.is_set():
                raise
            first = err
        else:
            return
        from tenacity import (  # noqa: PLC0415 - only once a connect failed
            Retrying,
            retry_if_exception_type,
            stop_when_event_set,
        )

        self._log_first_failure(first)
        retrying = Retrying(
            wait=self._wait,
            retry=retry_if_exception_type(OSError),
            stop=stop_when_event_set(self._stopping),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                self._attempt(use, handshake)

    def _attempt(self, use: Callable[[int, Version], None], handshake: Callable[[], None]) -> None:
        """One attempt on the ring's current server; on failure, the ring moves on."""
        index, version = self._ring.index, self._ring.version
        self._failed_at = self._ring.current.address
        use(index, version)
        try:
            if self._stopping.is_set():
                raise ConnectionError("stopping")
            handshake()
        except MaybeNotV5Error as err:
            self._step = self._ring.failed(maybe_not_v5=True, refused_version=err.refused)
            raise
        except OSError:
            self._step = self._ring.failed(maybe_not_v5=False)
            raise
        if self._ring.connected():
            _LOGGER.warning(
                "%s does not take MQTT 5: the link speaks MQTT 3.1.1 with it until the agent "
                "restarts (what that changes: docs/brokers.md)",
                self.server,
            )

    def _log_first_failure(self, error: OSError) -> None:
        """The first attempt's failure, said as tenacity's hook says the later ones."""
        pause = self._wait(None)
        self._log(error, pause, 1)
        self._sleep(pause)

    def _wait(self, state: RetryCallState | None) -> float:
        low, high = self._config.reconnect_min, self._config.reconnect_max
        return delay(self._step, self._ring.rounds, low, high)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a stop request ends the wait at once

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        pause = state.next_action.sleep if state.next_action else 0.0
        self._log(error, pause, state.attempt_number + 1)  # the first was tried before tenacity

    def _log(self, error: BaseException | None, pause: float, attempt: int) -> None:
        if self._step is Step.SAME:
            _LOGGER.info("%s: %s; trying MQTT 3.1.1", self._failed_at, error)
        elif self._step is Step.NEXT:
            _LOGGER.warning(
                "Cannot connect to %s (%s); trying %s in %.2f s",
                self._failed_at,
                error,
                self.server,
                pause,
            )
        else:
            _LOGGER.warning(
                "Cannot connect to %s (%s); retry %d in %.2f s (to %s)",
                self._failed_at,
                error,
                attempt,
                pause,
                self.server,
            )
