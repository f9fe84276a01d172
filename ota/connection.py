"""How the operator's tool reaches the broker: address, credentials, TLS, shared by every command.

`--broker` may be given several times (the brokers of a plant, `mqtt.hosts` of its agents):
they are tried in order at connect, the first that accepts the tool is used for the whole
command (with the same TLS options on each). Each broker gets its own credentials only, and a
password goes only over TLS or to a broker on this machine unless the operator says otherwise:
`--username` and `--password-file` are those of a single `--broker`; with several, each names its
own (`--broker HOST:PORT,user=NAME,password-file=PATH[,plaintext-password]`), so that a broker
of the list never receives another's password. Errors name the broker, the file or the broker's
reason code, never a secret: the password is read from the first line of a file and only handed
to paho.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

DEFAULT_BROKER: Final = "127.0.0.1:1883"
CONNECT_TIMEOUT: Final = 15.0
"""Seconds to wait for the broker's CONNACK before giving up."""
KEEPALIVE: Final = 30
"""MQTT keepalive of the tool's connection (seconds)."""


class BrokerError(Exception):
    """The broker could not be reached or refused the tool; the message holds no secret."""


@dataclass(frozen=True)
class Login:
    """The credentials of one broker (the password stays in its file until connect)."""

    username: str
    password_file: Path | None = None
    plaintext: bool = False
    """Its password may go without TLS."""


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to log in (the password stays in its file until connect)."""

    host: str = "127.0.0.1"
    port: int = 1883
    prefix: str = "voice"
    alternates: tuple[tuple[str, int], ...] = ()
    """Further brokers (host, port), tried in order when the one before cannot be used."""
    logins: tuple[Login | None, ...] = ()
    """Each broker's credentials, in the order of `servers` (absent: none)."""
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def servers(self) -> tuple[tuple[str, int], ...]:
        """Every broker, in the order they are tried."""
        return ((self.host, self.port), *self.alternates)

    @property
    def address(self) -> str:
        """host:port (each, with alternates), for messages."""
        return " or ".join(format_address(host, port) for host, port in self.servers)

    def login(self, index: int) -> Login | None:
        """The credentials of the `index`-th broker of `servers`."""
        return self.logins[index] if index < len(self.logins) else None


def on_this_machine(host: str) -> bool:
    """Whether a broker's host is this machine (a loopback address or name)."""
    if host.lower() in {"localhost", "localhost.localdomain", "ip6-localhost"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def format_address(host: str, port: int) -> str:
    """host:port, `[v6]:port` for an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> tuple[str, int]:
    """`host`, `host:port` or `[v6]:port`; port 1883 (8883 is not guessed) when absent."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"{text!r}: expected host:port")
    try:
        port = int(port_text) if port_text else 1883
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"{text!r}: the port must be 1-65535")
    return host, port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The broker options every MQTT command takes."""
    group = parser.add_argument_group("broker")
    group.add_argument(
        "--broker",
        action="append",
        default=None,
        help=f"host:port (default {DEFAULT_BROKER}); again for more brokers, tried in order; "
        "with credentials of its own: host:port,user=NAME,password-file=PATH (and "
        ",plaintext-password to send it without TLS)",
    )
    group.add_argument("--prefix", default=None, help="topic prefix (default voice)")
    group.add_argument("--username", default=None, help="the user of a single --broker")
    group.add_argument(
        "--password-file",
        type=Path,
        default=None,
        help="the password of a single --broker: its first line",
    )
    group.add_argument(
        "--allow-plaintext-password",
        action="store_true",
        help="send the password of a single --broker without TLS",
    )
    group.add_argument("--tls", action="store_true", help="TLS, verifying the broker's name")
    group.add_argument("--ca-file", type=Path, default=None, help="CA of the broker (implies TLS)")
    group.add_argument("--cert-file", type=Path, default=None, help="client certificate (TLS)")
    group.add_argument("--key-file", type=Path, default=None, help="its private key (TLS)")


def parse_broker(text: str) -> tuple[str, int, Login | None]:
    """A `--broker`: `host:port`, and after commas its own `user=`, `password-file=` and
    `plaintext-password`."""
    address, *options = text.split(",")
    host, port = parse_address(address)
    named: dict[str, str] = {}
    for option in options:
        key, _, value = option.strip().partition("=")
        if key not in {"user", "password-file", "plaintext-password"} or key in named:
            raise ValueError(f"--broker {address}: unknown or repeated option {key!r}")
        named[key] = value
    if not named:
        return host, port, None
    if "user" not in named or not named["user"]:
        raise ValueError(f"--broker {address}: password-file needs user=")
    password = Path(named["password-file"]) if named.get("password-file") else None
    return host, port, Login(named["user"], password, "plaintext-password" in named)


def settings_from_args(
    args: argparse.Namespace, fallback: BrokerSettings | None = None
) -> BrokerSettings:
    """Settings from the options; `fallback` (e.g. a resumed rollout's) fills what is absent."""
    base = fallback or BrokerSettings()
    given = [args.broker] if isinstance(args.broker, str) else (args.broker or [])
    parsed = [parse_broker(text) for text in given]
    listed = [(host, port) for host, port, _ in parsed] or list(base.servers)
    logins = [login for _, _, login in parsed] or list(base.logins)
    (host, port), *alternates = listed
    if (args.cert_file is None) != (args.key_file is None):
        raise ValueError("--cert-file and --key-file go together")
    if args.password_file is not None and args.username is None:
        raise ValueError("--password-file needs --username")
    if args.username is not None:
        if len(listed) > 1:
            raise ValueError(
                "--username and --password-file are the credentials of a single --broker: give "
                "each of several its own (--broker HOST:PORT,user=NAME,password-file=PATH)"
            )
        logins = [Login(args.username, args.password_file, args.allow_plaintext_password)]
    paths = [
        (f"--{n.replace('_', '-')}", getattr(args, n)) for n in ("ca_file", "cert_file", "key_file")
    ]
    paths += [("--password-file", login.password_file) for login in logins if login is not None]
    for option, path in paths:
        if path is not None and not path.is_file():
            raise ValueError(f"{option} {path}: no such file")
    tls = bool(args.tls or args.ca_file or args.cert_file)
    for (server_host, server_port), login in zip(listed, logins, strict=False):
        if login is None or login.password_file is None or tls or login.plaintext:
            continue
        if not on_this_machine(server_host):
            raise ValueError(
                f"the password for {format_address(server_host, server_port)} would go in "
                "clear: add --tls (or --ca-file), or allow it (--allow-plaintext-password, or "
                ",plaintext-password in its --broker)"
            )
    return BrokerSettings(
        host=host,
        port=port,
        alternates=tuple(alternates),
        prefix=args.prefix or base.prefix,
        logins=tuple(logins),
        tls=tls,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
    )


def read_password(path: Path) -> str:
    """The first line of the password file (without its line end)."""
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise BrokerError(f"cannot read the password file {path}: {reason}") from None


def _no_delay(_client: mqtt.Client, _userdata: Any, sock: Any) -> None:
    """Small packets (offers, acks) go out at once, not after the peer's delayed ACK."""
    if isinstance(sock, socket.socket) and sock.family in {socket.AF_INET, socket.AF_INET6}:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def new_client(
    settings: BrokerSettings,
    client_id: str,
    protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv5,
    *,
    clean_session: bool = True,
) -> mqtt.Client:
    """A paho client (MQTT 5, or 3.1.1 with `clean_session`) with the settings' TLS (not yet
    connected; `connect` gives it the credentials of the broker it tries)."""
    if protocol == MQTTProtocolVersion.MQTTv5:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    else:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=clean_session,
        )
    client.on_socket_open = _no_delay
    if settings.tls:
        try:
            client.tls_set(
                ca_certs=str(settings.ca_file) if settings.ca_file else None,
                certfile=str(settings.cert_file) if settings.cert_file else None,
                keyfile=str(settings.key_file) if settings.key_file else None,
            )
        except (OSError, ssl.SSLError) as err:
            raise BrokerError(f"TLS files could not be loaded: {_ssl_reason(err)}") from None
    client.reconnect_delay_set(1, 10)
    return client


def _ssl_reason(err: BaseException) -> str:
    if isinstance(err, ssl.SSLError):
        return str(err.reason or err.__class__.__name__)
    if isinstance(err, OSError):
        return str(err.strerror or err.__class__.__name__)
    return err.__class__.__name__


ClientMaker = Callable[[MQTTProtocolVersion], mqtt.Client]
"""Makes the tool's client for a protocol version (paho fixes the version per client)."""


def connect(
    settings: BrokerSettings,
    make: ClientMaker,
    *,
    clean_start: bool = True,
    session_expiry: int = 0,
    timeout: float = CONNECT_TIMEOUT,
) -> tuple[mqtt.Client, bool]:
    """Connect to the first of the settings' brokers that accepts the tool (in order), start
    paho's network thread and wait for the CONNACK: the connected client, and whether the broker
    still had a session for this client id. MQTT 5 first; a broker that closes the connection
    before any CONNACK or refuses the protocol version (RabbitMQ 3.10 speaks 3.1.1 only) is
    tried again at once with MQTT 3.1.1. Raises BrokerError with every broker's reason when
    none accepts it."""
    reasons = []
    for index, (host, port) in enumerate(settings.servers):
        login = settings.login(index)
        password = None
        if login is not None and login.password_file is not None:
            password = read_password(login.password_file)
        for protocol in (MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311):
            client = make(protocol)
            if login is not None:  # this broker's own, and no other's
                client.username_pw_set(login.username, password)
            try:
                session = _connect_one(
                    client,
                    settings,
                    host,
                    port,
                    clean_start=clean_start,
                    session_expiry=session_expiry,
                    timeout=timeout,
                )
            except _NotV5Error as err:
                reasons.append(str(err))
                continue  # the same broker in MQTT 3.1.1
            except BrokerError as err:
                reasons.append(str(err))
                break  # the next broker
            return client, session
    raise BrokerError("; ".join(reasons))


class _NotV5Error(BrokerError):
    """An MQTT 5 CONNECT closed before any CONNACK, or refused for its protocol version."""


_UNSUPPORTED_VERSION: Final = (1, 132)
"""CONNACK codes for an unacceptable protocol version (3.1.1's 1, MQTT 5's 0x84)."""


def _connect_one(
    client: mqtt.Client,
    settings: BrokerSettings,
    host: str,
    port: int,
    *,
    clean_start: bool,
    session_expiry: int,
    timeout: float,
) -> bool:
    address = format_address(host, port)
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def on_connect(
        _client: mqtt.Client, _userdata: Any, flags: Any, reason: Any, _props: Any
    ) -> None:
        outcome.setdefault("reason", reason)
        outcome.setdefault("session", bool(getattr(flags, "session_present", False)))
        done.set()

    def on_disconnect(*_args: Any) -> None:
        outcome.setdefault("closed", True)
        done.set()

    previous, previous_disconnect = client.on_connect, client.on_disconnect
    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    v5 = client.protocol == MQTTProtocolVersion.MQTTv5
    try:
        if v5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = session_expiry
            client.connect(
                host, port, keepalive=KEEPALIVE, clean_start=clean_start, properties=properties
            )
        else:  # clean_session was set when the client was made
            client.connect(host, port, keepalive=KEEPALIVE)
    except ssl.SSLError as err:
        _restore(client, previous, previous_disconnect)
        raise BrokerError(f"TLS with {address} failed: {_ssl_reason(err)}") from None
    except OSError as err:
        _restore(client, previous, previous_disconnect)
        why = err.strerror or err.__class__.__name__
        raise BrokerError(f"cannot reach the broker at {address}: {why}") from None
    client.loop_start()
    if not done.wait(timeout):
        client.loop_stop()
        client.disconnect()
        _restore(client, previous, previous_disconnect)
        raise BrokerError(f"no answer (CONNACK) from {address} within {timeout:.0f} s")
    client.on_disconnect = previous_disconnect
    answer = outcome.get("reason")
    if answer is None or getattr(answer, "is_failure", False):
        client.loop_stop()
        client.disconnect()
        client.on_connect = previous
        if answer is None:
            hint = "" if settings.tls else " (does it expect TLS?)"
            error = f"the broker at {address} closed the connection{hint}"
            raise (_NotV5Error if v5 else BrokerError)(error)
        refusal = f"the broker at {address} refused the connection: {answer}"
        raise (_NotV5Error if v5 and answer.value in _UNSUPPORTED_VERSION else BrokerError)(refusal)
    client.on_connect = previous
    return bool(outcome["session"])


def _restore(client: mqtt.Client, on_connect: Any, on_disconnect: Any) -> None:
    client.on_connect, client.on_disconnect = on_connect, on_disconnect
