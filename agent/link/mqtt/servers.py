"""The brokers of the link: the ring it goes round (the server of the next attempt, the one
after, the MQTT version each speaks, how long to wait) and what a paho client needs for one of
them (its TLS context, the words of a refusal).

The ring's rule (docs/brokers.md): an attempt that fails moves to the next server, wrapping;
the wait before it is short while the round lasts (each server tried once since the last
connection or the last full round), and backs off, growing with each full round, once every
server failed in turn. With `mqtt.protocol: auto` a server that refuses MQTT 5 (CONNACK
"Unsupported protocol version") or closes the connection before any CONNACK is tried again at
once with MQTT 3.1.1; when that connects, the server is remembered as a 3.1.1 one for the life
of the link. A server that once took MQTT 5 is never tried with 3.1.1 again but for an explicit
refusal of the version: a connection it closes early (a restart, a session taken over, a refusal
of any other kind) says nothing of the version it speaks.

Each server has its own credentials (`mqtt.hosts[i].username` and `password_file`), sent to it
alone: a server of the ring never learns another's password.

A ring may follow a leader (`follow`: the engine's link follows the sounder's server, so that
the node's two sessions meet on one broker): its first attempt goes to the leader's server, and
after a failure or a loss elsewhere the next attempt goes there; a failure or a loss on the
leader's server itself goes on round the ring as usual (the leader, whose session saw the same
broker go, most likely goes the same way, and says where it went).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import random
import ssl
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from agent.settings.declarations import MqttProtocol, MqttServer, TlsConfig

_LOGGER = logging.getLogger(__name__)

Version = Literal["5", "3.1.1"]
"""An MQTT version a connection speaks."""
V5: Final = "5"
V311: Final = "3.1.1"

UNSUPPORTED_PROTOCOL: Final = 132
"""The CONNACK reason "Unsupported protocol version" (paho's for a 3.1.1 return code 1 too)."""
_V311_RETURN_CODES: Final = {132: 1, 133: 2, 136: 3, 134: 4, 135: 5}
"""MQTT 3.1.1 CONNACK return codes by the MQTT 5 reason paho reports them as."""


class Step(enum.Enum):
    """Where the attempt after a failed one goes, and how soon."""

    SAME = "the same server with MQTT 3.1.1, at once"
    NEXT = "the next server of the round, after a short delay"
    ROUND = "the next round, after the backoff of a failed round"


class Ring:
    """The servers in order, the one of the next attempt, and what each was found to speak.

    Used by the link's network thread only (its `index` is read by others, atomically)."""

    def __init__(self, servers: Sequence[MqttServer], protocol: MqttProtocol) -> None:
        if not servers:
            raise ValueError("no MQTT server")
        self.servers = tuple(servers)
        self._protocol = protocol
        self.index = 0
        """The server of the current connection, or of the next attempt."""
        self.rounds = 0
        """Rounds in which every server failed, since the last connection."""
        self._tried = 0  # servers that failed in this round
        self._fallback = False  # the next attempt is the 3.1.1 retry on the same server
        self._fallback_refused = False  # ...after an explicit refusal of MQTT 5
        self._v311_only: set[int] = set()
        self._took_v5: set[int] = set()
        self.leader: int | None = None
        """The server this ring follows (set by `follow`), None for none."""

    @property
    def current(self) -> MqttServer:
        """The server of the current connection, or of the next attempt."""
        return self.servers[self.index]

    def find(self, address: str) -> int | None:
        """The index of the server of this address (`MqttServer.address`), None if none."""
        for index, server in enumerate(self.servers):
            if server.address == address:
                return index
        return None

    def follow(self, address: str) -> int | None:
        """Follow the server of this address from now on (the attempt after the next failure
        or loss goes there); its index, None (nothing changed) for an address not in the ring.
        Safe from another thread: one assignment."""
        index = self.find(address)
        if index is not None:
            self.leader = index
        return index

    def start_at_leader(self) -> None:
        """The link's first attempt goes to the leader's server, when it follows one."""
        if self.leader is not None:
            self.index = self.leader

    def _next(self) -> int:
        """The server after the current one: the leader's when there is one and it is not the
        current one, else the next in order."""
        leader = self.leader
        if leader is not None and leader != self.index:
            return leader
        return (self.index + 1) % len(self.servers)

    @property
    def version(self) -> Version:
        """The MQTT version of the next attempt on the current server."""
        if self._protocol == V5:
            return V5
        if self._protocol == V311 or self._fallback or self.index in self._v311_only:
            return V311
        return V5

    def failed(self, *, maybe_not_v5: bool, refused_version: bool = False) -> Step:
        """An attempt on the current server failed (`maybe_not_v5`: an MQTT 5 CONNECT was
        refused as an unsupported version (`refused_version`), or the connection closed before
        any CONNACK); moves to the server of the next attempt and says how soon it is. A server
        that took MQTT 5 before is tried with 3.1.1 only after an explicit refusal."""
        known_v5 = self.index in self._took_v5 and not refused_version
        if maybe_not_v5 and self._protocol == "auto" and self.version == V5 and not known_v5:
            self._fallback = True
            self._fallback_refused = refused_version
            return Step.SAME
        self._fallback = False
        self.index = self._next()
        self._tried += 1
        if self._tried < len(self.servers):
            return Step.NEXT
        self._tried = 0
        self.rounds += 1
        return Step.ROUND

    def connected(self) -> bool:
        """The attempt on the current server connected; True when that taught the ring that
        the server speaks MQTT 3.1.1 only (it is not offered MQTT 5 again)."""
        # only an explicit refusal of MQTT 5 is remembered for good: an early close may have
        # been the broker going down (a restart) while a new process first connected
        learned = self._fallback and self._fallback_refused
        if learned:
            self._v311_only.add(self.index)
        elif self.version == V5:
            self._took_v5.add(self.index)
        self._fallback = False
        self._tried = 0
        self.rounds = 0
        return learned

    def lost(self) -> None:
        """The connection that was up ended: the next attempt goes to the next server (the
        leader's, when the ring follows one and was elsewhere), and a new round begins there."""
        self.index = self._next()
        self._fallback = False
        self._tried = 0
        self.rounds = 0


def delay(step: Step, rounds: int, low: float, high: float) -> float:
    """Seconds before the attempt a failure led to: none for the 3.1.1 retry, up to `low` for
    the next server of a round, and after the `rounds`-th failed round full jitter between
    `low` and a cap doubling from `low` up to `high`, plus up to `low` more (so that even the
    first retries of a fleet spread out)."""
    if step is Step.SAME:
        return 0.0
    if step is Step.NEXT:
        return random.uniform(0, low)  # noqa: S311 - jitter, not a secret
    cap = max(low, min(high, low * 2 ** (max(rounds, 1) - 1)))
    return random.uniform(low, cap) + random.uniform(0, low)  # noqa: S311


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The context of a TLS server: its certificate verified against `ca_file` (or the
    system's CAs) and its host name checked; the client certificate when one is set. Raises
    OSError or ssl.SSLError for files that cannot be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    if tls.ca_file is not None:
        context.load_verify_locations(cafile=str(tls.ca_file))
    else:
        context.load_default_certs()
    if tls.cert_file is not None:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file) if tls.key_file else None)
    return context


def tls_contexts(servers: Sequence[MqttServer]) -> tuple[ssl.SSLContext | None, ...]:
    """Each server's TLS context (None without TLS), made once: a paho client takes its
    context once (`tls_set_context`), and a new client is made for another server."""
    return tuple(tls_context(s.tls) if s.tls.enabled else None for s in servers)


def refusal(reason: ReasonCode, version: Version) -> str:
    """A CONNACK refusal in words: paho's reason name, and for MQTT 3.1.1 the return code the
    broker sent (paho reports it as the matching MQTT 5 reason)."""
    if version == V311 and reason.value in _V311_RETURN_CODES:
        return f"{reason} (MQTT 3.1.1 return code {_V311_RETURN_CODES[reason.value]})"
    return str(reason)


_MAX_PASSWORD_FILE_BYTES: Final = 65536


def read_password(path: Path | None) -> str | None:
    """A broker password: the first line of its file (None without one), read as a regular
    file of at most 64 KiB; a warning when other users than the agent's can read it. Raises
    OSError (or UnicodeDecodeError) for a file that cannot be used."""
    if path is None:
        return None
    if path.stat().st_mode & 0o077:
        _LOGGER.warning("%s can be read by other users than the agent's: chmod 600 it", path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is no regular file")
        text = handle.read(_MAX_PASSWORD_FILE_BYTES).decode("utf-8")
    lines = text.splitlines()
    return lines[0] if lines else ""


def passwords(servers: Sequence[MqttServer]) -> tuple[str | None, ...]:
    """Each server's own password (None without one), read once at start: a file that cannot
    be used fails the start, not a later reconnect."""
    return tuple(read_password(s.password_file) for s in servers)


def credentials(client: mqtt.Client, server: MqttServer, password: str | None) -> None:
    """Give a paho client the credentials of this server, and of no other."""
    if server.username is not None:
        client.username_pw_set(server.username, password)
