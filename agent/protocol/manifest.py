"""Model update manifests: what a release is, who signed it, whether this node may install it.

A manifest is JSON, signed with Ed25519 over its exact bytes; the signed envelope carries those
bytes (base64) and one or more signatures. Verification comes first, before a single field is
trusted or a model byte downloaded. File names are plain names that cannot leave a directory.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from agent.core.refusal import Refused
from agent.core.states import UpdateReason

if TYPE_CHECKING:  # imported where keys are used: 6.6 MB less in a node without update keys
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

FORMAT: Final = 1
_FILE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
MAX_ENVELOPE_BYTES: Final = 65536
MAX_RELEASE_JUMP: Final = 1_000_000
"""A release may not jump further than this past the installed one (fast-forward attacks)."""
MAX_NUMBER: Final = 2**53 - 1
"""The largest release number, length or count read: every JSON reader holds it exactly."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a release."""

    path: str
    length: int
    sha256: str


TIER_NAME: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
CPU_FLAG: Final = re.compile(r"[a-z0-9_]{1,32}")
MAX_TIERS: Final = 4
MAX_TIER_FLAGS: Final = 8


@dataclass(frozen=True, slots=True)
class TierEntry:
    """A variant of the release's model (a tier of the same voice, e.g. `int8`), signed with
    it: the variant's `.onnx`, its `.onnx.json` and the operator's result (`.json`: what the
    builder measured, shown, never the node's verdict: each node judges on its own CPU)."""

    name: str
    files: tuple[FileEntry, ...]
    requires: tuple[str, ...] = ()
    """CPU flags (as /proc/cpuinfo names them) of which an x86-64 node needs one: the kernels
    the variant's 8-bit weights rely on to compute what the operator measured; empty: any."""

    @property
    def variant(self) -> FileEntry:
        """The variant's `.onnx`."""
        return next(f for f in self.files if f.path.endswith(".onnx"))

    @property
    def json(self) -> FileEntry:
        """The variant's `.onnx.json`."""
        return next(f for f in self.files if f.path == f"{self.variant.path}.json")

    @property
    def result(self) -> FileEntry | None:
        """The operator's result, if the release carries it."""
        others = [f for f in self.files if f not in (self.variant, self.json)]
        return others[0] if others else None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A verified release description."""

    release: int
    expires: datetime
    device_class: str
    voice: str
    version: str
    notes: str
    files: tuple[FileEntry, ...]
    tiers: tuple[TierEntry, ...] = ()

    @property
    def model(self) -> FileEntry:
        """The `.onnx` file."""
        return next(f for f in self.files if f.path.endswith(".onnx"))

    @property
    def every_file(self) -> tuple[FileEntry, ...]:
        """The model's files, then every tier's."""
        return self.files + tuple(f for tier in self.tiers for f in tier.files)

    @property
    def total_bytes(self) -> int:
        """All files together, the tiers' included."""
        return sum(f.length for f in self.every_file)


def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable name for a public key: 16 hex digits of the sha256 of its raw bytes."""
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415 - see above
        Encoding,
        PublicFormat,
    )

    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_from_text(text: str) -> Ed25519PublicKey:
    """A public key from the base64 of its 32 raw bytes (as the operator tool prints it)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    raw = base64.b64decode(text.strip(), validate=True)
    return Ed25519PublicKey.from_public_bytes(raw)


def sign(manifest: bytes, keys: Sequence[Ed25519PrivateKey]) -> bytes:
    """The signed envelope of manifest bytes (for the operator tool and tests)."""
    signatures = [
        {"keyid": key_id(k.public_key()), "sig": base64.b64encode(k.sign(manifest)).decode()}
        for k in keys
    ]
    envelope = {"manifest": base64.b64encode(manifest).decode(), "signatures": signatures}
    return json.dumps(envelope, indent=1).encode()


@dataclass(frozen=True, slots=True)
class Revocation:
    """A signed withdrawal of releases: every release below `min_release` and those listed.
    Release 0 (the configured model) cannot be revoked."""

    issued: datetime
    device_class: str
    min_release: int
    revoked: frozenset[int]

    def revokes(self, release: int) -> bool:
        """Whether this release may no longer be installed or kept."""
        return release > 0 and (release < self.min_release or release in self.revoked)


def verify(
    envelope: bytes, trusted: Mapping[str, Ed25519PublicKey]
) -> Manifest | Refused[UpdateReason]:
    """Check the signature over the exact manifest bytes, then read the manifest."""
    signed = _signed(envelope, trusted)
    return signed if isinstance(signed, Refused) else _parse(signed)


def verify_revocation(
    envelope: bytes, trusted: Mapping[str, Ed25519PublicKey]
) -> Revocation | Refused[UpdateReason]:
    """Check the signature over the exact bytes of a revocation, then read it."""
    signed = _signed(envelope, trusted)
    return signed if isinstance(signed, Refused) else _parse_revocation(signed)


def _signed(
    envelope: bytes, trusted: Mapping[str, Ed25519PublicKey]
) -> bytes | Refused[UpdateReason]:
    """The signed bytes of an envelope, once a trusted key's signature over them checks."""
    if len(envelope) > MAX_ENVELOPE_BYTES:
        return Refused(UpdateReason.MALFORMED, f"envelope over {MAX_ENVELOPE_BYTES} bytes")
    try:
        outer = json.loads(envelope)
        manifest_bytes = base64.b64decode(outer["manifest"], validate=True)
        signatures = outer["signatures"]
        if not isinstance(signatures, list):
            raise TypeError("signatures is not a list")
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError) as err:
        return Refused(UpdateReason.MALFORMED, f"not a signed envelope: {err}"[:200])
    if not signatures:
        return Refused(UpdateReason.UNSIGNED, "the manifest carries no signature")
    known = [
        s
        for s in signatures
        if isinstance(s, dict) and isinstance(s.get("keyid"), str) and s["keyid"] in trusted
    ]
    if not known:
        return Refused(UpdateReason.UNKNOWN_KEY, "no signature by a trusted key")
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - see the imports

    for entry in known:
        try:
            trusted[entry["keyid"]].verify(
                base64.b64decode(entry["sig"], validate=True), manifest_bytes
            )
        except (InvalidSignature, ValueError, TypeError, binascii.Error):
            continue
        return manifest_bytes
    return Refused(UpdateReason.BAD_SIGNATURE, "the signature does not match the manifest")


def _parse_revocation(data: bytes) -> Revocation | Refused[UpdateReason]:
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("kind") != "revocation":
            raise TypeError("not a revocation")
        if body.get("format") != FORMAT:
            raise ValueError(f"format {body.get('format')!r}, expected {FORMAT}")
        revoked = body.get("revoked", [])
        if not isinstance(revoked, list) or len(revoked) > 10_000:
            raise TypeError("revoked: expected a list of releases")
        return Revocation(
            issued=_time(body["issued"], "issued"),
            device_class=_text(body["target"]["device_class"], "target.device_class"),
            min_release=_int(body.get("min_release", 0), "min_release"),
            revoked=frozenset(_int(r, "revoked[]") for r in revoked),
        )
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as err:
        return Refused(UpdateReason.MALFORMED, f"revocation: {err}"[:200])


def _parse(data: bytes) -> Manifest | Refused[UpdateReason]:
    try:
        body = json.loads(data)
        if not isinstance(body, dict):
            raise TypeError("the manifest is not a JSON object")
        if body.get("format") != FORMAT:
            raise ValueError(f"format {body.get('format')!r}, expected {FORMAT}")
        files = tuple(_file(f) for f in body["files"])
        manifest = Manifest(
            release=_int(body["release"], "release"),
            expires=_time(body["expires"]),
            device_class=_text(body["target"]["device_class"], "target.device_class"),
            voice=_text(body["target"]["voice"], "target.voice"),
            version=_text(body["version"], "version"),
            notes=str(body.get("notes", ""))[:255],
            files=files,
            tiers=_tiers(body.get("tiers", [])),
        )
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as err:
        return Refused(UpdateReason.MALFORMED, f"manifest: {err}"[:200])
    names = [f.path for f in files]
    models = [n for n in names if n.endswith(".onnx")]
    if len(set(names)) != len(names) or len(models) != 1 or f"{models[0]}.json" not in names:
        return Refused(
            UpdateReason.MALFORMED, "expected one .onnx file with its .onnx.json, no repeats"
        )
    every = [f.path for f in manifest.every_file]
    if len(set(every)) != len(every):
        return Refused(UpdateReason.MALFORMED, "a tier's file repeats another file's name")
    return manifest


def _tiers(raw: Any) -> tuple[TierEntry, ...]:
    """The release's tiers (none when absent): each a plain name, its variant's `.onnx`
    with its `.onnx.json` and at most one more `.json`, and the CPU flags it relies on."""
    if not isinstance(raw, list) or len(raw) > MAX_TIERS:
        raise ValueError(f"tiers: expected a list of at most {MAX_TIERS}")
    tiers = []
    for entry in raw:
        name = entry["name"]
        if not isinstance(name, str) or not TIER_NAME.fullmatch(name):
            raise ValueError("tiers[].name: expected a short plain name")
        files = tuple(_file(f) for f in entry["files"])
        variants = [f.path for f in files if f.path.endswith(".onnx")]
        names = [f.path for f in files]
        extra = [n for n in names if n not in variants and not n.endswith(".json")]
        if len(variants) != 1 or f"{variants[0]}.json" not in names or extra or len(files) > 3:
            raise ValueError(f"tier {name}: expected one .onnx, its .onnx.json, one .json")
        requires = entry.get("requires", [])
        if (
            not isinstance(requires, list)
            or len(requires) > MAX_TIER_FLAGS
            or not all(isinstance(f, str) and CPU_FLAG.fullmatch(f) for f in requires)
        ):
            raise ValueError(f"tier {name}: requires: expected CPU flag names")
        tiers.append(TierEntry(name, files, tuple(requires)))
    if len({t.name for t in tiers}) != len(tiers):
        raise ValueError("tiers: a name repeats")
    return tuple(tiers)


def _file(raw: Any) -> FileEntry:
    path = raw["path"]
    if not plain_name(path):
        raise ValueError(f"file name {path!r} is not a plain name")
    sha = raw["sha256"]
    if not is_sha256(sha):
        raise ValueError(f"{path}: sha256 is not 64 lowercase hex digits")
    return FileEntry(path, _int(raw["length"], f"{path}.length"), sha)


def plain_name(raw: object) -> bool:
    """Whether this is a file name a release may use: a plain name that cannot leave a
    directory (letters, digits, `.`, `_`, `-`; no `..`)."""
    return isinstance(raw, str) and bool(_FILE_NAME.fullmatch(raw)) and ".." not in raw


def is_sha256(raw: object) -> bool:
    """Whether this is a sha256 as manifests write it: 64 lowercase hex digits."""
    return isinstance(raw, str) and bool(_SHA256.fullmatch(raw))


def whole_number(raw: object) -> bool:
    """Whether this is a whole number 0..MAX_NUMBER (not a bool, not a float)."""
    return isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= MAX_NUMBER


def _int(raw: Any, name: str) -> int:
    if not whole_number(raw):
        raise ValueError(f"{name}: expected a whole number 0..{MAX_NUMBER}")
    return int(raw)


def _text(raw: Any, name: str) -> str:
    if not isinstance(raw, str) or not 0 < len(raw) <= 128:
        raise ValueError(f"{name}: expected a string of 1-128 characters")
    return raw


def _time(raw: Any, name: str = "expires") -> datetime:
    if not isinstance(raw, str):
        raise ValueError(f"{name}: expected an ISO 8601 time")
    moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{name}: expected a time zone")
    return moment.astimezone(UTC)


def admissible(  # noqa: PLR0911, PLR0917 - one reason each; what decides it
    manifest: Manifest,
    now: datetime,
    installed: int,
    device_class: str,
    voice: str,
    revocation: Revocation | None = None,
) -> Refused[UpdateReason] | None:
    """Whether this node may install it now; None if so. The same release is `already_installed`."""
    if revocation is not None and revocation.revokes(manifest.release):
        return Refused(UpdateReason.REVOKED, f"release {manifest.release} was revoked")
    if manifest.expires <= now:
        return Refused(
            UpdateReason.EXPIRED, f"the manifest expired at {manifest.expires.isoformat()}"
        )
    if manifest.device_class != device_class or manifest.voice != voice:
        target = f"{manifest.device_class}/{manifest.voice}"
        return Refused(
            UpdateReason.WRONG_TARGET, f"for {target}, this node is {device_class}/{voice}"
        )
    if manifest.release < installed:
        return Refused(
            UpdateReason.DOWNGRADE, f"release {manifest.release} is older than {installed}"
        )
    if manifest.release == installed:
        return Refused(UpdateReason.ALREADY_INSTALLED, f"release {installed} is installed")
    if manifest.release - installed > MAX_RELEASE_JUMP:
        return Refused(UpdateReason.RELEASE_JUMP, f"release {manifest.release} jumps too far")
    return None
