"""The egress policy alone (pure): its entry syntax, what it says is wrong with an entry, and its
decisions on a URL as written and on an address connected to, over generated spellings of
addresses, generated entries and generated URLs (hypothesis)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Final

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.core.catalog import Catalog
from agent.core.egress import (
    ANY_PORT,
    EgressPolicy,
    Entry,
    entry_problem,
    host_address,
    parse_entry,
    special_class,
)
from agent.core.messages import Delivery, Notify, SpeakReceived, SpeakRequest, Synthesize
from agent.core.reasons import Reason
from agent.core.scheduler import SpeakCore

EVERYWHERE: Final = EgressPolicy.parse(["0.0.0.0/0:*", "[::/0]:*"], "audio.media_hosts")
"""Every address allowed as written; no refused class named."""
BAD_NAME: Final = (
    "not a valid host name (labels of 1-63 letters, digits, _ and inner hyphens; 253 in all)"
)


def policy(*entries: str) -> EgressPolicy:
    return EgressPolicy.parse(entries, "audio.media_hosts")


# ---- spellings of an IPv4 address ----------------------------------------------------------


@st.composite
def ipv4_spellings(draw: st.DrawFn, address: int) -> str:
    """A spelling of an IPv4 address that the C library (inet_aton, getaddrinfo) reads as it:
    one to four parts, the last taking the remaining bytes, each in decimal, octal or hex."""
    count = draw(st.integers(1, 4))
    octets = address.to_bytes(4, "big")
    values = [*octets[: count - 1], int.from_bytes(octets[count - 1 :], "big")]
    parts = []
    for value in values:
        style = draw(st.sampled_from(["dec", "oct", "hex", "HEX"]))
        if style == "dec":
            parts.append(str(value))
        elif style == "oct":
            parts.append("0" + format(value, "o"))
        else:
            text = format(value, "x")
            parts.append(("0X" + text.upper()) if style == "HEX" else "0x" + text)
    return ".".join(parts)


loopback_ints = st.integers(int(ipaddress.IPv4Address("127.0.0.0")), 2**24 * 128 - 1)


@st.composite
def loopback_hosts(draw: st.DrawFn) -> tuple[str, ipaddress.IPv4Address]:
    """(a URL host spelling a loopback address, the address): IPv4 spellings, IPv4-mapped IPv6
    in its two forms, and IPv6 ::1."""
    value = draw(loopback_ints)
    address = ipaddress.IPv4Address(value)
    kind = draw(st.sampled_from(["v4", "mapped", "mapped-hex", "v6"]))
    if kind == "v4":
        return draw(ipv4_spellings(value)), address
    if kind == "mapped":
        return f"[::ffff:{address}]", address
    if kind == "mapped-hex":
        return f"[::ffff:{value >> 16:x}:{value & 0xFFFF:x}]", address
    return "[::1]", address


@given(loopback_hosts(), st.integers(1, 65535))
@example(("localhost", ipaddress.IPv4Address("127.0.0.1")), 80)
@example(("127.1", ipaddress.IPv4Address("127.0.0.1")), 80)
@example(("2130706433", ipaddress.IPv4Address("127.0.0.1")), 8123)
@example(("0x7f000001", ipaddress.IPv4Address("127.0.0.1")), 22)
@example(("[::ffff:127.0.0.1]", ipaddress.IPv4Address("127.0.0.1")), 22)
def test_loopback_in_any_spelling_is_refused_unless_named(
    spelled: tuple[str, ipaddress.IPv4Address], port: int
) -> None:
    host, address = spelled
    url = f"http://{host}:{port}/relay/0?turn=on"
    bare = host.strip("[]")
    if host != "localhost":  # a name: the address check at connect time catches it
        assert EVERYWHERE.url_problem(url) is not None
        system = str(socket.getaddrinfo(bare, port, flags=socket.AI_NUMERICHOST)[0][4][0])
        assert host_address(bare) == host_address(system)  # the system reads it alike
    connected = ipaddress.ip_address("::1") if bare == "::1" else address
    allowing = policy("localhost:*") if host == "localhost" else EVERYWHERE
    assert allowing.address_problem(bare, connected, port) is not None
    named = policy("127.0.0.0/8:*", "[::1]:*", "localhost:*")
    assert named.url_problem(url) is None
    assert named.address_problem(bare, connected, port) is None


addresses = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address),
)


@given(addresses, st.integers(1, 65535))
@example(ipaddress.ip_address("169.254.169.254"), 80)
@example(ipaddress.ip_address("fe80::1"), 80)
@example(ipaddress.ip_address("::ffff:169.254.1.1"), 80)
@example(ipaddress.ip_address("0.0.0.0"), 80)  # noqa: S104 - an address, not a binding
@example(ipaddress.ip_address("::"), 80)
@example(ipaddress.ip_address("255.255.255.255"), 80)
@example(ipaddress.ip_address("224.0.0.251"), 5353)
def test_a_refused_class_needs_an_entry_that_names_it(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    shown = str(address)
    host = shown
    kind = special_class(address)
    written = EVERYWHERE.address_problem(host, address, port)
    assert (written is None) == (kind is None)
    assert EVERYWHERE.address_problem(host, address, port, own=True) is not None
    entry = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
    named = policy(entry)
    assert named.address_problem(host, address, port) is None
    assert named.address_problem(host, address, port, own=True) is None
    assert named.address_problem(host, address, port % 65535 + 1) is not None  # another port


@pytest.mark.parametrize(
    ("entry", "address", "allowed"),
    [
        ("127.0.0.0/8", "127.0.0.1", True),
        ("127.0.0.1/32", "127.0.0.1", True),
        ("0.0.0.0/0", "127.0.0.1", False),
        ("0.0.0.0/1", "127.0.0.1", False),
        ("169.254.0.0/16", "169.254.169.254", True),
        ("169.254.0.0/15", "169.254.169.254", False),
        ("[fe80::/10]", "fe80::1", True),
        ("[fe80::/9]", "fe80::1", False),
        ("[::/0]", "::1", False),
        ("::1", "::1", True),
        ("[::ffff:127.0.0.1]", "127.0.0.1", True),
        ("127.0.0.1", "::ffff:127.0.0.1", True),
        ("[::ffff:0:0/96]", "::ffff:127.0.0.1", False),
    ],
)
def test_what_names_a_refused_class_explicitly(entry: str, address: str, allowed: bool) -> None:
    port = 80
    ip = ipaddress.ip_address(address)
    problem = policy(entry).address_problem(str(ipaddress.ip_address(address)), ip, port)
    assert (problem is None) is allowed, problem


def test_the_nodes_own_address_only_by_the_address_itself() -> None:
    own = ipaddress.ip_address("192.168.1.5")
    for broad in ("192.168.1.0/24", "192.168.0.0/16", "0.0.0.0/0"):
        problem = policy(f"{broad}:*").address_problem("192.168.1.5", own, 22, own=True)
        assert problem == (
            "192.168.1.5 is an address of this node, which audio.media_hosts does not name"
        )
    assert policy("192.168.1.5:22").address_problem("192.168.1.5", own, 22, own=True) is None
    lan = ipaddress.ip_address("192.168.1.10")  # another host of the same network: allowed
    assert policy("192.168.1.0/24:8123").address_problem("192.168.1.10", lan, 8123) is None


# ---- names -------------------------------------------------------------------------------


def test_a_name_entry_trusts_its_name_not_a_refused_address() -> None:
    ha = policy("homeassistant.local:8123")
    lan = ipaddress.ip_address("192.168.1.10")
    assert ha.url_problem("http://HomeAssistant.Local.:8123/local/bell.mp3") is None
    assert ha.address_problem("homeassistant.local", lan, 8123) is None
    unspecified = "0.0.0.0"  # noqa: S104 - an address connected to, not a binding
    for forbidden in ("127.0.0.1", "::1", "169.254.169.254", "::ffff:127.0.0.1", unspecified):
        address = ipaddress.ip_address(forbidden)
        assert ha.address_problem("homeassistant.local", address, 8123) is not None, forbidden
    assert ha.address_problem("homeassistant.local", lan, 8123, own=True) is not None
    assert ha.url_problem("http://homeassistant.local/x") is not None  # port 80: not listed
    assert ha.url_problem("http://192.168.1.10:8123/x") is not None  # the address: not listed
    assert ha.url_problem("http://evil.homeassistant.local:8123/x") is not None
    assert ha.url_problem("http://homeassistant.local.evil:8123/x") is not None


def test_an_international_name_matches_in_either_spelling() -> None:
    both = (policy("bücher.example"), policy("xn--bcher-kva.example"))
    for allowing in both:
        assert allowing.url_problem("https://BÜCHER.example/a.ogg") is None
        assert allowing.url_problem("https://xn--bcher-kva.example/a.ogg") is None


def test_an_address_as_written_is_checked_against_the_one_connected_to() -> None:
    lan = policy("192.168.1.10")
    other = ipaddress.ip_address("192.168.1.11")
    assert lan.address_problem("192.168.1.10", other, 80) is not None


# ---- URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://u:p@ha.local/x", "a URL with credentials (user:password@) is never fetched"),
        ("http://@ha.local/x", "a URL with credentials (user:password@) is never fetched"),
        ("ftp://ha.local/x", "an http or https URL only"),
        ("http:///x", "a URL without a host"),
        ("http://ha.local:99999/x", "not a valid URL"),
        ("http://ha.local:22/x", "ha.local port 22 is not allowed by audio.media_hosts"),
        ("http://other.local/x", "other.local port 80 is not allowed by audio.media_hosts"),
    ],
)
def test_refusals_of_a_url_as_written(url: str, problem: str) -> None:
    assert policy("ha.local").url_problem(url) == problem


def test_an_empty_policy_refuses_every_url_and_says_so() -> None:
    assert EgressPolicy().url_problem("https://ha.local/x") == (
        "audio.media_hosts is empty: no host is allowed"
    )
    ota = EgressPolicy.parse([], "ota.hosts")
    assert ota.url_problem("https://releases.example/r3/") == (
        "ota.hosts is empty: no host is allowed"
    )


@given(st.text(max_size=300))
@example("http://[::1/x")
@example("http://h:\U0001f600/")
@example("http://\ud800/")
@example("https://a.b:0/")
def test_any_text_gets_an_answer_and_a_secret_is_never_repeated(text: str) -> None:
    for candidate in (text, f"http://{text}", f"http://ha.local/{text}", f"http://u:{text}@x/"):
        problem = EVERYWHERE.url_problem(candidate)
        assert problem is None or isinstance(problem, str)
        if "@" in candidate.partition("//")[2].partition("/")[0]:
            assert problem is not None
    secret = "s3cr3t-" + text
    for url in (f"http://ha.local:8123/a?token={secret}", f"http://user:{secret}@ha.local/"):
        problem = policy("other.local").url_problem(url)
        assert problem is not None
        assert secret not in problem


# ---- entries ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("homeassistant.local", Entry("homeassistant.local", name="homeassistant.local")),
        ("HA.Local.:8123", Entry("HA.Local.:8123", name="ha.local", port=8123)),
        ("ha.local:*", Entry("ha.local:*", name="ha.local", port=ANY_PORT)),
        ("192.168.1.10", Entry("192.168.1.10", network=ipaddress.ip_network("192.168.1.10/32"))),
        (
            "192.168.1.0/24:8123",
            Entry("192.168.1.0/24:8123", network=ipaddress.ip_network("192.168.1.0/24"), port=8123),
        ),
        ("fd00::/8", Entry("fd00::/8", network=ipaddress.ip_network("fd00::/8"))),
        ("fd00::1:8123", Entry("fd00::1:8123", network=ipaddress.ip_network("fd00::1:8123/128"))),
        (
            "[fd00::/8]:8123",
            Entry("[fd00::/8]:8123", network=ipaddress.ip_network("fd00::/8"), port=8123),
        ),
        ("[::1]", Entry("[::1]", network=ipaddress.ip_network("::1/128"))),
        (
            "[::ffff:10.0.0.0/104]:*",
            Entry("[::ffff:10.0.0.0/104]:*", network=ipaddress.ip_network("10.0.0.0/8"), port=0),
        ),
    ],
)
def test_entries_parse(text: str, expected: Entry) -> None:
    assert parse_entry(text) == expected
    assert entry_problem(text) is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "expected a host name, IP address or network, optionally with :port"),
        (" ha.local", "expected a host name, IP address or network, optionally with :port"),
        ("http://ha.local:8123", "expected a host, address or network (with :port), not a URL"),
        ("user@ha.local", "expected a host, address or network (with :port), not a URL"),
        ("192.168.1.5/24", "host bits set: the network is 192.168.1.0/24"),
        ("127.1", "an IPv4 address in a short or numeric form: write it as 127.0.0.1"),
        ("2130706433", "an IPv4 address in a short or numeric form: write it as 127.0.0.1"),
        ("0x7f000001:80", "an IPv4 address in a short or numeric form: write it as 127.0.0.1"),
        ("ha.local:0", "expected a port from 1 to 65535, or * for any"),
        ("ha.local:65536", "expected a port from 1 to 65535, or * for any"),
        ("ha.local:http", "expected a port from 1 to 65535, or * for any"),
        ("ha.local:\u0663", "expected a port from 1 to 65535, or * for any"),
        ("[1.2.3.4]:80", "brackets are for an IPv6 address or network only"),
        ("[fd00::1", "expected [IPv6 address or network] or [...]:port"),
        ("[fd00::1]8123", "expected [IPv6 address or network] or [...]:port"),
        ("-ha.local", BAD_NAME),
        ("ha..local", BAD_NAME),
        ("a" * 64 + ".local", BAD_NAME),
        ("999.1.1.1/8", "not an IP address or network ('999.1.1.1/8' does not appear to be an "
         "IPv4 or IPv6 network)"),
        ("ha\u00a0local", BAD_NAME),
        ("ha.local/x", "not an IP address or network ('ha.local/x' does not appear to be an "
         "IPv4 or IPv6 network)"),
    ],
)  # fmt: skip
def test_what_is_wrong_with_an_entry(text: str, problem: str) -> None:
    assert entry_problem(text) == problem


networks = st.one_of(
    st.builds(
        lambda value, prefix: ipaddress.IPv4Network((value, prefix), strict=False),
        st.integers(0, 2**32 - 1),
        st.integers(0, 32),
    ),
    st.builds(
        lambda value, prefix: ipaddress.IPv6Network((value, prefix), strict=False),
        st.integers(0, 2**128 - 1),
        st.integers(0, 128),
    ),
)
ports = st.one_of(st.none(), st.just(ANY_PORT), st.integers(1, 65535))


@given(networks, ports, st.booleans())
def test_an_entry_written_as_documented_reads_back(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network, port: int | None, single: bool
) -> None:
    text = str(network.network_address) if single and network.num_addresses == 1 else str(network)
    port_text = "" if port is None else ":*" if port == ANY_PORT else f":{port}"
    if network.version == 6 and (port is not None or single):
        text = f"[{text}]"
    entry = parse_entry(text + port_text)
    mapped_v4 = network.version == 6 and network.subnet_of(ipaddress.IPv6Network("::ffff:0:0/96"))
    if not mapped_v4:
        assert entry.network == network
    assert entry.port == port
    assert entry.name is None


@given(st.text(max_size=80))
def test_any_text_as_an_entry_gets_an_answer(text: str) -> None:
    problem = entry_problem(text)
    assert problem is None or isinstance(problem, str)
    if problem is None:
        entry = parse_entry(text)
        assert (entry.name is None) != (entry.network is None)


def test_a_policy_of_bad_entries_is_refused() -> None:
    with pytest.raises(ValueError, match="host bits set"):
        EgressPolicy.parse(["ha.local", "10.0.0.1/8"], "ota.hosts")


# ---- on arrival, in the core ------------------------------------------------------------------


def arrival(hosts: tuple[str, ...], request: SpeakRequest) -> dict[str, object]:
    """The core's first answer to a request: `rejected` with its details, or `synthesize`."""
    catalog = Catalog(media_hosts=policy(*hosts))
    actions = SpeakCore(8, 50, catalog=catalog).handle(SpeakReceived(request, Delivery(1, 1)), 0)
    notes = [a for a in actions if isinstance(a, Notify)]
    if notes and notes[0].event == "rejected":
        return {"event": "rejected", **notes[0].details}
    assert any(isinstance(a, Synthesize) for a in actions), actions
    return {"event": "synthesize"}


@pytest.mark.parametrize("field", ["sound", "sound_after"])
@pytest.mark.parametrize(
    ("hosts", "url"),
    [
        ((), "http://homeassistant.local:8123/local/bell.mp3"),  # empty: URL sounds are off
        (("homeassistant.local:8123",), "http://homeassistant.local:22/"),
        (("homeassistant.local:8123",), "http://192.168.1.10:8123/x.wav"),
        (("homeassistant.local:8123",), "http://user:pw@homeassistant.local:8123/x.wav"),
        (("192.168.1.0/24",), "http://192.168.1.1:8080/relay/0?turn=on"),  # no such port
        (("0.0.0.0/0:*",), "http://127.1:8123/x.wav"),
        (("0.0.0.0/0:*",), "http://0x7f000001:22/"),
        (("0.0.0.0/0:*", "[::/0]:*"), "http://[::ffff:127.0.0.1]/"),
        (("0.0.0.0/0:*",), "http://169.254.169.254/latest/meta-data/"),
    ],
)
def test_a_url_the_policy_refuses_is_rejected_on_arrival(
    hosts: tuple[str, ...], url: str, field: str
) -> None:
    request = SpeakRequest("u1", "Hello.", **{field: url})  # type: ignore[arg-type]
    answer = arrival(hosts, request)
    print(answer)
    assert answer["event"] == "rejected"
    assert answer["reason"] == Reason.URL_NOT_ALLOWED
    assert answer["field"] == field
    assert "turn=on" not in str(answer["detail"])
    assert "pw" not in str(answer["detail"])


def test_a_url_the_policy_allows_goes_on_to_synthesis() -> None:
    request = SpeakRequest("u2", "Hi.", sound="http://homeassistant.local:8123/local/bell.mp3")
    assert arrival(("homeassistant.local:8123",), request) == {"event": "synthesize"}


@given(
    st.sampled_from(["http", "https", "HTTP"]),
    st.text(min_size=1, max_size=40),
    st.text(max_size=40),
)
def test_any_refused_url_gets_one_rejection_without_its_secrets(
    scheme: str, host: str, secret: str
) -> None:
    url = f"{scheme.lower()}://{host}/path?token={secret}"
    request = SpeakRequest("u3", "Hi.", sound=url)
    answer = arrival(("ha.local",), request)
    if answer["event"] == "rejected":
        assert answer["reason"] == Reason.URL_NOT_ALLOWED
        if secret:
            assert f"token={secret}" not in str(answer["detail"])
    else:  # only the one host it names
        assert policy("ha.local").url_problem(url) is None
