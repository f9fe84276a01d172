"""One end of the socket between the node's two processes: frames read on a thread of their own
and handed to a callable, frames written by a thread of their own from a bounded queue, so that
no caller ever waits on the other process (it may be stopped, hung or gone).

A queue that fills (the other side reads nothing), a frame that breaks the wire's rules, or the
socket closing ends the pipe once: `on_broken` hears why, and every later send is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Final

from agent.protocol.engine_wire import Frame, FrameReader, WireError

_LOGGER = logging.getLogger(__name__)

MAX_QUEUED_BYTES: Final = 16 << 20
"""What may wait to be written before the other side is judged not to read (a few seconds of
audio at most ever wait: the lanes are flow-controlled by credits)."""
_READ: Final = 1 << 16


class Pipe:
    """Frames in and out over a connected stream socket."""

    def __init__(
        self,
        sock: socket.socket,
        on_frame: Callable[[Frame], object],
        on_broken: Callable[[str], object],
        name: str,
    ) -> None:
        self._sock = sock
        self._on_frame = on_frame
        self._on_broken = on_broken
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._changed = threading.Condition()
        self._broken = False
        self._reader = threading.Thread(target=self._read_blocking, name=f"{name}-in", daemon=True)
        self._writer = threading.Thread(
            target=self._write_blocking, name=f"{name}-out", daemon=True
        )

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    @property
    def broken(self) -> bool:
        return self._broken

    def send(self, frame: bytes) -> bool:
        """Queue a frame without waiting; False once the pipe is broken (the frame is dropped)."""
        with self._changed:
            if self._broken:
                return False
            if self._queued + len(frame) > MAX_QUEUED_BYTES:
                overflow = True
            else:
                overflow = False
                self._queue.append(frame)
                self._queued += len(frame)
                self._changed.notify()
        if overflow:
            self.close("the other process reads nothing (its queue is full)")
            return False
        return True

    def close(self, why: str = "closed") -> None:
        """Break the pipe (once): both threads end, `on_broken` hears why."""
        with self._changed:
            if self._broken:
                return
            self._broken = True
            self._queue.clear()
            self._changed.notify_all()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._on_broken(why)

    def _read_blocking(self) -> None:
        reader = FrameReader()
        while not self._broken:
            try:
                data = self._sock.recv(_READ)
            except OSError as err:
                self.close(f"read failed: {err}")
                return
            if not data:
                self.close("the other process closed its end")
                return
            try:
                frames = reader.feed(data)
            except WireError as err:
                self.close(f"a broken frame: {err}")
                return
            for frame in frames:
                try:
                    self._on_frame(frame)
                except WireError as err:
                    self.close(f"a broken {frame.kind}: {err}")
                    return

    def _write_blocking(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._broken:
                    self._changed.wait()
                if self._broken:
                    return
                frame = self._queue.popleft()
                self._queued -= len(frame)
            try:
                self._sock.sendall(frame)
            except OSError as err:
                self.close(f"write failed: {err}")
                return
