"""Rhasspy's own Hermes library as a client: rhasspy-hermes 0.6.2 in a venv of its own.

rhasspy-hermes pins paho-mqtt 1.5.0 (the project uses paho 2), and imports `audioop` (gone in
Python 3.13), so it lives in `.cache/rhasspy-hermes/`, built once from PyPI with a Python 3.8-3.12
found on the machine and reused. `RhasspyClient` runs `rhasspy_client.py` in it as a subprocess
and talks to it in JSON lines: each message is built by the library's own classes and published
by its paho; each reply is parsed by the library's class for its topic.
"""

from __future__ import annotations

import base64
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from .broker import Broker
from .wait import ROOT, TIMEOUT, wait_until

VENV: Final = ROOT / ".cache" / "rhasspy-hermes"
"""Where the venv lives (git-ignored; built once, reused while its stamp matches)."""
REQUIREMENTS: Final = (
    "rhasspy-hermes==0.6.2",
    "paho-mqtt==1.5.0",
    "dataclasses-json==0.5.6",
    "marshmallow==3.26.2",
    "marshmallow-enum==1.5.1",
    "typing-inspect==0.9.0",
    "mypy-extensions==1.2.0",
    "typing-extensions==4.16.0",
)
"""rhasspy-hermes and everything it pulls in, pinned (the first two are its own pins)."""
PYTHONS: Final = (
    "/usr/bin/python3.11",
    "/usr/bin/python3",
    str(Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin" / "python3"),
    str(Path.home() / ".pyenv" / "versions" / "3.11.7" / "bin" / "python3"),
)
"""Pythons tried in turn for the venv: the first that has `audioop` and `venv` wins."""
INSTALL_TIMEOUT: Final = 600.0
"""Longest a venv build may take (seconds)."""
CLIENT: Final = Path(__file__).with_name("rhasspy_client.py")
"""The script the venv's python runs."""
_STAMP: Final = "voice-agent-stamp.json"


@dataclass(frozen=True)
class RhasspyEnv:
    """The venv with rhasspy-hermes: its python, the base Python it was made from, and how long
    `ensure_venv` took (seconds; a build when `built`)."""

    python: Path
    base_python: str
    base_version: str
    built: bool
    seconds: float


def ensure_venv(venv: Path = VENV) -> RhasspyEnv:
    """The venv, built now if missing or stale. Other processes wait on a lock meanwhile; the
    build happens in a sibling folder renamed into place, so a half-built venv is never used."""
    started = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with _locked(venv.parent / f"{venv.name}.lock"):
        stamp = _read_stamp(venv)
        built = stamp is None
        if stamp is None:
            stamp = _build(venv)
    return RhasspyEnv(
        venv / "bin" / "python",
        stamp["python"],
        stamp["version"],
        built,
        time.monotonic() - started,
    )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_stamp(venv: Path) -> dict[str, str] | None:
    """The stamp of a usable venv with these requirements, else None."""
    try:
        stamp = json.loads((venv / _STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    usable = (venv / "bin" / "python").exists()  # a dangling link: its base Python is gone
    if not usable or stamp.get("requirements") != list(REQUIREMENTS):
        return None
    return {"python": str(stamp["python"]), "version": str(stamp["version"])}


def _build(venv: Path) -> dict[str, str]:
    base, version = _find_python()
    staging = venv.with_name(f"{venv.name}.building")
    shutil.rmtree(staging, ignore_errors=True)
    _run([base, "-m", "venv", str(staging)])
    python = str(staging / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-q"]
    _run([*pip, *REQUIREMENTS])
    _run([python, "-W", "ignore", "-c", "import rhasspyhermes.audioserver, rhasspyhermes.tts"])
    stamp = {"python": base, "version": version, "requirements": list(REQUIREMENTS)}
    (staging / _STAMP).write_text(json.dumps(stamp), encoding="utf-8")
    shutil.rmtree(venv, ignore_errors=True)
    staging.rename(venv)  # the venv's python finds its prefix from its own path: still valid
    return {"python": base, "version": version}


def _find_python() -> tuple[str, str]:
    """The first Python of PYTHONS that can make a venv and has `audioop`, and its version."""
    probe = "import audioop, ensurepip, platform, venv; print(platform.python_version())"
    tried = []
    for candidate in PYTHONS:
        if not Path(candidate).exists():
            tried.append(f"{candidate}: missing")
            continue
        result = subprocess.run(
            [candidate, "-W", "ignore", "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode == 0:
            return candidate, result.stdout.strip()
        tried.append(f"{candidate}: {result.stderr.strip().splitlines()[-1:]}")
    raise RuntimeError(f"no Python 3.8-3.12 with venv for rhasspy-hermes: {tried}")


def _run(command: list[str]) -> None:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{result.stdout}\n{result.stderr}")


@dataclass(frozen=True)
class Published:
    """What the library made of one command: topic, JSON body (None for binary), size, when."""

    seq: int
    topic: str
    payload: dict[str, Any] | None
    size: int
    at: float


@dataclass(frozen=True)
class Reply:
    """A message the client received, as the library parsed it."""

    topic: str
    type: str | None
    """The rhasspy-hermes class that parsed it (None: no class for this topic)."""
    message: dict[str, Any] | None
    """The parsed message's `to_dict()` (camelCase keys); None when parsing failed."""
    payload: Any
    """The JSON as received."""
    error: str | None
    """Why the library could not parse it."""
    at: float
    """time.time() when the client received it."""


class RhasspyClient:
    """rhasspy-hermes publishing and listening, as a subprocess of the venv's python."""

    def __init__(self, broker: Broker, python: Path) -> None:
        self._errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 - kept open while it runs
        self._process = subprocess.Popen(
            [str(python), str(CLIENT), broker.host, str(broker.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._records: list[dict[str, Any]] = []
        self._seq = 0
        assert self._process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,))
        self._reader.daemon = True
        self._reader.start()
        wait_until(lambda: bool(self._find("ready")) or not self._alive(), what="client ready")
        assert self._find("ready"), self._stderr()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self._records.append(json.loads(line))

    def _alive(self) -> bool:
        return self._process.poll() is None

    def _stderr(self) -> str:
        self._errors.seek(0)
        return self._errors.read() or "(nothing on stderr)"

    def _find(self, event: str, seq: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = [r for r in self._records if r["event"] == event]
        return [r for r in found if seq is None or r["seq"] == seq]

    def send(
        self,
        kind: str,
        topic_args: dict[str, str] | None = None,
        wav: bytes | None = None,
        qos: int = 0,
        **fields: Any,
    ) -> Published:
        """Build a message of class `kind` (e.g. `TtsSay`) from `fields` (its own keyword
        arguments; `wav` for AudioPlayBytes), publish it, and return what was sent."""
        self._seq += 1
        command: dict[str, Any] = {"seq": self._seq, "type": kind, "fields": fields, "qos": qos}
        command["topic_args"] = topic_args or {}
        if wav is not None:
            command["wav_b64"] = base64.b64encode(wav).decode("ascii")
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        seq = self._seq

        def done() -> bool:
            return bool(self._find("published", seq) or self._find("failed", seq))

        wait_until(lambda: done() or not self._alive(), what=f"{kind} published")
        failed = self._find("failed", seq)
        assert not failed, failed
        assert self._alive(), self._stderr()
        (record,) = self._find("published", seq)
        return Published(seq, record["topic"], record["payload"], record["size"], record["at"])

    def play_bytes(self, site_id: str, request_id: str, wav: bytes) -> Published:
        """`AudioPlayBytes` to `hermes/audioServer/<site_id>/playBytes/<request_id>`."""
        args = {"site_id": site_id, "request_id": request_id}
        return self.send("AudioPlayBytes", topic_args=args, wav=wav)

    def replies(self, where: Callable[[Reply], bool] = lambda _reply: True) -> list[Reply]:
        """The replies received so far (those `where` accepts), in order."""
        found = [
            Reply(r["topic"], r["type"], r["message"], r["payload"], r["error"], r["at"])
            for r in self._find("received")
        ]
        return [reply for reply in found if where(reply)]

    def wait_for(
        self,
        where: Callable[[Reply], bool],
        count: int = 1,
        timeout: float = TIMEOUT,
    ) -> list[Reply]:
        """Wait until `count` replies that `where` accepts arrived; return them all (on a
        timeout, the error lists every reply that did arrive)."""
        try:
            wait_until(lambda: len(self.replies(where)) >= count, timeout, f"{count} reply(ies)")
        except AssertionError as err:
            seen = "\n".join(f"  {reply}" for reply in self.replies()) or "  (none)"
            raise AssertionError(f"{err}; the client received:\n{seen}") from None
        return self.replies(where)

    def close(self) -> None:
        """End its input; it disconnects and exits."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._reader.join(10)
        self._errors.close()


def main() -> int:
    """Build (or find) the venv and print what was used and how long it took."""
    env = ensure_venv()
    print(json.dumps({k: str(v) for k, v in env.__dict__.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
