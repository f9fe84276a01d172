"""The host's pip configuration, translated for the arm64 root: what reaches a package index over
the network is kept, what points at host-only files is dropped or replaced.

pip itself merges the configuration (/etc/pip.conf, /etc/xdg/pip, ~/.config/pip, ~/.pip and the
PIP_* variables): `pip config list` prints the result, so nothing here parses pip.conf files.
Local wheel folders and `file://` indexes hold the host's x86_64 files, so the root never sees
them; the CA bundle is copied into the root and `cert` points at the copy.
"""

from __future__ import annotations

import ast
import configparser
import io
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

ROOT_CA_BUNDLE: Final = Path("/etc/ssl/certs/host-ca-bundle.crt")
"""Where the host's CA bundle is copied inside the root (pip's `cert` there, and SSL_CERT_FILE).
The host may trust CAs the root's ca-certificates package does not (a TLS-inspecting egress
proxy's, say), so the root trusts exactly what the host's pip trusts."""
HOST_SYSTEM_BUNDLE: Final = Path("/etc/ssl/certs/ca-certificates.crt")
"""The host's system CA bundle: copied when pip names no `cert` of its own."""
_ENV_SCOPE: Final = ":env:"
_URL_LIST_KEYS: Final = frozenset({"index-url", "extra-index-url", "find-links"})
"""Keys whose values are whitespace-separated locations: only network URLs stay."""
_HOST_FILE_KEYS: Final = frozenset(
    {"constraint", "requirement", "client-cert", "build", "src", "target", "prefix", "root"}
)
"""Keys naming files or folders of the host: dropped (reported)."""
_CERT_KEYS: Final = frozenset({"cert"})
_NETWORK_SCHEMES: Final = ("http://", "https://")


@dataclass(frozen=True, slots=True)
class PipConfig:
    """A pip.conf for the root, with what was left out and why."""

    sections: dict[str, dict[str, str]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    ca_bundle: Path = HOST_SYSTEM_BUNDLE
    """The host CA bundle to copy to ROOT_CA_BUNDLE: the one `cert` named, else the system's."""

    def text(self) -> str:
        """The pip.conf text."""
        parser = configparser.ConfigParser(interpolation=None)
        for section, values in self.sections.items():
            parser[section] = values
        out = io.StringIO()
        out.write("# scripts/arm64: the host's pip configuration without host-only paths.\n")
        parser.write(out)
        return out.getvalue()


def host_pip_config(pip: Sequence[str], env: dict[str, str]) -> PipConfig:
    """Ask the host's pip for its merged configuration and translate it for the root."""
    listing = subprocess.run(
        [*pip, "config", "list"], env=env, check=True, capture_output=True, text=True, timeout=120
    ).stdout
    return translate(parse_listing(listing))


def parse_listing(listing: str) -> list[tuple[str, str, str]]:
    """`pip config list` lines (`section.key='value'`) as (section, key, value), in pip's order
    (files first, then the environment: later entries win)."""
    entries = []
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        if not sep or "." not in name:
            continue
        section, key = name.rsplit(".", 1)
        value = ast.literal_eval(raw)
        if isinstance(value, str):
            entries.append((_ENV_SCOPE if section == _ENV_SCOPE else section, key, value))
    return entries


def translate(entries: list[tuple[str, str, str]]) -> PipConfig:
    """Keep network settings, drop host-only locations, point `cert` at the root's copy."""
    merged: dict[tuple[str, str], str] = {}
    for section, key, value in entries:
        merged[("global" if section == _ENV_SCOPE else section, key)] = value
    config = PipConfig()
    ca_bundle = HOST_SYSTEM_BUNDLE
    for (section, key), value in merged.items():
        kept: str | None = value
        if key in _URL_LIST_KEYS:
            urls = value.split()
            network = [url for url in urls if url.startswith(_NETWORK_SCHEMES)]
            config.dropped.extend(
                f"{section}.{key}={url} (host-only)" for url in urls if url not in network
            )
            kept = " ".join(network) or None
        elif key in _HOST_FILE_KEYS:
            config.dropped.append(f"{section}.{key}={value} (host file)")
            kept = None
        elif key in _CERT_KEYS:
            ca_bundle = Path(value)
            kept = None  # set below, for every command
        if kept is not None:
            config.sections.setdefault(section, {})[key] = kept
    config.sections.setdefault("global", {})["cert"] = str(ROOT_CA_BUNDLE)
    return PipConfig(config.sections, config.dropped, ca_bundle)
