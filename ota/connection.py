"""How the operator's tool reaches the broker: address, credentials, TLS, shared by every command.

`--broker` may be given several times (the brokers of a plant, `mqtt.hosts` of its agents):
they are tried in order at connect, the first that accepts the tool is used for the whole
command (with the same credentials and TLS options on each). Errors name the broker, the file
or the broker's reason code, never a secret: the password is read from the first line of a
file and only handed to paho.
"""

from __future__ import annotations

import argparse
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
class BrokerSettings:
    """Where the broker is and how to log in (the password stays in its file until connect)."""

    host: str = "127.0.0.1"
    port: int = 1883
    prefix: str = "voice"
    alternates: tuple[tuple[str, int], ...] = ()
    """Further brokers (host, port), tried in order when the one before cannot be used."""
    username: str | None = None
    password_file: Path | None = None
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
        help=f"host:port (default {DEFAULT_BROKER}); again for more brokers, tried in order",
    )
    group.add_argument("--prefix", default=None, help="topic prefix (default voice)")
    group.add_argument("--username", default=None)
    group.add_argument(
        "--password-file", type=Path, default=None, help="the password is its first line"
    )
    group.add_argument("--tls", action="store_true", help="TLS, verifying the broker's name")
    group.add_argument("--ca-file", type=Path, default=None, help="CA of the broker (implies TLS)")
    group.add_argument("--cert-file", type=Path, default=None, help="client certificate (TLS)")
    group.add_argument("--key-file", type=Path, default=None, help="its private key (TLS)")


def settings_from_args(
    args: argparse.Namespace, fallback: BrokerSettings | None = None
) -> BrokerSettings:
    """Settings from the options; `fallback` (e.g. a resumed rollout's) fills what is absent."""
    base = fallback or BrokerSettings()
    given = [args.broker] if isinstance(args.broker, str) else (args.broker or [])
    listed = [parse_address(text) for text in given] or list(base.servers)
    (host, port), *alternates = listed
    if (args.cert_file is None) != (args.key_file is None):
        raise ValueError("--cert-file and --key-file go together")
    for name in ("password_file", "ca_file", "cert_file", "key_file"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
    if args.password_file is not None and args.username is None:
        raise ValueError("--password-file needs --username")
    tls = bool(args.tls or args.ca_file or args.cert_file)
    return BrokerSettings(
        host=host,
        port=port,
        alternates=tuple(alternates),
        prefix=args.prefix or base.prefix,
        username=args.username,
        password_file=args.password_file,
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
    """A paho client (MQTT 5, or 3.1.1 with `clean_session`) with the settings' credentials and
    TLS (not yet connected)."""
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
    if settings.username is not None:
        password = read_password(settings.password_file) if settings.password_file else None
        client.username_pw_set(settings.username, password)
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
    for host, port in settings.servers:
        for protocol in (MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311):
            client = make(protocol)
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
