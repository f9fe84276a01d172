"""The Wyoming services on multicast DNS, with the real `zeroconf` package on this machine's own
interfaces (no mocks): a browser of its own (another `Zeroconf`, as Home Assistant's is) finds the
node's two services with their names, ports and addresses, and sees them removed by the goodbyes
of `stop`. Hostile node names still give valid instance labels, and a registration that cannot
happen is one warning line, never an exception.

Every wait is on an event, with a deadline generous for a busy 2-core machine (registration
itself takes about 1.7 s: zeroconf's probing)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from zeroconf import (
    BadTypeInNameException,
    InterfaceChoice,
    ServiceBrowser,
    ServiceStateChange,
    Zeroconf,
)
from zeroconf._utils.name import service_type_name  # zeroconf's own check (not re-exported)

from agent.link.wyoming.zeroconf import (
    LABEL_BYTES,
    SERVICE_TYPE,
    Advertised,
    ZeroconfAdvertiser,
    addresses_for,
    instance_label,
    instance_name,
    server_name,
)
from harness import Broker, free_port, wait_until
from harness.homeassistant import HomeAssistant, install
from harness.wait import TIMEOUT
from tests.conftest import StartAgent

DEADLINE = 30.0
"""Seconds a registration, a discovery or a removal may take on a busy machine."""
LOGGER = "agent.link.wyoming.zeroconf"

HOSTILE = [
    "k" * 300,
    "kitchen.local.lan",
    "_wyoming._tcp.local.",
    "🎤" * 40,
    "👩🏽‍🍳 kitchen 🔊",
    "a\x00b\x1fc\x7fd\u0085e\u202ef\u2028g\u2029h\u200bi",
    "\ud800 lone surrogate \udfff",
    "e\u0301" * 40,
    "x" * (LABEL_BYTES - len("voice-agent ") - 1) + "é",
    "a" * (LABEL_BYTES - len("voice-agent ") - 1) + "e\u0301\u0301",
    "",
    "   \t\n ",
    "\x00\x01\x02",
    "back\\slash (2) [x] «quoted»",
    "Ünïcödé 漢字 кухня",
]
"""Node names a config could hold: too long, with dots, emoji (multi-byte, joined), control,
format and separator characters, lone surrogates, combining marks cut at the limit, nothing."""


def _label_is_valid(label: str) -> None:
    """What DNS-SD and zeroconf ask of an instance label, with room for a rename's `-999`."""
    encoded = label.encode("utf-8")  # a lone surrogate would raise here
    assert 0 < len(encoded) <= LABEL_BYTES, label
    assert "." not in label, label
    assert not any(unicodedata.category(c)[0] == "C" for c in label), ascii(label)
    assert label == label.strip(), ascii(label)
    assert label == unicodedata.normalize("NFC", label), ascii(label)
    assert instance_label(label) == label  # idempotent
    assert service_type_name(f"{label}.{SERVICE_TYPE}") == SERVICE_TYPE
    assert service_type_name(f"{label}-999.{SERVICE_TYPE}") == SERVICE_TYPE


class Browser:
    """A real `ServiceBrowser` for `_wyoming._tcp.local.` on its own `Zeroconf`: which names it
    saw added and removed."""

    def __init__(self) -> None:
        self.zeroconf = Zeroconf(interfaces=InterfaceChoice.All)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.added: set[str] = set()
        self.removed: set[str] = set()
        self._browser = ServiceBrowser(self.zeroconf, SERVICE_TYPE, handlers=[self._on_change])

    def _on_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        with self._changed:
            if state_change is ServiceStateChange.Added:
                self.added.add(name)
            elif state_change is ServiceStateChange.Removed:
                self.removed.add(name)
            self._changed.notify_all()

    def wait_added(self, names: set[str]) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: names <= self.added, DEADLINE)
            assert ok, f"not found within {DEADLINE} s: {names - self.added}"

    def wait_removed(self, names: set[str]) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: names <= self.removed, DEADLINE)
            assert ok, f"not removed within {DEADLINE} s: {names - self.removed}"

    def resolve(self, name: str) -> tuple[int, list[str], str]:
        """The port, addresses and host name the network gives for one service."""
        info = self.zeroconf.get_service_info(SERVICE_TYPE, name, timeout=int(DEADLINE * 1000))
        assert info is not None, f"{name} did not resolve"
        assert info.port is not None
        assert info.server is not None
        return info.port, sorted(info.parsed_addresses()), info.server

    def close(self) -> None:
        self._browser.cancel()
        self.zeroconf.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    seen = Browser()
    try:
        yield seen
    finally:
        seen.close()


@pytest.fixture
def lan() -> list[str]:
    """This machine's non-loopback IPv4 addresses (what a `0.0.0.0` bind advertises)."""
    addresses = addresses_for("0.0.0.0")  # noqa: S104
    if not addresses:
        pytest.skip("this machine has no non-loopback IPv4 address to advertise")
    return addresses


def _unique(node: str = "") -> str:
    """A node id no other run of this test (another worker, another machine) advertises."""
    return f"test-{uuid.uuid4().hex[:10]} {node}".strip()


def _full(service: Advertised) -> str:
    return f"{service.name}.{SERVICE_TYPE}"


def _ours(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


# -- the names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("node", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_node_name_gives_valid_instance_names(node: str) -> None:
    tts, satellite = instance_name(node), instance_name(node, "satellite")
    _label_is_valid(tts)
    _label_is_valid(satellite)
    assert tts.startswith("voice-agent")
    assert satellite.endswith(" satellite")  # a long node id is cut, never the role
    assert tts != satellite
    _label_is_valid(instance_label(node))
    _label_is_valid(Advertised(node, 10200).name)


def test_instance_names_read_as_the_node_and_its_role() -> None:
    assert instance_name("kitchen") == "voice-agent kitchen"
    assert instance_name("kitchen", "satellite") == "voice-agent kitchen satellite"
    assert instance_name("pi.lan") == "voice-agent pi-lan"
    assert Advertised("voice-agent kitchen", 10200).name == "voice-agent kitchen"


def test_a_label_that_is_not_valid_is_what_zeroconf_refuses() -> None:
    """The checks above can fail: zeroconf itself refuses what `instance_label` removes."""
    for raw in ("k" * 64, "a\x01b"):
        with pytest.raises(BadTypeInNameException):
            service_type_name(f"{raw}.{SERVICE_TYPE}")
        _label_is_valid(instance_label(raw))


def test_the_server_name_is_derived_from_the_host_name() -> None:
    assert server_name("kitchen") == "kitchen-voice-agent.local."
    assert server_name("Pi-4.lan.example") == "pi-4-voice-agent.local."
    assert server_name("ünï_cödé") == "n-c-d-voice-agent.local."
    assert server_name("...") == "node-voice-agent.local."
    long = server_name("h" * 200).removesuffix(".local.")
    assert len(long) <= 63
    assert long.endswith("-voice-agent")
    assert server_name().endswith("-voice-agent.local.")


def test_a_port_outside_tcp_is_refused() -> None:
    for port in (0, -1, 65536):
        with pytest.raises(ValueError, match="not a TCP port"):
            Advertised("voice-agent kitchen", port)


# -- the addresses -----------------------------------------------------------------------------


def _bindable(address: str) -> bool:
    """Whether the address is one of this host's (the kernel lets a socket bind it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def _route_source() -> str | None:
    """The source address of this host's route to the mDNS group (as the Wyoming projects find
    their address), when there is one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("224.0.0.251", 5353))
        except OSError:
            return None
        return str(sock.getsockname()[0])


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1.2.3", "::1", "localhost", "::ffff:127.0.0.1", "0::1"]
)
def test_a_loopback_bind_advertises_nothing(host: str) -> None:
    assert addresses_for(host) == []


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("192.0.2.55", ["192.0.2.55"]),
        (" 10.1.2.3 ", ["10.1.2.3"]),
        ("fd00::99", ["fd00::99"]),
        ("::ffff:192.0.2.55", ["192.0.2.55"]),
        ("no-such-host.invalid", []),
    ],
)
def test_a_specific_bind_advertises_its_own_address(host: str, expected: list[str]) -> None:
    assert addresses_for(host) == expected


def test_a_wildcard_bind_advertises_every_reachable_address_of_its_family() -> None:
    v4, v6, both = addresses_for("0.0.0.0"), addresses_for("::"), addresses_for("")  # noqa: S104
    assert both == v4 + v6
    assert len(set(both)) == len(both)
    for text in both:
        address = ipaddress.ip_address(text)
        assert not address.is_loopback
        assert not address.is_unspecified
        assert _bindable(text), f"{text} is not an address of this host"
    assert all(ipaddress.ip_address(a).version == 4 for a in v4)
    assert all(ipaddress.ip_address(a).version == 6 for a in v6)
    assert not any(ipaddress.ip_address(a).is_link_local for a in v6)
    source = _route_source()
    if source is not None and not ipaddress.ip_address(source).is_loopback:
        assert source in v4


# -- on the network ----------------------------------------------------------------------------


def test_both_services_are_found_with_their_names_ports_and_addresses_then_removed(
    browser: Browser, lan: list[str]
) -> None:
    node = _unique("kitchen")
    tts = Advertised(instance_name(node), 10200)
    satellite = Advertised(instance_name(node, "satellite"), 10700)
    advertiser = ZeroconfAdvertiser([tts, satellite], lan, server="voice-agent-test.local.")
    began = time.monotonic()
    advertiser.start()
    try:
        assert time.monotonic() - began < 1.0, "start() waited for the registrations"
        assert advertiser.wait(DEADLINE), "the registrations did not settle"
        assert set(advertiser.registered) == {tts, satellite}

        names = {_full(tts), _full(satellite)}
        browser.wait_added(names)
        assert browser.resolve(_full(tts)) == (10200, sorted(lan), "voice-agent-test.local.")
        assert browser.resolve(_full(satellite)) == (10700, sorted(lan), "voice-agent-test.local.")
    finally:
        advertiser.stop()
    browser.wait_removed(names)
    assert advertiser.registered == ()


def test_hostile_node_names_are_advertised_under_their_labels(
    browser: Browser, lan: list[str]
) -> None:
    node = _unique("kitchen.local\x00\u202e🎤" + "🔊" * 30)
    services = [Advertised(instance_name(node), 10200), Advertised(instance_name(node, "sat"), 1)]
    advertiser = ZeroconfAdvertiser(services, lan)
    advertiser.start()
    try:
        assert advertiser.wait(DEADLINE)
        assert set(advertiser.registered) == set(services)
        browser.wait_added({_full(s) for s in services})
        for service in services:
            _label_is_valid(service.name)
            port, addresses, server = browser.resolve(_full(service))
            assert (port, addresses) == (service.port, sorted(lan))
            assert server == server_name()
    finally:
        advertiser.stop()
    browser.wait_removed({_full(s) for s in services})


def test_a_name_another_host_holds_is_renamed_and_both_are_found(
    browser: Browser, lan: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    name = instance_name(_unique("kitchen"))
    first = ZeroconfAdvertiser([Advertised(name, 10200)], lan)
    second = ZeroconfAdvertiser([Advertised(name, 10201)], lan)
    first.start()
    try:
        assert first.wait(DEADLINE)
        second.start()
        assert second.wait(DEADLINE)
        assert first.registered == (Advertised(name, 10200),)
        ((renamed, port),) = [(s.name, s.port) for s in second.registered]
        assert (renamed, port) == (f"{name}-2", 10201)
        browser.wait_added({f"{name}.{SERVICE_TYPE}", f"{name}-2.{SERVICE_TYPE}"})
        assert browser.resolve(f"{name}-2.{SERVICE_TYPE}")[0] == 10201
        assert any("is taken" in r.getMessage() for r in _ours(caplog, logging.INFO))
        assert not _ours(caplog, logging.WARNING)
    finally:
        second.stop()
        first.stop()


@pytest.mark.parametrize(
    ("addresses", "interfaces"),
    [
        (["192.0.2.2"], ["203.0.113.7"]),  # an interface address this host does not have
        (["not an address"], InterfaceChoice.All),
        (["192.0.2.2"], ["not an address"]),
    ],
    ids=["no-such-interface", "bad-address", "bad-interface"],
)
def test_a_registration_that_cannot_happen_is_one_warning_never_an_exception(
    addresses: list[str],
    interfaces: list[str] | InterfaceChoice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    if isinstance(interfaces, list) and _bindable(interfaces[0]):
        pytest.skip(f"{interfaces[0]} is an address of this machine")
    services = [Advertised("voice-agent kitchen", 10200), Advertised("voice-agent sat", 10700)]
    advertiser = ZeroconfAdvertiser(services, addresses, interfaces)
    advertiser.start()
    try:
        assert advertiser.wait(DEADLINE)
        assert advertiser.registered == ()
        (warning,) = _ours(caplog, logging.WARNING)
        assert "not advertised by zeroconf" in warning.getMessage()
        assert "\n" not in warning.getMessage()
    finally:
        advertiser.stop()
    advertiser.stop()  # twice is harmless


def test_nothing_to_advertise_is_one_info_line_and_no_sockets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    advertiser = ZeroconfAdvertiser(
        [Advertised("voice-agent kitchen", 10200)], addresses_for("::1")
    )
    advertiser.start()
    try:
        assert advertiser.wait(0)
        assert advertiser.registered == ()
        (line,) = _ours(caplog, logging.INFO)
        assert "loopback" in line.getMessage()
        assert not _ours(caplog, logging.WARNING)
        assert advertiser._zeroconf is None
    finally:
        advertiser.stop()


def test_a_stop_while_probing_returns_promptly_and_logs_no_warning(
    lan: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    services = [Advertised(instance_name(_unique()), 10200)]
    advertiser = ZeroconfAdvertiser(services, lan)
    advertiser.start()
    began = time.monotonic()
    advertiser.stop()
    assert time.monotonic() - began < 10.0
    assert advertiser.registered == ()
    assert not _ours(caplog, logging.WARNING)
    advertiser.start()  # started once: a second start does nothing
    assert advertiser._zeroconf is None


# -- Home Assistant ----------------------------------------------------------------------------


@pytest.mark.broker
@pytest.mark.clients
def test_home_assistant_discovers_the_advertised_server_as_a_wyoming_flow(
    start_agent: StartAgent, broker: Broker, tmp_path: Path, lan: list[str]
) -> None:
    """Home Assistant 2025.4.4 with its zeroconf integration (not in the harness's config: added
    to configuration.yaml here) finds the agent's real Wyoming server by the agent's own
    advertisement (`wyoming.zeroconf`) alone, its Wyoming config flow connects to the advertised
    address and port, and the flow can be confirmed into an entry."""
    allow = [f"{address}/32" for address in lan]
    wyoming = {
        "enabled": True,
        "host": "0.0.0.0",  # noqa: S104 - advertised on the LAN
        "port": free_port(),
        "satellite_port": free_port(),
        "allow": allow,
        "zeroconf": True,
    }
    agent = start_agent(sections={"wyoming": wyoming})
    name = instance_name(agent.topics.node_id)
    ha = HomeAssistant(install(), tmp_path / "homeassistant", broker)
    ha.write_config()
    with (ha.config_dir / "configuration.yaml").open("a", encoding="utf-8") as config:
        config.write("zeroconf:\n")
    try:
        ha.start()

        def discovered(instance: str) -> list[dict[str, Any]]:
            (flows,) = ha.websocket({"type": "config_entries/flow/progress"})
            return [
                f
                for f in flows
                if f["handler"] == "wyoming"
                and f["context"].get("source") == "zeroconf"
                and str(f["context"].get("unique_id")).startswith(f"{instance}.{SERVICE_TYPE}")
            ]

        satellite = instance_name(agent.topics.node_id, "satellite")
        for instance in (name, satellite):
            wait_until(lambda: bool(discovered(instance)), TIMEOUT, f"a zeroconf flow: {instance}")  # noqa: B023
        (announce,) = discovered(satellite)
        assert announce["context"]["title_placeholders"] == {"name": name}, announce
        (flow,) = discovered(name)
        assert flow["step_id"] == "zeroconf_confirm", flow
        assert flow["context"]["title_placeholders"] == {"name": "voice-agent"}, flow
        made = ha.api("POST", f"/api/config/config_entries/flow/{flow['flow_id']}", {})
        assert made["type"] == "create_entry", made
        assert made["title"] == "voice-agent", made
        (entry,) = [
            e for e in ha.api("GET", "/api/config/config_entries/entry") if e["domain"] == "wyoming"
        ]
        assert entry["source"] == "zeroconf", entry
    finally:
        ha.stop()
