"""Where the node may connect to fetch something (URL sounds, OTA files): the egress policy.

A policy is a list of entries, each one of
- a host name: `homeassistant.local`, `releases.example.com` (matched as written in the URL,
  case-insensitively; an international name in any of its two spellings);
- an IP address: `192.168.1.10`, `fd00::10`;
- a network (CIDR): `192.168.1.0/24`, `fd00::/8`;
each optionally followed by a port: `host:8123`, `192.168.1.0/24:8123`, `host:*` for any port.
An IPv6 address or network takes a port only in brackets: `[fd00::10]:8123`, `[fd00::/8]:*`;
written without brackets it has none (`fd00::1:8123` is the address fd00::1:8123). An entry
without a port allows the web ports 80 and 443 only.

A URL may be fetched when its host, as written, is allowed on its port: a name by a name entry
(never by an address entry: `http://homeassistant.local/` needs the name listed), an address by
an address or network entry (a short or numeric IPv4 spelling such as `127.1` or `2130706433`
is read as the address it is). Then every address connected to is checked again: the address
that the name resolved to, after every redirect. Loopback, link-local, unspecified ("this
host"), multicast, broadcast and reserved addresses, and the node's own addresses, are refused
whatever allowed the host, unless an address or network entry names them explicitly: an entry
that contains the address and lies wholly inside that class (`127.0.0.1`, `127.0.0.0/8`,
`[::1]:8123`, `169.254.0.0/16`), or for the node's own addresses, the address itself. So
`0.0.0.0/0` allows no loopback address, and `192.168.1.0/24` not the node's own 192.168.1.5.
IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) are the IPv4 address they carry, in URLs,
entries and connections alike. A URL with credentials (`user:password@`) is never allowed.

Pure: no I/O (whether an address is the node's own is the caller's to say).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

WEB_PORTS: Final = frozenset({80, 443})
"""The ports an entry without a port allows."""
ANY_PORT: Final = 0
"""`Entry.port` of `host:*`."""
DEFAULT_PORTS: Final = {"http": 80, "https": 443}

_MAPPED: Final = ipaddress.IPv6Network("::ffff:0:0/96")
_CLASSES: Final[tuple[tuple[str, tuple[IPNetwork, ...]], ...]] = tuple(
    (name, tuple(ipaddress.ip_network(n) for n in networks))
    for name, networks in (
        ("loopback", ("127.0.0.0/8", "::1/128")),
        ("link-local", ("169.254.0.0/16", "fe80::/10")),
        ("unspecified", ("0.0.0.0/8", "::/128")),
        ("multicast", ("224.0.0.0/4", "ff00::/8")),
        ("broadcast", ("255.255.255.255/32",)),
        ("reserved", ("240.0.0.0/4",)),
    )
)
"""Address classes refused unless named explicitly, each with its networks."""
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_BAD_NAME: Final = (
    "not a valid host name (labels of 1-63 letters, digits, _ and inner hyphens; 253 in all)"
)


def mapped(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv4-mapped IPv6 address carries; any other address as it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def special_class(address: IPAddress) -> str | None:
    """The refused class of an address (`loopback`, `link-local`, ...), None for an ordinary
    one (the node's own addresses are the caller's to tell)."""
    address = mapped(address)
    for name, networks in _CLASSES:
        if any(address in network for network in networks):
            return name
    return None


def host_address(host: str) -> IPAddress | None:
    """The address a URL's host names, if it is one: `192.168.1.10`, `fd00::1` (brackets
    already removed, as `urlsplit(...).hostname` gives it), also the short and numeric IPv4
    spellings the system's resolver reads as addresses (`127.1`, `2130706433`, `0x7f000001`);
    None for a host name."""
    try:
        return mapped(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or not host.isascii() or not host.isprintable() or " " in host:
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def normalize_name(name: str) -> str:
    """A host name as compared: lower case, ASCII (IDNA), without a trailing dot. Raises
    ValueError for a name that is no DNS name."""
    name = name[:-1] if name.endswith(".") else name
    try:
        ascii_name = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(_BAD_NAME) from None
    labels = ascii_name.split(".")
    if not ascii_name or len(ascii_name) > 253 or any(not 0 < len(x) <= 63 for x in labels):
        raise ValueError(_BAD_NAME)
    if any(set(x) - _NAME_CHARS or x.startswith("-") or x.endswith("-") for x in labels):
        raise ValueError(_BAD_NAME)
    return ascii_name


@dataclass(frozen=True, slots=True)
class Entry:
    """One allowed host, address or network, and its port."""

    text: str
    """As written in the config."""
    name: str | None = None
    """A host name (normalized), or None for an address or network."""
    network: IPNetwork | None = None
    port: int | None = None
    """The one port allowed; ANY_PORT for any; None for the web ports (80, 443)."""

    def allows_port(self, port: int) -> bool:
        """Whether the entry allows `port`."""
        if self.port is None:
            return port in WEB_PORTS
        return self.port in (ANY_PORT, port)

    def names(self, address: IPAddress) -> bool:
        """Whether the entry names a refused address explicitly: it contains it and lies wholly
        inside its class (the node's own addresses: only the address itself, `own`)."""
        if self.network is None or address not in self.network:
            return False
        kind = special_class(address)
        if kind is None:  # the node's own
            return self.network.num_addresses == 1
        networks = dict(_CLASSES)[kind]
        return any(
            self.network.version == n.version and self.network.subnet_of(n)  # type: ignore[arg-type]
            for n in networks
        )


def parse_entry(text: str) -> Entry:
    """An entry of `audio.media_hosts` or `ota.hosts` (see the module's syntax). Raises
    ValueError saying what is wrong."""
    if not isinstance(text, str) or not text or text != text.strip():
        raise ValueError("expected a host name, IP address or network, optionally with :port")
    if "://" in text or "@" in text or "?" in text or "#" in text:
        raise ValueError("expected a host, address or network (with :port), not a URL")
    if text.startswith("["):
        inner, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError("expected [IPv6 address or network] or [...]:port")
        port = _port(rest[1:]) if rest else None
        network = _network(inner)
        if network.version != 6 and not inner.startswith("::ffff:"):
            raise ValueError("brackets are for an IPv6 address or network only")
        return Entry(text, network=network, port=port)
    if text.count(":") >= 2:  # an IPv6 address or network without brackets: no port
        return Entry(text, network=_network(text))
    host, colon, port_text = text.partition(":")
    port = _port(port_text) if colon else None
    if "/" in host or _is_ipv4(host):
        return Entry(text, network=_network(host), port=port)
    if host_address(host) is not None:
        canonical = host_address(host)
        raise ValueError(f"an IPv4 address in a short or numeric form: write it as {canonical}")
    return Entry(text, name=normalize_name(host), port=port)


def entry_problem(value: object) -> str | None:
    """What is wrong with a config entry, None if nothing (for the config's validation)."""
    try:
        parse_entry(value)  # type: ignore[arg-type]
    except ValueError as err:
        return str(err)
    return None


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _network(text: str) -> IPNetwork:
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as err:
        if "host bits set" in str(err):
            loose = ipaddress.ip_network(text, strict=False)
            raise ValueError(f"host bits set: the network is {loose}") from None
        raise ValueError(f"not an IP address or network ({err})") from None
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        v4 = int(network.network_address) & 0xFFFFFFFF  # an IPv4-mapped network: that network
        return ipaddress.IPv4Network((v4, network.prefixlen - 96))
    return network


def _port(text: str) -> int:
    if text == "*":
        return ANY_PORT
    if not text.isdecimal() or not text.isascii() or not 1 <= int(text) <= 65535:
        raise ValueError("expected a port from 1 to 65535, or * for any")
    return int(text)


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The hosts a kind of fetch may reach; empty refuses every URL."""

    entries: tuple[Entry, ...] = ()
    key: str = "audio.media_hosts"
    """The config key the entries come from (named in every refusal)."""

    @classmethod
    def parse(cls, texts: Iterable[str], key: str) -> EgressPolicy:
        """The policy of a config key's entries (validated by the config: raises ValueError)."""
        return cls(tuple(parse_entry(text) for text in texts), key)

    def url_problem(self, url: str) -> str | None:
        """Why `url` may not be fetched, decided from the URL as written (scheme, credentials,
        host and port), or None. Safe to publish: it repeats the host and port, never the
        credentials, path or query."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError:
            return "not a valid URL"
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            return "an http or https URL only"
        if "@" in parts.netloc:
            return "a URL with credentials (user:password@) is never fetched"
        if not parts.hostname:
            return "a URL without a host"
        return self.host_problem(parts.hostname, port or DEFAULT_PORTS[scheme])

    def host_problem(self, host: str, port: int) -> str | None:
        """Why a host, as written in a URL (without brackets), may not be reached on `port`."""
        allowed, problem = self._host_entries(host, port)
        if problem is not None:
            return problem
        if not allowed:
            if not self.entries:
                return f"{self.key} is empty: no host is allowed"
            return f"{_shown(host)} port {port} is not allowed by {self.key}"
        address = host_address(host)
        if address is not None:
            return self._class_problem(address, port, own=False)
        return None

    def address_problem(
        self, host: str, address: IPAddress, port: int, *, own: bool = False
    ) -> str | None:
        """Why a connection to `address` on `port`, for `host` as written in the URL, is
        refused, or None. `own`: the address is one of the node's own."""
        problem = self.host_problem(host, port)
        if problem is not None:
            return problem
        literal = host_address(host)
        address = mapped(address)
        if literal is not None and literal != address:
            return f"{_shown(host)} connected to another address"
        return self._class_problem(address, port, own=own)

    def _host_entries(self, host: str, port: int) -> tuple[list[Entry], str | None]:
        address = host_address(host)
        if address is not None:
            matching = [e for e in self.entries if e.network is not None and address in e.network]
        else:
            try:
                name = normalize_name(host)
            except ValueError:
                return [], f"{_shown(host)} is no valid host name"
            matching = [e for e in self.entries if e.name == name]
        return [e for e in matching if e.allows_port(port)], None

    def _class_problem(self, address: IPAddress, port: int, *, own: bool) -> str | None:
        kind = special_class(address)
        if kind is None and not own:
            return None
        if any(e.allows_port(port) and e.names(address) for e in self.entries):
            return None
        article = "an" if kind and kind[0] in "aeiou" else "a"
        what = f"{article} {kind} address" if kind else "an address of this node"
        return f"{address} is {what}, which {self.key} does not name"


def _shown(host: str) -> str:
    """A host for a message: printable, bounded."""
    shown = host if host.isprintable() else repr(host)
    return shown[:100]
