"""Operator side of model updates: keys, manifests, signatures, and a release server on a LAN.

Used by `python -m ota` (see ota/__main__.py) and by the tests. The manifest format and its
verification live in `agent.protocol.manifest`, the one place both sides read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import threading
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.protocol import manifest as manifests


def generate_key(directory: Path, name: str = "release") -> tuple[Path, str]:
    """A new Ed25519 key pair: the private key (PEM, mode 600, in a directory of mode 700) and
    the public key as the base64 text that goes into the nodes' `ota.trusted_keys`. An existing
    key is never overwritten (FileExistsError): losing it would strand every node trusting it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    path = directory / f"{name}.key"
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return path, public_text(private)


def build_revocation(device_class: str, min_release: int = 0, revoked: Sequence[int] = ()) -> bytes:
    """The body of a revocation: releases below `min_release` and those listed are withdrawn
    (nodes refuse to install them, and leave them if installed)."""
    body = {
        "format": manifests.FORMAT,
        "kind": "revocation",
        "issued": datetime.now(UTC).isoformat(timespec="seconds"),
        "target": {"device_class": device_class},
        "min_release": min_release,
        "revoked": sorted(set(revoked)),
    }
    return json.dumps(body, indent=1).encode()


def public_text(private: Ed25519PrivateKey) -> str:
    """The base64 of the raw public key."""
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode()


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """A private key written by `generate_key`."""
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def build_manifest(
    model: Path,
    release: int,
    version: str,
    *,
    expires_in: timedelta = timedelta(days=30),
    device_class: str = "voice-agent",
    voice: str = "default",
    notes: str = "",
    tiers: Sequence[Path] = (),
) -> bytes:
    """The manifest of a model and its .onnx.json (lengths and sha256 read from the files), and
    of each tier variant given (`python -m tiers build`'s `.onnx`, with its `.onnx.json` and its
    `.result.json` beside it): signed with the model, as tiers of it."""
    files = [_entry(path) for path in (model, Path(f"{model}.json"))]
    body: dict[str, object] = {
        "format": manifests.FORMAT,
        "release": release,
        "expires": (datetime.now(UTC) + expires_in).isoformat(timespec="seconds"),
        "target": {"device_class": device_class, "voice": voice},
        "version": version,
        "notes": notes,
        "files": files,
    }
    if tiers:
        body["tiers"] = [tier_entry(variant) for variant in tiers]
    return json.dumps(body, indent=1).encode()


def _entry(path: Path) -> dict[str, object]:
    data = path.read_bytes()
    return {"path": path.name, "length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def tier_files(variant: Path) -> list[Path]:
    """A tier's files: the variant, its `.onnx.json` and its builder's result (when there)."""
    result = variant.with_name(variant.name.removesuffix(".onnx") + ".result.json")
    return [variant, Path(f"{variant}.json"), *([result] if result.is_file() else [])]


def tier_entry(variant: Path) -> dict[str, object]:
    """The manifest entry of one tier: its name and the CPU flags it relies on, as its
    builder's result says them (`int8` and none when there is no result), and its files."""
    if not variant.name.endswith(".onnx"):
        raise ValueError(f"{variant}: a tier is a variant's .onnx file")
    files = tier_files(variant)
    name, requires = "int8", []
    if len(files) == 3:
        result = json.loads(files[2].read_text(encoding="utf-8"))
        name = str(result.get("tier", name))
        requires = [str(flag) for flag in result.get("requires", [])]
    return {"name": name, "requires": requires, "files": [_entry(p) for p in files]}


def sign(manifest: bytes, keys: Sequence[Ed25519PrivateKey]) -> bytes:
    """The signed envelope (Ed25519 over the exact manifest bytes)."""
    return manifests.sign(manifest, keys)


def publish_release(
    directory: Path, model: Path, envelope: bytes, tiers: Sequence[Path] = ()
) -> Path:
    """Lay a release out for the server: its files, its tiers' and `manifest.json` in one
    folder."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in (model, Path(f"{model}.json"), *(f for v in tiers for f in tier_files(v))):
        (directory / path.name).write_bytes(path.read_bytes())
    (directory / "manifest.json").write_bytes(envelope)
    return directory


DEFAULT_BIND: Final = "127.0.0.1"
"""`ota serve` listens on loopback unless told an address (`--bind`)."""
PRIVATE_SUFFIXES: Final = (".key", ".pem")
"""Never served, wherever they are: a signing key placed among the releases by mistake."""


def servable(root: Path, url_path: str) -> Path | None:
    """The file a request path names under `root`, or None (answered 404): only a regular file,
    inside `root` once every symlink is resolved, with no hidden (`.`) part in the path asked for
    and not a private key. Never a directory (no listing)."""
    try:
        path = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path, errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    parts = [p for p in path.split("/") if p]
    if not parts or any(p.startswith(".") or "\\" in p or "\0" in p for p in parts):
        return None  # also `..` and `.`: nothing is normalized away, it is refused
    if parts[-1].lower().endswith(PRIVATE_SUFFIXES):
        return None
    base = root.resolve()
    try:
        target = base.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    if not target.is_relative_to(base) or not target.is_file():
        return None
    return target


class RangeRequestHandler(http.server.BaseHTTPRequestHandler):
    """The files of the releases, `GET` and `HEAD`, with `Range: bytes=N-` support (what the
    nodes resume downloads with). Anything else is 404: no directory listing, no path outside
    the served directory (neither by `..` nor through a symlink)."""

    root: Path = Path()

    def do_GET(self) -> None:
        """A file, whole or from an offset."""
        self._answer(body=True)

    def do_HEAD(self) -> None:
        """The headers of `GET`."""
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = servable(self.root, self.path)
        if path is None:
            self.send_error(404)
            return
        try:
            handle = path.open("rb")
        except OSError:
            self.send_error(404)
            return
        with handle:
            size = os.fstat(handle.fileno()).st_size
            start = 0
            match = re.fullmatch(r"bytes=(\d{1,19})-", self.headers.get("Range", ""))
            if match is not None:
                start = int(match.group(1))
                if start >= size:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if body:
                handle.seek(start)
                shutil.copyfileobj(handle, self.wfile)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tool prints its own progress."""


class _Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve(directory: Path, port: int, host: str = DEFAULT_BIND) -> http.server.ThreadingHTTPServer:
    """Serve the release files under `directory` over HTTP with Range, in a background thread;
    on loopback unless `host` names another address."""
    handler = type("Handler", (RangeRequestHandler,), {"root": directory.resolve()})
    server_class = _Server6 if ":" in host else http.server.ThreadingHTTPServer
    server = server_class((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def describe(envelope: bytes) -> tuple[int, str, str]:
    """(release, version, model sha256) of a signed envelope, read without verifying it (the
    nodes verify); ValueError when it is not a signed manifest."""
    try:
        outer = json.loads(envelope)
        body = json.loads(base64.b64decode(outer["manifest"], validate=True))
        model = next(f for f in body["files"] if str(f["path"]).endswith(".onnx"))
        release, version, sha = body["release"], body["version"], model["sha256"]
    except (ValueError, KeyError, TypeError, StopIteration, binascii.Error) as err:
        raise ValueError(f"not a signed manifest envelope: {err}") from None
    if not isinstance(release, int) or not isinstance(version, str) or not isinstance(sha, str):
        raise ValueError("not a signed manifest envelope: release, version or sha256 mistyped")
    return release, version, sha
