"""The Wyoming edge's zeroconf: the node's Wyoming servers advertised by multicast DNS
(`_wyoming._tcp.local.`, the type Home Assistant's Wyoming integration browses for), so that Home
Assistant offers each as a discovered integration and, once confirmed, connects to the advertised
address and port and sends `describe`.

One `Zeroconf` of the `zeroconf` package (its own thread and asyncio loop, its own sockets on
UDP 5353) carries every service: the TTS server and, when there is one, the announce-target
satellite server, each a `ServiceInfo` of its own port under an instance name made a valid
DNS-SD label here (control and format characters dropped, dots made hyphens: zeroconf writes a dot
as a label break; cut to 59 bytes of UTF-8 at a character boundary, leaving room for the `-2` a
rename appends). Their host name is the machine's own label with `-voice-agent` appended
(`kitchen-voice-agent.local.`), never the machine's `<host>.local.`, which Avahi may own with
another set of addresses. The addresses are those a client can reach the bind address at
(`addresses_for`): a wildcard bind gives every non-loopback address of its family (ifaddr's
list, the one zeroconf itself reads), a loopback bind none, so nothing is advertised.

Advertising is never in the agent's way: `start` opens the sockets (milliseconds) and hands
each registration to zeroconf's loop, where probing and announcing take about 1.7 s, and returns
at once. A failure (sockets that cannot be opened, an interface that is not there, a
registration refused) is one warning line and the agent goes on unadvertised; a name another
host holds is renamed by zeroconf (`-2`, `-3`…) and logged. `stop` cancels what is still probing,
sends the goodbyes (about 0.3 s) and closes the sockets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import logging
import re
import socket
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import ifaddr
from zeroconf import InterfaceChoice, ServiceInfo, Zeroconf

_LOGGER = logging.getLogger(__name__)

SERVICE_TYPE: Final = "_wyoming._tcp.local."
"""The DNS-SD type Home Assistant's Wyoming integration browses for (its manifest's
`zeroconf`)."""
LABEL_BYTES: Final = 59
"""Bytes of UTF-8 an instance name has at most: DNS-SD's 63 less room for the `-NNN` zeroconf
appends when another host holds the name."""
PRODUCT: Final = "voice-agent"
"""The first word of every instance name, and the name of last resort."""
SERVER_SUFFIX: Final = "-voice-agent"
"""Appended to the machine's host label to make the services' host name."""
_WHITESPACE: Final = re.compile(r"\s+")
_NOT_HOST: Final = re.compile(r"[^a-z0-9-]+")

Interfaces: TypeAlias = Sequence[str | int] | InterfaceChoice
"""Where zeroconf listens and sends: every interface (`InterfaceChoice.All`), or a list of
addresses of this host (IPv6 ones may be interface indexes)."""


def instance_label(text: str) -> str:
    """`text` as a DNS-SD instance label: NFC, control and format characters (Unicode C*) and
    line breaks made spaces, dots made hyphens, white space collapsed, cut to `LABEL_BYTES` of
    UTF-8 at a character boundary; `voice-agent` when nothing is left. Idempotent."""
    kept = []
    for char in unicodedata.normalize("NFC", text):
        category = unicodedata.category(char)
        if category[0] == "C" or category in {"Zl", "Zp"}:
            kept.append(" ")
        elif char == ".":
            kept.append("-")
        else:
            kept.append(char)
    label = _WHITESPACE.sub(" ", "".join(kept)).strip()
    cut = label.encode("utf-8")[:LABEL_BYTES].decode("utf-8", errors="ignore")
    # a cut may leave a combining mark on its own at the end: NFC again, and no trailing space
    label = unicodedata.normalize("NFC", cut).strip()
    while len(label.encode("utf-8")) > LABEL_BYTES:  # NFC of a cut can grow: cut again
        label = label[:-1].rstrip()
    return label or PRODUCT


def instance_name(node_id: str, role: str = "") -> str:
    """The instance name of one of the node's services: `voice-agent <node_id>`, with ` <role>`
    for a second one (`satellite`); a long node id is cut so that the role is kept."""
    suffix = f" {instance_label(role)}" if role.strip() else ""
    head = f"{PRODUCT} {node_id}"
    room = LABEL_BYTES - len(suffix.encode("utf-8"))
    head = instance_label(head).encode("utf-8")[:room].decode("utf-8", errors="ignore").rstrip()
    return instance_label(head + suffix)


def server_name(hostname: str | None = None) -> str:
    """The services' host name: this machine's first host label (lower case, letters, digits
    and hyphens) with `-voice-agent`, in `local.`."""
    first = (socket.gethostname() if hostname is None else hostname).split(".", 1)[0]
    host = _NOT_HOST.sub("-", first.lower()).strip("-")[: 63 - len(SERVER_SUFFIX)].strip("-")
    return f"{host or 'node'}{SERVER_SUFFIX}.local."


@dataclass(frozen=True, slots=True)
class Advertised:
    """One service instance: its instance name (made a valid label on construction, see
    `instance_label`) and its TCP port."""

    name: str
    port: int

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port")
        object.__setattr__(self, "name", instance_label(self.name))


def _usable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether another host can reach this one at the address: not loopback, not unspecified,
    not IPv6 link-local (without its interface the address is ambiguous; Home Assistant skips
    link-local addresses anyway)."""
    if address.is_loopback or address.is_unspecified:
        return False
    return not (isinstance(address, ipaddress.IPv6Address) and address.is_link_local)


def _local_addresses(version: int) -> list[str]:
    """This host's addresses of one IP version, in ifaddr's order, without duplicates."""
    found: list[str] = []
    try:
        adapters = ifaddr.get_adapters()
    except OSError as err:
        _LOGGER.warning("Wyoming: this host's addresses cannot be listed: %s", _describe(err))
        return found
    for adapter in adapters:
        for ip in adapter.ips:
            text = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            address = ipaddress.ip_address(text.split("%", 1)[0])
            if address.version == version and _usable(address) and str(address) not in found:
                found.append(str(address))
    return found


def addresses_for(host: str) -> list[str]:
    """The addresses to advertise for a server bound to `host` (as `asyncio.start_server`
    binds it): for `0.0.0.0` every non-loopback IPv4 address of this host, for `::` every
    non-loopback, non-link-local IPv6 one (asyncio binds `::` IPv6-only), for `""` both; for a
    loopback address (or a name that resolves to one only) none, since no other host can reach
    it; for another address that address; a name is looked up as the bind looks it up (a DNS
    query; none when it does not resolve)."""
    host = host.strip()
    if host in {"", "0.0.0.0", "::"}:  # noqa: S104 - wildcards are the point
        versions = {"": (4, 6), "0.0.0.0": (4,), "::": (6,)}[host]  # noqa: S104
        return [a for version in versions for a in _local_addresses(version)]
    try:
        literal = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    else:
        if isinstance(literal, ipaddress.IPv6Address) and literal.ipv4_mapped is not None:
            literal = literal.ipv4_mapped
        return [str(literal)] if _usable(literal) else []
    try:
        resolved = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return []
    addresses: list[str] = []
    for *_, sockaddr in resolved:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if _usable(address) and str(address) not in addresses:
            addresses.append(str(address))
    return addresses


class ZeroconfAdvertiser:
    """The node's Wyoming services on multicast DNS, from `start` to `stop`.

    `start` returns at once (the registrations run on zeroconf's own thread); `wait` waits for
    them to settle, `registered` says which were announced and under which names. Nothing here
    raises to the caller: a failure is one warning line and the service stays unadvertised."""

    def __init__(
        self,
        services: Sequence[Advertised],
        addresses: Sequence[str],
        interfaces: Interfaces = InterfaceChoice.All,
        *,
        server: str | None = None,
    ) -> None:
        self._services = tuple(services)
        self._addresses = tuple(addresses)
        self._interfaces = interfaces
        self._server = server or server_name()
        self._lock = threading.Lock()
        self._zeroconf: Zeroconf | None = None
        self._pending: list[concurrent.futures.Future[None]] = []
        self._registered: list[Advertised] = []
        self._unsettled = len(self._services)
        self._settled = threading.Event()
        self._started = False

    @property
    def registered(self) -> tuple[Advertised, ...]:
        """The services announced so far, under the names they were announced with (a rename
        after a conflict included), in the order they settled."""
        with self._lock:
            return tuple(self._registered)

    def wait(self, timeout: float) -> bool:
        """Whether every registration settled (announced or failed) within `timeout` seconds."""
        return self._settled.wait(timeout)

    def start(self) -> None:
        """Open zeroconf's sockets and hand every registration to its loop; returns at once."""
        with self._lock:
            if self._started:
                return
            self._started = True
        if not self._services or not self._addresses:
            _LOGGER.info(
                "Wyoming: not advertised by zeroconf: no address other hosts can reach "
                "(a loopback bind is served to this host only)"
            )
            self._settled.set()
            return
        try:
            infos = [self._info(service) for service in self._services]
            zeroconf = Zeroconf(interfaces=self._interfaces)
        except Exception as err:  # noqa: BLE001 - advertising never stops the agent
            _LOGGER.warning(
                "Wyoming: not advertised by zeroconf (addresses %s, interfaces %s): %s",
                ", ".join(self._addresses),
                self._interfaces,
                _describe(err),
            )
            self._settled.set()
            return
        loop = zeroconf.loop
        assert loop is not None  # noqa: S101 - a started Zeroconf has its loop
        with self._lock:
            self._zeroconf = zeroconf
            for service, info in zip(self._services, infos, strict=True):
                future = asyncio.run_coroutine_threadsafe(_register(zeroconf, info), loop)
                future.add_done_callback(functools.partial(self._done, service=service, info=info))
                self._pending.append(future)

    def stop(self) -> None:
        """Cancel what is still probing, send the goodbyes of what was announced, close the
        sockets (about 0.3 s). Safe to call twice, or without `start`."""
        with self._lock:
            zeroconf, self._zeroconf = self._zeroconf, None
            pending, self._pending = self._pending, []
        for future in pending:
            future.cancel()
        if zeroconf is None:
            return
        try:
            zeroconf.close()  # goodbyes for every registered service, then the sockets
        except Exception as err:  # noqa: BLE001 - the agent stops anyway
            _LOGGER.warning("Wyoming: zeroconf did not close cleanly: %s", _describe(err))
        with self._lock:
            self._registered.clear()

    def _info(self, service: Advertised) -> ServiceInfo:
        return ServiceInfo(
            SERVICE_TYPE,
            f"{service.name}.{SERVICE_TYPE}",
            port=service.port,
            parsed_addresses=list(self._addresses),
            server=self._server,
        )

    def _done(
        self, future: concurrent.futures.Future[None], service: Advertised, info: ServiceInfo
    ) -> None:
        """On zeroconf's thread: one registration settled."""
        if future.cancelled():
            pass
        elif (err := future.exception()) is not None:
            _LOGGER.warning(
                "Wyoming: %r (port %d) not advertised by zeroconf: %s",
                service.name,
                service.port,
                _describe(err),
            )
        else:
            name = info.name.removesuffix(f".{SERVICE_TYPE}")
            if name != service.name:
                _LOGGER.info(
                    "Wyoming: %r is taken on the network; advertised as %r", service.name, name
                )
            with self._lock:
                self._registered.append(Advertised(name, service.port))
            _LOGGER.info("Wyoming: advertised %r (port %d) by zeroconf", name, service.port)
        with self._lock:
            self._unsettled -= 1
            if self._unsettled == 0:
                self._settled.set()


async def _register(zeroconf: Zeroconf, info: ServiceInfo) -> None:
    """Probe (a name another host holds is renamed) and announce, on zeroconf's loop."""
    announced = await zeroconf.async_register_service(info, allow_name_change=True)
    await announced


def _describe(err: BaseException) -> str:
    """An exception as one line."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
