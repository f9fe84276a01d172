"""The engine as the sounder's child process: spawned, watched, and started again.

`python -m agent engine --fd N` gets one end of a socket pair. The sounder pings it every
second; an engine that says nothing for `hang_seconds` (hung, or stopped with SIGSTOP), whose
pipe breaks, or that sends a frame breaking the wire's rules is killed (SIGKILL) and a new one
started after a backoff (tenacity's exponential wait, reset once an engine has served a
minute). Nothing here ever waits on the engine: frames go out through the pipe's own queue.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

from agent.loop.pipe import Pipe
from agent.protocol.engine_wire import Frame, encode

_LOGGER = logging.getLogger(__name__)

PING_SECONDS: Final = 1.0
HELLO_SECONDS: Final = 120.0
"""How long a new engine may take to say hello (its imports, on a slow board)."""
CANNOT_RUN: Final = 3
"""The engine's exit status when it cannot run as configured (`agent.__main__.CANNOT_RUN`)."""
GRACE_SECONDS: Final = 2.0
"""How long an engine whose pipe broke has to end by itself before it is killed."""
SERVED_SECONDS: Final = 60.0
"""An engine that lived this long starts the backoff afresh when it dies."""


class EngineProcess:
    """The engine child and the pipe to it; `on_frame` hears every frame but the pongs (on the
    pipe's thread), `on_change` hears when it comes or goes (on the keeper's thread)."""

    def __init__(
        self,
        command: Sequence[str],
        on_frame: Callable[[Frame, int], object],
        on_change: Callable[[], object],
        hang_seconds: float = 15.0,
        environ: dict[str, str] | None = None,
    ) -> None:
        self._command = list(command)
        self._on_frame = on_frame
        self._on_change = on_change
        self._hang = hang_seconds
        self._environ = environ
        self._lock = threading.Lock()
        self._pipe: Pipe | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._epoch = 0
        self._said = 0.0
        """When the engine last said anything (monotonic)."""
        self._hello = False
        self._ready = False
        self._stopping = threading.Event()
        self._lost = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep_blocking, name="engine-keeper", daemon=True
        )
        self.restarts = 0
        self.cannot_run = threading.Event()
        """The engine said it cannot run as configured: it is not started again."""

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def answering(self) -> bool:
        """An engine said hello on a pipe that holds: it takes asks (its voice may still load)."""
        pipe = self._pipe
        return self._hello and pipe is not None and not pipe.broken

    @property
    def ready(self) -> bool:
        """The engine answers and said its voice is ready."""
        return self._ready and self.answering

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    def start(self) -> None:
        self._keeper.start()

    def send(self, frame: bytes) -> bool:
        """To the current engine, if there is one (never waits); False otherwise."""
        pipe = self._pipe
        return pipe is not None and pipe.send(frame)

    def set_ready(self, ready: bool) -> None:
        self._ready = ready

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; the keeper ends."""
        self._stopping.set()  # the keeper kills nothing from now on: this waits for the end
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                _LOGGER.warning("The engine did not stop within %g s: killed", timeout)
                process.kill()
                process.wait()
        self._lost.set()
        pipe = self._pipe
        if pipe is not None:
            pipe.close("stopping")
        self._keeper.join(timeout=5)

    # ---- the keeper thread ------------------------------------------------------------------

    def _keep_blocking(self) -> None:
        from tenacity import RetryCallState, Retrying, wait_exponential  # noqa: PLC0415 - lean start

        backoff = wait_exponential(multiplier=0.5, max=30)
        failures = 0
        while not self._stopping.is_set():
            began = time.monotonic()
            code = self._run_one_blocking()
            if self._stopping.is_set():
                return
            if code == CANNOT_RUN:
                _LOGGER.warning("The engine cannot run as configured (see above): stopping")
                self.cannot_run.set()
                return
            failures = 1 if time.monotonic() - began > SERVED_SECONDS else failures + 1
            attempt = RetryCallState(Retrying(), None, (), {})
            attempt.attempt_number = failures
            delay = backoff(attempt)
            _LOGGER.warning("The engine is gone; starting it again in %.1f s", delay)
            self.restarts += 1
            if self._stopping.wait(delay):
                return

    def _run_one_blocking(self) -> int | None:
        """One engine, from its start to its end; its exit status (None: it did not start)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._lock:
            self._epoch += 1
            epoch = self._epoch
        command = [*self._command, "--fd", str(theirs.fileno())]
        try:
            process = subprocess.Popen(
                command, pass_fds=(theirs.fileno(),), env=self._environ, stdin=subprocess.DEVNULL
            )
        except OSError as err:
            _LOGGER.error("The engine cannot be started: %s", err)
            ours.close()
            theirs.close()
            return None
        finally:
            theirs.close()
        self._process = process
        self._lost.clear()
        self._hello = False
        self._said = time.monotonic()

        def frame(received: Frame) -> None:
            self._said = time.monotonic()
            if received.kind == "pong":
                return
            if received.kind == "hello":
                self._hello = True
            self._on_frame(received, epoch)

        def broken(why: str) -> None:
            if not self._stopping.is_set():
                _LOGGER.warning("The pipe to the engine (pid %d) broke: %s", process.pid, why)
            self._lost.set()

        pipe = Pipe(ours, frame, broken, "engine-pipe")
        self._pipe = pipe
        pipe.start()
        self._on_change()
        self._watch_blocking(process, pipe)
        self._ready = False
        pipe.close("the engine is gone")
        code = self._ended_blocking(process)
        self._pipe = None
        if not self._stopping.is_set() and code != CANNOT_RUN:
            _LOGGER.warning("The engine (pid %d) ended: %s", process.pid, _how(code))
        self._on_change()
        return code

    def _ended_blocking(self, process: subprocess.Popen[bytes]) -> int:
        """Its exit status: at stop, once `stop` saw it end; else after a moment to end on its
        own (an engine whose pipe broke stops by itself), killed after that."""
        if self._stopping.is_set():
            return process.wait()
        try:
            return process.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def _watch_blocking(self, process: subprocess.Popen[bytes], pipe: Pipe) -> None:
        """Ping until the engine is lost, ends, or is silent too long (then killed)."""
        count = 0
        while not self._lost.wait(PING_SECONDS):
            if process.poll() is not None:
                return
            silent = time.monotonic() - self._said
            allowed = self._hang if self._hello else HELLO_SECONDS
            if silent > allowed and not self._stopping.is_set():
                _LOGGER.error(
                    "The engine (pid %d) said nothing for %.0f s: killed", process.pid, silent
                )
                process.kill()
                return
            count += 1
            pipe.send(encode("ping", {"n": count}))


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def engine_command(config_path: str | None, debug: bool) -> list[str]:
    """The command line of the engine: this interpreter, the agent's `engine` command."""
    command = [sys.executable, "-m", "agent", "engine"]
    if config_path is not None:
        command += ["--config", config_path]
    if debug:
        command.append("--debug")
    return command


def environment() -> dict[str, str]:
    """The engine's environment: the sounder's."""
    return dict(os.environ)
