"""The handshake of a model switch between the updater's thread and the app loop.

The updater has a new voice loaded and checked; it asks for the switch and waits. The ask goes
through the inbox like every input; the core decides when (once nothing plays: `SwapRequested`
then `SwitchVoice`), the loop switches and answers. If nothing went quiet within the wait, the
updater withdraws the ask through the inbox too, and the loop answers either way: switched (it
got there first) or declined. One answer per ask, no lock.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from agent.protocol.inputs import SwapAsked, SwapWithdrawn

V = TypeVar("V")

WAIT_SECONDS: Final = 600.0
"""How long a switch may wait for the current announcement to end."""


class SwapDesk(Generic[V]):
    """Asks on the updater's side (`ask`), asks and answers on the loop's (`taken`, `answer`)."""

    def __init__(self, send: Callable[[SwapAsked[V] | SwapWithdrawn], bool]) -> None:
        self._send = send
        self._tokens = itertools.count(1)
        self._waiting: dict[int, SwapAsked[V]] = {}  # the loop's own

    def ask(self, voice: V, wait: float = WAIT_SECONDS) -> bool:
        """On the updater's thread: ask for the switch and wait for the answer."""
        answer: queue.Queue[bool] = queue.Queue(maxsize=1)
        asked = SwapAsked(next(self._tokens), voice, answer)
        if not self._send(asked):
            return False  # the agent is stopping
        try:
            return answer.get(timeout=wait)
        except queue.Empty:
            if not self._send(SwapWithdrawn(asked.token)):
                return False
            return answer.get()  # switched meanwhile (True) or declined (False)

    def taken(self, asked: SwapAsked[V]) -> int:
        """On the loop: the ask arrived; its token goes to the core."""
        self._waiting[asked.token] = asked
        return asked.token

    def voice(self, token: int) -> V:
        """On the loop: the voice asked for with this token."""
        return self._waiting[token].voice

    def answer(self, token: int, switched: bool) -> None:
        """On the loop: tell the updater."""
        self._waiting.pop(token).answer.put(switched)
