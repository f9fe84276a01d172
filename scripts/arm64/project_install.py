"""The project installed in the arm64 root as a Raspberry Pi user would: a wheel built from a copy
of the source tree, installed with its dependencies from PyPI into a venv outside that tree,
without extras.

The venv is kept while pyproject.toml is unchanged (its digest is stamped in the venv): a warm
run then reinstalls only the freshly built project wheel. A changed pyproject.toml makes a new
venv from nothing, so a dependency dropped from it is really gone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import IO, Final

from chroot_session import Chroot
from pip_config import ROOT_CA_BUNDLE, PipConfig

APP_DIR: Final = PurePosixPath("/opt/voice-agent")
"""Where the project lives inside the root."""
SRC: Final = APP_DIR / "src"
DIST: Final = APP_DIR / "dist"
VENV: Final = APP_DIR / "venv"
VOICE_AGENT: Final = VENV / "bin/voice-agent"
PIP_TIMEOUT: Final = 3600.0
"""Longest pip run inside the root (seconds; a new venv took 94-176 s, docs/arm64.md)."""
DEV_ONLY: Final = frozenset({"pytest", "mypy", "ruff", "hypothesis", "matplotlib", "types-pyyaml"})
"""Packages of the `dev` extra only: finding one in the venv means extras were installed."""
_STAMP: Final = ".voice-agent-pyproject-sha256"


def source_files(repo: Path) -> list[Path]:
    """The files a clone holds (plus new files not ignored, so uncommitted work is tested too);
    untracked hidden folders at the top (caches of tools) are left out."""
    listing = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    tracked = set(
        subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z"], check=True, capture_output=True
        ).stdout.split(b"\0")
    )
    files = []
    for raw in listing.split(b"\0"):
        if not raw:
            continue
        if raw not in tracked and raw.startswith(b"."):
            continue
        path = Path(raw.decode())
        if (repo / path).is_file():
            files.append(path)
    return files


def copy_source(repo: Path, root: Chroot) -> int:
    """Copy the source tree to SRC in the root (replacing an earlier copy); returns the count."""
    dest = root.path(SRC)
    if dest.exists():
        shutil.rmtree(dest)
    files = source_files(repo)
    for relative in files:
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / relative, target)
    return len(files)


def configure_pip(root: Chroot, config: PipConfig) -> None:
    """The root's /etc/pip.conf and CA bundle, from the host's (each run: the host's may change)."""
    shutil.copyfile(config.ca_bundle, root.path(ROOT_CA_BUNDLE))
    root.path("/etc/pip.conf").write_text(config.text(), encoding="utf-8")


def install(repo: Path, root: Chroot, log: IO[str]) -> str:
    """Build the project's wheel in the root and install it; returns what was done."""
    digest = hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest()
    stamp = root.path(VENV / _STAMP)
    fresh = not (stamp.is_file() and stamp.read_text(encoding="ascii").strip() == digest)
    pip = _pip()
    if fresh:
        if root.path(VENV).exists():
            shutil.rmtree(root.path(VENV))
        root.run(["python3", "-m", "venv", VENV], log, PIP_TIMEOUT)
    dist = root.path(DIST)
    if dist.exists():
        shutil.rmtree(dist)
    root.run([*pip, "wheel", "--no-deps", "--wheel-dir", DIST, SRC], log, PIP_TIMEOUT)
    (wheel,) = dist.glob("voice_agent-*.whl")
    inside = DIST / wheel.name
    if fresh:
        root.run([*pip, "install", inside], log, PIP_TIMEOUT)
        stamp.write_text(digest + "\n", encoding="ascii")
        done = f"new venv {VENV}, {wheel.name} and its dependencies installed"
    else:
        root.run([*pip, "install", "--no-deps", "--force-reinstall", inside], log, PIP_TIMEOUT)
        done = f"venv {VENV} kept (pyproject.toml unchanged), {wheel.name} reinstalled"
    root.run([*pip, "check"], log, PIP_TIMEOUT)
    extras = sorted(DEV_ONLY & set(installed(root, log)))
    if extras:
        raise RuntimeError(f"dev-only packages in the venv (extras installed?): {extras}")
    return done


def installed(root: Chroot, log: IO[str]) -> dict[str, str]:
    """Package name (lower case) to version, as the venv's pip lists them."""
    listing = root.output([*_pip(), "list", "--format=json"], PIP_TIMEOUT)
    log.write(f"\n$ pip list\n{listing}\n")
    return {p["name"].lower(): p["version"] for p in json.loads(listing)}


def _pip() -> list[str]:
    return [str(VENV / "bin/python"), "-m", "pip"]
