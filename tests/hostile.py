"""What someone with publish rights on the broker sends the agent, as hypothesis strategies.

The attacker of the threat model (docs/security.md: "anyone who may publish on the node's
topics") controls every byte of every payload on every topic the agent subscribes to, and the
last segment of a playBytes topic. So the strategies make JSON *text*, not Python values:
numbers of any size (thousands of digits, past Python's 4,300-digit conversion limit), `NaN`,
`Infinity`, `1e400`, `-0`; strings with lone surrogate escapes, control, bidirectional and
invisible characters, over-long; any JSON type at any field; nesting of any depth (thousands of
levels); a key given twice; and the bytes around them: empty payloads, a byte-order mark, invalid
UTF-8, truncation, random bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as seed_hypothesis
from hypothesis import strategies as st

from agent.protocol.payloads import SPEAK_FIELDS

HOSTILE_CHARACTERS = (
    "\x00\x01\x07\x08\t\n\r\x1b\x7f\x85\x9b\xa0\xad\u200b\u200e\u2028\u2029\u202e\u2066\ufeff"
    "\ufffd\U0001f525"
)
"""Controls (C0, C1, ESC for ANSI sequences, NEL), bidirectional overrides and isolates,
zero-width and soft hyphen, separators, BOM, the replacement character, an astral character."""

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)

hostile_text = st.one_of(
    st.text(max_size=24),
    st.text(st.sampled_from(HOSTILE_CHARACTERS) | st.characters(), max_size=24),
    st.text(SURROGATES | st.sampled_from("ab"), min_size=1, max_size=4),
    st.sampled_from(
        [
            "",
            " ",
            "a\nforged log line",
            "\x1b[31mred\x1b[0m",
            "\u202eevil",
            "<speak>hi</speak>",
            "[[ phonemes ]]",
            "%s%n",
            "../../etc/passwd",
            "http://127.0.0.1:22/",
            "default",
            "critical",
            "1.5",
            "٣",
        ]
    ),
    st.integers(129, 3000).map(lambda n: "i" * n),  # over every length limit
)
"""Text an attacker would try in any string: ids, names, keys, values."""


def string_literal(text: str, *, ascii_only: bool) -> str:
    """`text` as a JSON string literal: with `ascii_only`, lone surrogates travel as `\\ud800`
    escapes; without, as raw code points (invalid UTF-8 once encoded with `surrogatepass`)."""
    return json.dumps(text, ensure_ascii=ascii_only)


string_literals = st.builds(string_literal, hostile_text, ascii_only=st.booleans())

number_literals = st.one_of(
    st.integers().map(str),
    st.integers(1, 6000).map(lambda n: "9" * n),  # any number of digits
    st.integers(1, 6000).map(lambda n: "-1" + "0" * n),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-(10**6), 10**6), st.integers(-400, 400)),
    st.sampled_from(
        [
            "NaN",
            "Infinity",
            "-Infinity",
            "1e400",
            "-1e400",
            "1e-400",
            "-0",
            "-0.0",
            "0",
            "1",
            "0.5",
            "2",
            "4.9e-324",
            "1.7976931348623157e308",
            "253402300800",
            "9" * 400,
        ]
    ),
)
"""Numbers as JSON (and Python's JSON) can write them: any size, any exponent, NaN, infinities."""

scalar_literals = number_literals | string_literals | st.sampled_from(["true", "false", "null"])


def array_text(items: Sequence[str]) -> str:
    return "[" + ",".join(items) + "]"


def object_text(pairs: Sequence[tuple[str, str]]) -> str:
    """A JSON object from (key, value literal) pairs, in order; a key may come twice."""
    return "{" + ",".join(f"{string_literal(k, ascii_only=True)}:{v}" for k, v in pairs) + "}"


def nested(depth: int, leaf: str = "1", *, objects: bool = False) -> str:
    """`leaf` inside `depth` arrays (or objects)."""
    if objects:
        return '{"a":' * depth + leaf + "}" * depth
    return "[" * depth + leaf + "]" * depth


json_literals = st.recursive(
    scalar_literals,
    lambda children: (
        st.lists(children, max_size=4).map(array_text)
        | st.lists(st.tuples(hostile_text, children), max_size=4).map(object_text)
    ),
    max_leaves=10,
) | st.builds(nested, st.integers(1, 5000), st.just("1"), objects=st.booleans())
"""Any JSON value as text, at any depth (thousands of levels too)."""

SPEAK_KEYS = ("id", "text", "ssml", *SPEAK_FIELDS)
"""Every field a speak payload may carry."""
COMMAND_KEYS = ("clear", "current", "id", "volume")
"""Every field of the stop, ack and volume commands."""
HERMES_KEYS = ("text", "siteId", "id", "sessionId", "lang", "volume")
"""Every field of Hermes say and setVolume, toggle and getVoices."""
OTA_KEYS = ("id", "manifest", "base_url", "cancel", "rollback", "revocation", "manifest_url")


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each drawn in proportion to its weight."""
    return st.sampled_from([s for weight, s in choices for _ in range(weight)]).flatmap(
        lambda chosen: chosen
    )


def fields(keys: Sequence[str], *, site: str | None = None) -> st.SearchStrategy[str]:
    """A JSON object of these keys (mostly) and others, each value any JSON (numbers of any
    size half of the time), often beside good ones so that the hostile one is what the parser
    meets; `site` puts a Hermes siteId first."""
    good = [("text", '"Hello."'), ("id", '"good-id"')]
    key = weighted((4, st.sampled_from(keys)), (1, hostile_text))
    pair = st.tuples(key, weighted((1, number_literals), (1, json_literals)))
    lead = [("siteId", string_literal(site, ascii_only=True))] if site else []
    return st.builds(
        lambda chosen, extra: object_text(lead + chosen + extra),
        st.lists(pair, max_size=4),
        st.lists(st.sampled_from(good), max_size=2),
    )


def payloads(objects: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Payload bytes around JSON texts: as they are, with a BOM or leading space, truncated,
    with a byte flipped to invalid UTF-8, raw code points (surrogates as invalid UTF-8), empty,
    plain hostile text, random bytes."""
    encoded = objects.map(lambda t: t.encode("utf-8", "surrogatepass"))
    return weighted((8, encoded), (1, _mangled(encoded)), (1, _raw))


def _mangled(encoded: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        encoded.map(lambda b: "\ufeff".encode() + b),
        encoded.map(lambda b: b" \n\t" + b),
        st.builds(lambda b, cut: b[: cut % (len(b) + 1)], encoded, st.integers(0, 10**6)),
        st.builds(
            lambda b, spot, byte: b[:spot] + bytes([byte]) + b[spot + 1 :],
            encoded,
            st.integers(0, 200),
            st.sampled_from([0x80, 0xC0, 0xED, 0xF5, 0xFF, 0x00]),
        ),
    )


_raw = st.one_of(
    st.just(b""),
    hostile_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
)


speak_payloads = payloads(fields(SPEAK_KEYS))
command_payloads = payloads(fields(COMMAND_KEYS)) | number_literals.map(str.encode)
hermes_payloads = payloads(fields(HERMES_KEYS, site="default") | fields(HERMES_KEYS))
ota_payloads = payloads(fields(OTA_KEYS))
topic_segments = st.text(
    st.characters(exclude_characters="/+#", exclude_categories=["Cc", "Cs", "Cn"]), max_size=40
)
"""The last segment of a playBytes topic: what a broker lets through in a topic name (MQTT
forbids wildcards in it; Mosquitto refuses NUL, controls, surrogates and non-characters and
drops the client that sent them, before the agent sees anything)."""


# ---- planted files ---------------------------------------------------------------------------
# The local user of the threat model (docs/security.md: "a local user who can write beside the
# storage and cache directories", and the Disk) replaces any file of the node with something
# else: a link out of the directory, a FIFO (whose open blocks), a directory, a device, a huge
# sparse file, a truncated or garbage one. `NODE_FILES` names every file of the node and who
# reads it; `plant` puts one kind of hostile file in its place.

PLANTED_KINDS: tuple[str, ...] = (
    "link_outside",
    "link_to_fifo",
    "fifo",
    "directory",
    "device",
    "huge",
    "truncated",
    "garbage",
)
"""Every kind of planted file: a symbolic link to a file outside the node's directories (to be
left unchanged), a link to a FIFO outside (an open that follows it blocks), a FIFO, a directory
(with a file inside), a device (a link to /dev/zero: endless bytes), a sparse file of
`HUGE_BYTES`, the file cut to half its length, random bytes of its length."""
NOT_REGULAR: frozenset[str] = frozenset(PLANTED_KINDS) - {"truncated", "garbage"}
"""The kinds that are no regular file of a sane size (refused before a byte is read)."""
HUGE_BYTES = 1 << 36
"""A planted huge file (sparse: it takes no disk): 64 GiB, past every bound the node reads
with (a read of it whole would take the node's memory)."""
PRECIOUS = b"someone else's file, not the node's\n"
"""The content of the file outside that links point to (it must stay so)."""


@dataclass(frozen=True, slots=True)
class NodeFile:
    """One file of the node: where it is, what it is, who reads and writes it."""

    where: str
    """The directory it is under: `storage`, `cache` or `ota` (the node's update directory)."""
    pattern: str
    """Its path there, a glob (`{node}` is the node id)."""
    what: str
    reader: str
    """The module of `agent/` that reads (and writes) it."""
    seeded: bool = True
    """Whether a node that ran once (the matrix's seed) has it; one that is not there is
    planted all the same (the node must meet it at its next start)."""
    said: str = "state"
    """Where the node says that it found one planted: `state` (its state's `storage`),
    `events` (the updater's events: `unsafe_file`, `damaged`, `state_damaged`), `log` (a
    warning or error in the log), or nowhere (""): a file the node only replaces, never reads."""


_JOURNAL = "storage.journal (SQLite)"
_STORE = "updates.update_store"
_SESSIONS = "speech.sessions"
NODE_FILES: tuple[NodeFile, ...] = (
    NodeFile("storage", "journal-{node}.sqlite3", "the journal", _JOURNAL),
    NodeFile("storage", "journal-{node}.sqlite3-wal", "the journal's WAL", _JOURNAL, False),
    NodeFile("storage", "journal-{node}.sqlite3-shm", "its shared memory", _JOURNAL, False),
    NodeFile("storage", "journal-{node}.sqlite3-journal", "a rollback journal", _JOURNAL, False),
    NodeFile("storage", "steps-{node}", "the step marker", "storage.step_marker"),
    NodeFile("storage", "alarms-{node}.sqlite3", "the sounder's journal", _JOURNAL, said="log"),
    NodeFile("storage", "alarms-{node}.sqlite3-wal", "its WAL", _JOURNAL, False, "log"),
    NodeFile("ota", "state.json", "the update state", _STORE, said="events"),
    NodeFile("ota", "state.json.damaged", "a state set aside", _STORE, False, said=""),
    NodeFile("ota", "slots/a/tiny.onnx", "an update slot's model", _STORE, said="events"),
    NodeFile(
        "ota", "slots/a/tiny.onnx.json", "an update slot's voice config", _STORE, said="events"
    ),
    NodeFile("ota", "staging/" + "0" * 64, "a staged download", "updates.clean_up", said="events"),
    NodeFile(
        "ota",
        "staging/" + "1" * 64 + ".part",
        "a partial download",
        "updates.downloads",
        said="events",
    ),
    NodeFile("cache", "phrases/*/*.pcm", "a phrase cache entry", "speech.phrase_cache"),
    NodeFile("cache", "sounder/index.json", "the sounder's kit index", "sounder.kit", said="log"),
    NodeFile("cache", "sounder/*.pcm", "a sound of the sounder's kit", "sounder.kit", said="log"),
    NodeFile("cache", "models/digest-*", "a model's remembered digest", _SESSIONS),
    NodeFile("cache", "models/*.onnx", "the optimized model", _SESSIONS),
    NodeFile("cache", "models/*.onnx.data", "the optimized model's weights", _SESSIONS),
    NodeFile("cache", "models/*.onnx.seal", "the optimized model's seal", _SESSIONS),
    NodeFile("cache", "models/*.split*.json", "the split decoder's record", "speech.decoder_build"),
)
"""Every file the node reads or writes in its directories, as the matrix of
`tests/test_planted_files.py` meets them. Not here: the Sparkplug bdSeq file and the INT8 tier's
files (their own tests, with their edges)."""


def plant(path: Path, kind: str, outside: Path, seed: int = 0) -> None:
    """Put a planted file of `kind` (one of PLANTED_KINDS) where `path` is, replacing what is
    there. Links point into `outside` (see `outside_files`)."""
    rest = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link_outside":
        path.symlink_to(outside / "precious")
    elif kind == "link_to_fifo":
        path.symlink_to(outside / "fifo")
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_bytes(PRECIOUS)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        with path.open("wb") as out:
            out.truncate(HUGE_BYTES)
    elif kind == "truncated":
        path.write_bytes(rest[: len(rest) // 2])
    elif kind == "garbage":
        path.write_bytes(random.Random(seed).randbytes(max(len(rest), 4096)))
    else:
        raise ValueError(f"no planted kind {kind!r}")


def outside_files(outside: Path) -> None:
    """The files outside the node's directories that planted links point to: a regular file
    (`precious`) and a FIFO (`fifo`)."""
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "precious").write_bytes(PRECIOUS)
    if not (outside / "fifo").exists():
        os.mkfifo(outside / "fifo", 0o600)


def tree(root: Path, leave_out: Sequence[Path] = ()) -> dict[str, tuple[str, int, str]]:
    """What is under `root` (links not followed), but for `leave_out`: each path with its kind,
    its mode and, for a regular file, its sha256; a link with its target. Two snapshots differ
    when anything there was written, replaced, removed or made."""
    seen: dict[str, tuple[str, int, str]] = {}
    skipped = {str(p) for p in leave_out}
    for folder, directories, files in os.walk(root):  # links to directories not followed
        directories[:] = [d for d in directories if os.path.join(folder, d) not in skipped]
        for name in sorted(directories + files):
            path = os.path.join(folder, name)
            if path in skipped:
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                seen[path] = ("link", info.st_mode, os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                seen[path] = ("file", info.st_mode, digest)
            else:
                seen[path] = ("other", info.st_mode, "")
    return seen


# ---- untrusted text for every splitter (issue 33.4) ----------------------------------------

PATHOLOGICAL_CHARS = 120_000
"""Characters of each pathological text: past the 100,000 of the issue's Wyoming attack."""
PUNCTUATION = ".!?;:,\u3002\uff01\uff1f\u3001\uff0c\"')]\u201d\u00bb([<>&#-\u2014\u2026"
"""Every mark a splitter may look at (sentence and clause ends, closers, brackets, markup)."""
WHITESPACE = " \t\n\r\x0b\x0c\x85\xa0\u2028\u3000"
COMBINING = "\u0301\u0308\u0323\u20dd\u0489"
"""Combining marks (acute, diaeresis, dot below, enclosing circle, cyrillic millions)."""


def pathological_texts(size: int = PATHOLOGICAL_CHARS) -> dict[str, str]:
    """Texts that make a backtracking splitter quadratic (or worse), by name: a run of each
    punctuation mark and of each kind of white space (with and without a letter after), a
    letter with thousands of combining marks, alternations of marks with spaces, letters and
    closers, and the issue's own cases ("." * 30,000 then "x"; "." * 16,000 then "x ")."""
    texts: dict[str, str] = {
        "issue: 30,000 dots then x": "." * 30_000 + "x",
        "issue: 16,000 dots then x and a space": "." * 16_000 + "x ",
    }
    for mark in PUNCTUATION:  # a run that something else ends: what makes a regex backtrack
        texts[f"run of {mark!a} then x"] = mark * size + "x"
    for space in WHITESPACE:
        texts[f"run of {space!a} then x"] = space * size + "x"
    for mark in COMBINING:
        texts[f"a with {mark!a} x {size}"] = "a" + mark * size
    units = {
        "dot space": ". ",
        "dot x": ".x",
        "dot quote": '."',
        "dot quote space": '." ',
        "comma space": ", ",
        "tag opener": "<a",
        "char reference": "&#",
        "raw phoneme escape": "[[",
        "dot run then space": "....... ",
        "word": "word ",
        "long word": "x" * 997 + " ",
    }
    for name, unit in units.items():
        texts[f"alternation: {name}"] = unit * (size // len(unit))
    texts["one word, no space"] = "x" * size
    texts["digits after &#"] = "&#" + "1" * size
    return texts


# ---- Wyoming events and framing (a host on the LAN, issue 34) ------------------------------

WYOMING_TYPES = (
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
    "describe",
    "ping",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "run-satellite",
)
"""Every event type the node's two Wyoming ports read."""

length_literals = st.one_of(
    st.integers(0, 64).map(str),
    st.integers(2**20 - 2, 2**20 + 2).map(str),  # around the 1 MiB bound
    number_literals,
    string_literals,
    st.sampled_from(["true", "null", "[]", "{}", "-1"]),
)
"""What a header may give as `data_length` or `payload_length`."""

_event_fields = st.fixed_dictionaries(
    {},
    optional={
        "text": string_literals | json_literals,
        "voice": json_literals
        | st.builds(
            lambda k, v: object_text([(k, v)]),
            st.sampled_from(["name", "speaker", "language"]),
            string_literals | json_literals,
        ),
        "text_format": st.sampled_from(['"ssml"', '"text"', '"markdown"', "5", "null"]),
        "rate": number_literals,
        "width": number_literals,
        "channels": number_literals,
    },
).map(lambda fields: object_text(list(fields.items())))
"""A data object of Wyoming's fields, each any JSON (hostile numbers and strings often)."""


@st.composite
def wyoming_frames(draw: st.DrawFn) -> bytes:
    """One framed event as a host on the LAN may send it: a header line (an object with a type,
    any JSON, a deep nesting, a line of any length), a `data_length` and `payload_length` of
    any kind with that many bytes or fewer after it (a lie), data that is no JSON object, bad
    UTF-8, and a second event after it."""
    kind = draw(st.sampled_from(WYOMING_TYPES) | hostile_text)
    pairs: list[tuple[str, str]] = [("type", string_literal(kind, ascii_only=True))]
    data = draw(_event_fields).encode("utf-8", "surrogatepass")
    placement = draw(st.sampled_from(["inline", "part", "both", "none"]))
    if placement in ("inline", "both"):
        pairs.append(("data", draw(_event_fields | json_literals)))
    part = b""
    if placement in ("part", "both"):
        part = draw(
            st.sampled_from([data, b"[1]", b"\xff\xfe", b"null", b"{", data[: len(data) // 2]])
        )
        told = draw(st.just(str(len(part))) | length_literals)
        pairs.append(("data_length", told))
    if draw(st.booleans()):
        payload = draw(st.binary(max_size=64))
        pairs.append(("payload_length", draw(st.just(str(len(payload))) | length_literals)))
        part += payload
    header = draw(
        weighted(
            (6, st.just(object_text(pairs))),
            (1, json_literals),
            (1, st.integers(1, 10_000).map(lambda n: "[" * n)),
            (1, st.integers(1, 100_000).map(lambda n: "x" * n)),
        )
    ).encode("utf-8", "surrogatepass")
    frame: bytes = header + b"\n" + part
    if draw(st.booleans()):
        frame += b'{"type": "ping", "data": {"text": "after"}}\n'
    return frame


_AUDIO_FORMAT = st.fixed_dictionaries(
    {
        "rate": st.sampled_from([22050, 16000, 8000, 48000, 44100, 7999, 96000, 0]),
        "width": st.sampled_from([2, 2, 1, 4]),
        "channels": st.sampled_from([1, 1, 2, 3]),
    }
)


def _framed(kind: str, data: dict[str, Any], payload: bytes = b"") -> bytes:
    """One well-framed event (the library's own framing: a header line, its data, its
    payload)."""
    body = json.dumps(data).encode()
    header: dict[str, Any] = {"type": kind, "data_length": len(body)}
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + body + payload


@st.composite
def _wyoming_event(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(WYOMING_TYPES))
    text = draw(st.text(max_size=200) | st.sampled_from(["Hello.", "." * 2000 + "x", ""]))
    if kind in ("synthesize", "synthesize-chunk"):
        return _framed(kind, {"text": text})
    if kind == "synthesize-start":
        return _framed(kind, draw(st.sampled_from([{}, {"voice": {"name": "nobody"}}])))
    if kind in ("audio-start", "audio-chunk"):
        audio = draw(_AUDIO_FORMAT)
        payload = draw(st.binary(max_size=2048)) if kind == "audio-chunk" else b""
        return _framed(kind, audio, payload)
    return _framed(kind, {})


wyoming_conversations = st.lists(_wyoming_event(), min_size=1, max_size=12).map(b"".join)
"""Well-framed events of every type the ports read, in any order and number: chunks before a
start, a stop without one, audio without `audio-start` or in another format than it said,
`run-satellite` on the TTS port, two streams at once, texts of hostile characters."""


# ---- a hostile or compromised server in the ring (`mqtt.hosts`) ----------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _publish(topic: bytes, payload: bytes, qos: int) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00\x07" if qos else b"") + payload
    return bytes([0x30 | qos << 1]) + _varint(len(body)) + body


def oversized_announcement(limit: int) -> st.SearchStrategy[list[bytes]]:
    """A packet header announcing more than `limit` bytes (up to MQTT's largest length, and
    past it), of any packet type, then some of its body or none."""
    length = st.integers(limit, 268_435_455) | st.just(64 * 1024 * 1024)
    return st.builds(
        lambda kind, n, body: [bytes([kind]) + _varint(n), body],
        st.sampled_from([0x30, 0x32, 0x20, 0x90, 0xD0, 0xF0]),
        length,
        st.binary(max_size=4096),
    )


def server_behaviours(limit: int, topics: Sequence[str]) -> st.SearchStrategy[list[bytes]]:
    """What a hostile server sends a session after its CONNACK (as the chunks it writes; then
    it closes the connection): a packet larger than the session's `limit`; a Remaining Length of
    five bytes; random bytes; a second CONNACK; a PUBACK, SUBACK or PINGRESP nobody asked for; a
    PUBLISH on a topic the node never subscribed to, or on one of `topics` with any payload at
    QoS 0 or 1; a packet cut short; nothing at all."""
    topic = st.sampled_from([t.encode() for t in topics]) | st.binary(max_size=64)
    publish = st.builds(_publish, topic, st.binary(max_size=2048), st.sampled_from([0, 1]))
    fixed = st.sampled_from(
        [
            b"\x30\xff\xff\xff\xff\x7f",  # a length of five bytes
            b"\x20\x02\x00\x00",  # a second CONNACK
            b"\x40\x02\x12\x34",  # a PUBACK for a packet never sent
            b"\x90\x03\x00\x09\x80",  # a SUBACK refusing what was never asked
            b"\xd0\x00",  # a PINGRESP nobody asked for
            b"\x30\x64" + b"\x00\x01t",  # a PUBLISH cut short
            b"\x00\x00",  # a reserved packet type
            b"",
        ]
    )
    one = fixed | publish | st.binary(min_size=1, max_size=512) | oversized_announcement(limit)
    return st.lists(one.map(lambda c: c if isinstance(c, list) else [c]), max_size=4).map(
        lambda parts: [chunk for part in parts for chunk in part]
    )


# ---- a publisher in the Sparkplug namespace and on STATE topics -----------------------------

_METRIC_NAMES = st.sampled_from(
    [
        "Speak",
        "Priority",
        "Stop",
        "Acknowledge",
        "Volume",
        "Speaking",
        "Node Control/Rebirth",
        "Node Control/Next Server",
        "bdSeq",
        "Bogus",
    ]
)


def _encodable(text: str) -> str:
    """Text protobuf will encode (a lone surrogate as `?`; tests/test_sparkplug.py sends bytes
    that are no UTF-8 at all, by hand)."""
    return text.encode("utf-8", "replace").decode()


def _sparkplug_metric(draw: st.DrawFn) -> dict[str, Any]:
    """One metric of a command as the wire can carry it: by name, alias or both (matching or
    not), any declared datatype or none, any value member, null, or none."""
    metric: dict[str, Any] = {}
    how = draw(st.sampled_from(["name", "alias", "both", "neither"]))
    if how in ("name", "both"):
        metric["name"] = draw(_METRIC_NAMES | hostile_text.map(_encodable))
    if how in ("alias", "both"):
        metric["alias"] = draw(st.integers(0, 2**64 - 1) | st.sampled_from([2, 10, 11, 12, 14]))
    if draw(st.booleans()):
        metric["datatype"] = draw(st.integers(0, 2**32 - 1) | st.integers(1, 20))
    member = draw(
        st.sampled_from(
            [
                "int_value",
                "long_value",
                "float_value",
                "double_value",
                "boolean_value",
                "string_value",
                "bytes_value",
                "is_null",
                None,
            ]
        )
    )
    values: dict[str, st.SearchStrategy[Any]] = {
        "int_value": st.integers(0, 2**32 - 1),
        "long_value": st.integers(0, 2**64 - 1),
        "float_value": st.floats(width=32),
        "double_value": st.floats(),
        "boolean_value": st.booleans(),
        "string_value": hostile_text.map(_encodable),
        "bytes_value": st.binary(max_size=64),
        "is_null": st.just(True),
    }
    if member is not None:
        metric[member] = draw(values[member])
    return metric


sparkplug_metrics = st.composite(_sparkplug_metric)()
"""One hostile metric of a DCMD or NCMD (`sparkplug_command` builds payloads of them)."""


def sparkplug_command(metrics: list[dict[str, Any]], payload_class: Any) -> bytes:
    """A Sparkplug B payload (the node's own schema class, given) of these metrics: many
    writes of one metric (the amplification), mixed kinds, anything the wire can carry."""
    message = payload_class(timestamp=1)
    for fields in metrics:
        message.metrics.add(**fields)
    return bytes(message.SerializeToString())


state_payloads = st.one_of(
    st.builds(
        lambda online, stamp: json.dumps({"online": online, "timestamp": stamp}).encode(),
        st.booleans() | json_literals.map(lambda _t: "yes"),
        st.integers(-(10**20), 10**20)
        | st.sampled_from([0, 10**15, 2**63, -1, 4_102_444_800_001, 16671135]),
    ),
    payloads(fields(("online", "timestamp"))),
    st.sampled_from([b"ONLINE", b"OFFLINE", b"", b"[" * 5000, b"{" * 2000]),
)
"""STATE messages a forger (or a broken host) publishes: any timestamp (far ahead, negative,
past 2^63, the TCK's 'old' one), any type, any JSON, Sparkplug 2.2's plain text, deep nesting."""
# ---- issue 33: what each edge's attacker sends at full rate (harness/attacks.py drives them) ---

WYOMING_RUN: Final = 30_000
"""The issue's run of punctuation: 30,000 full stops and then a letter (31 KB)."""

PUNCTUATION_RUNS: Final = tuple(
    mark * WYOMING_RUN + "x" for mark in (".", "!", "?", "\u2026", "\u3002", ". ", ".\n", "?!")
)
"""Runs of each sentence end a splitter may look for, then a letter: a splitter that backtracks
on a run of punctuation takes seconds (the issue: `sentences_ready("." * 16000 + "x ")` alone
took 7 s). The first is the issue's Wyoming `synthesize`."""

LONG_TEXT_CHARS: Final = 99_990
"""The issue's long Wyoming text: just under `wyoming.max_text_chars` (100,000)."""

_WORDS: Final = [
    "pump",
    "valve",
    "boiler",
    "tank",
    "line",
    "feeder",
    "conveyor",
    "press",
    "furnace",
    "chiller",
    "hall",
    "bay",
    "dock",
    "gate",
    "north",
    "south",
    "east",
    "west",
    "upper",
    "lower",
    "first",
    "second",
    "third",
    "inner",
    "outer",
    "spare",
    "main",
    "backup",
]


def long_unended_text(chars: int = LONG_TEXT_CHARS, seed: int = 0) -> str:
    """Words and no sentence end, exactly `chars` characters, different for every `seed` (no
    phrase cache serves it): one sentence that a splitter cannot cut, so the whole of it goes
    to phonemizing unless a bound comes first."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < chars:
        word = f"{rng.choice(_WORDS)}{rng.randrange(1000)}"
        words.append(word)
        size += len(word) + 1
    text = " ".join(words)[:chars]
    return text[:-1] + "x" if text.endswith(" ") else text


def chunks_of(text: str, size: int) -> list[str]:
    """`text` in pieces of `size` characters (a streaming client's `synthesize-chunk`s)."""
    return [text[start : start + size] for start in range(0, len(text), size)]


def amplified_dcmd(
    writes: int = 32, seed: int = 0, priority: str = "chat"
) -> list[tuple[str, str, str]]:
    """One Sparkplug DCMD of the issue's amplification, as (metric name, datatype, value):
    `Priority` = `priority`, then `writes - 1` writes of `Speak`, each a different sentence of
    about 25 characters (about 1.3 KB on the wire by name, without datatypes). Each write is a
    whole speak to a node that does not bound the work of one command."""
    rng = random.Random(seed)
    metrics = [("Priority", "String", priority)]
    for write in range(writes - 1):
        word = rng.choice(_WORDS)
        metrics.append(("Speak", "String", f"Tag {write} {word} reads {rng.randrange(999)}."))
    return metrics


def flood_speak(number: int, priority: str = "info") -> bytes:
    """One speak of a plain flood on the node's own topic: a new text each time (the phrase
    cache does not serve it), of a class below the alarms."""
    word = _WORDS[number % len(_WORDS)]
    text = f"Notice {number}: the {word} in bay {number % 97} is idle."
    return json.dumps({"id": f"flood-{number}", "text": text, "priority": priority}).encode()


ALARM_CLASSES: Final = frozenset({"alarm", "critical"})


def below_alarms(payload: bytes) -> bool:
    """Whether a hostile speak payload, if the agent read it as a speak, would not be of an
    alarm class (hostile text includes the word "critical"): a flood of it must never be
    judged as alarms."""
    text = payload.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")  # as a lenient parser
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return b"critical" not in payload.lower() and b"alarm" not in payload.lower()
    if not isinstance(value, dict):
        return True
    priority = value.get("priority")
    return not (isinstance(priority, str) and priority.strip().lower() in ALARM_CLASSES)


def examples(strategy: st.SearchStrategy[Any], count: int, seed: int = 0) -> list[Any]:
    """`count` examples of a strategy, drawn once and reproducibly (no shrinking, no database):
    what an attacker's pool of payloads is made of."""
    drawn: list[Any] = []

    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect = seed_hypothesis(seed)(collect)
    collect()
    return drawn


def hostile_speak_pool(count: int = 400, seed: int = 0) -> list[bytes]:
    """Hostile speak payloads (`speak_payloads`) of no alarm class, for a flood to mix in."""
    return [p for p in examples(speak_payloads, count, seed) if below_alarms(p)]


def connack(level: int) -> bytes:
    """An MQTT CONNACK accepting a CONNECT of protocol `level` (5: MQTT 5, with an empty
    property list; else 3.1.1)."""
    return b"\x20\x03\x00\x00\x00" if level == 5 else b"\x20\x02\x00\x00"


def remaining_length(length: int) -> bytes:
    """MQTT's variable byte integer (up to 268,435,455)."""
    out = bytearray()
    while True:
        byte, length = length % 128, length // 128
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def huge_publish_head(topic: str, length: int = 268_435_455, level: int = 5) -> bytes:
    """The start of a QoS 0 PUBLISH announcing `length` bytes (MQTT's largest by default): its
    fixed header, topic and (MQTT 5) empty properties; the payload is whatever follows."""
    name = topic.encode()
    head = len(name).to_bytes(2, "big") + name + (b"\x00" if level == 5 else b"")
    return b"\x30" + remaining_length(length) + head


def garbage(size: int, seed: int = 0) -> bytes:
    """Random bytes: no MQTT packet."""
    return random.Random(seed).randbytes(size)


def padded_flac(data: bytes, padding: int) -> bytes:
    """A FLAC file with a PADDING metadata block of `padding` bytes after its STREAMINFO: the
    same samples and the same decoding work, but other bytes (a cache keyed by the file's
    digest decodes it again)."""
    if data[:4] != b"fLaC":
        raise ValueError("not a FLAC file")
    info_end = 4 + 4 + 34
    header = data[4]
    last = header & 0x80
    block = bytes([0x01 | last]) + padding.to_bytes(3, "big") + bytes(padding)
    return data[:4] + bytes([header & 0x7F]) + data[5:info_end] + block + data[info_end:]
