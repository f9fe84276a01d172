"""The Debian bookworm arm64 root (what Raspberry Pi OS 64-bit is built on): made once with
debootstrap from this machine's own Debian mirror, then reused.

The mirror is read at run time from the host's apt sources (apt itself lists them, whatever
their format), never written in the repository. The root is complete only once its stamp file
exists; a root without one (an interrupted build) is removed and built again.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from chroot_session import Chroot, remove_tree

SUITE: Final = "bookworm"
ARCH: Final = "arm64"
VARIANT: Final = "minbase"
PACKAGES: Final = (
    "python3",
    "python3-venv",
    "python3-dev",
    "gcc",
    "libasound2-dev",
    "alsa-utils",
    "mosquitto",
    "mosquitto-clients",
    "ca-certificates",
)
"""What a Raspberry Pi user installs before `pip install` (pyalsaaudio builds from source)."""
_LAYOUT: Final = 1
"""Version of what the build does: a change makes a new root."""
DEBOOTSTRAP_TIMEOUT: Final = 3600.0
"""Longest debootstrap run (seconds; measured ~3 min, its second stage is emulated)."""
APT_TIMEOUT: Final = 3600.0
"""Longest apt-get run inside the root (seconds)."""
_SUITE_SUFFIXES: Final = ("", "-updates", "-security")
"""Suites of a Debian release the root takes from the host's sources (no backports)."""


@dataclass(frozen=True, slots=True)
class AptSource:
    """One `deb` source: archive URI, suite and components."""

    uri: str
    suite: str
    components: tuple[str, ...]

    def line(self) -> str:
        """The sources.list line."""
        return f"deb {self.uri} {self.suite} {' '.join(self.components)}"


def host_codename() -> str:
    """The host's Debian codename (VERSION_CODENAME of /etc/os-release)."""
    for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME":
            return value.strip().strip('"')
    raise RuntimeError("/etc/os-release names no VERSION_CODENAME: not a Debian host?")


def host_sources() -> list[AptSource]:
    """The host's `deb` sources, as apt reads them (one-line and deb822 files alike)."""
    listing = subprocess.run(
        [
            "apt-get",
            "indextargets",
            "--format",
            "$(REPO_URI) $(RELEASE) $(COMPONENT)",
            "Created-By: Packages",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[tuple[str, str], list[str]] = {}
    for line in listing.splitlines():
        uri, suite, component = line.split()
        components = found.setdefault((uri.rstrip("/"), suite), [])
        if component not in components:
            components.append(component)
    return [AptSource(uri, suite, tuple(c)) for (uri, suite), c in found.items()]


def bookworm_sources(sources: list[AptSource], codename: str) -> list[AptSource]:
    """The host's Debian sources moved to bookworm: its release's suites (`codename`,
    `-updates`, `-security`) become bookworm's; other repositories are left out."""
    moved = []
    for source in sources:
        for suffix in _SUITE_SUFFIXES:
            if source.suite == codename + suffix:
                moved.append(AptSource(source.uri, SUITE + suffix, source.components))
    if not any(s.suite == SUITE for s in moved):
        raise RuntimeError(
            f"no Debian mirror for {codename} in this machine's apt sources "
            "(/etc/apt/sources.list, /etc/apt/sources.list.d/): cannot debootstrap"
        )
    return moved


def root_key() -> str:
    """What the root is made of, hashed: roots of another recipe are not reused."""
    recipe = {"suite": SUITE, "arch": ARCH, "variant": VARIANT, "packages": PACKAGES}
    text = json.dumps({**recipe, "layout": _LAYOUT}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class BookwormRoot:
    """The cached root under `cache`: `root-<key>/`, complete when `root-<key>.complete` exists."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        key = root_key()
        self.path = cache / f"root-{key}"
        self.stamp = cache / f"root-{key}.complete"
        self.cpuinfo = cache / "cpuinfo"

    def complete(self) -> bool:
        """Whether a finished root is there to reuse."""
        return self.stamp.is_file() and (self.path / "usr/bin/python3").exists()

    def session(self) -> Chroot:
        """Mounts for commands inside the root (use in a `with`)."""
        return Chroot(self.path, self.cpuinfo)

    def discard(self) -> None:
        """Remove every root in the cache (stamps first, so a half-removed root never counts)."""
        for stamp in self.cache.glob("root-*.complete"):
            stamp.unlink()
        for old in self.cache.glob("root-*"):
            if old.is_dir():
                remove_tree(old)

    def build(self, log_path: Path) -> None:
        """Make the root: debootstrap, the host's bookworm sources, the packages; then stamp it.

        Anything left of an earlier root (an interrupted build, another recipe) goes first.
        """
        self.cache.mkdir(parents=True, exist_ok=True)
        self.discard()
        sources = bookworm_sources(host_sources(), host_codename())
        mirror = next(s for s in sources if s.suite == SUITE)
        with log_path.open("a", encoding="utf-8") as log:
            command = [
                "debootstrap",
                f"--arch={ARCH}",
                f"--variant={VARIANT}",
                f"--components={','.join(mirror.components)}",
                SUITE,
                str(self.path),
                mirror.uri,
            ]
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=DEBOOTSTRAP_TIMEOUT,
            )
            lines = [s.line() for s in sources]
            (self.path / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
            # No service starts from a package's install script (mosquitto would listen on the
            # host's port 1883 and keep the mounts busy): the usual policy-rc.d of chroots.
            policy = self.path / "usr/sbin/policy-rc.d"
            policy.write_text("#!/bin/sh\n# scripts/arm64: no services in this root.\nexit 101\n")
            policy.chmod(0o755)
            with self.session() as root:
                root.run(["apt-get", "update"], log, APT_TIMEOUT)
                install = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
                root.run(install, log, APT_TIMEOUT)
                root.run(["apt-get", "clean"], log, APT_TIMEOUT)
        self.stamp.write_text(json.dumps({"sources": lines, "packages": PACKAGES}) + "\n")
