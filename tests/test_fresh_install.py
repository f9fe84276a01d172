"""The user's two commands on a new machine (scripts/fresh_machine.sh, scripts/fresh_install.py):
a new Debian 12 root with only git, make and python3, this commit cloned into it, then

- `make run`'s set-up installs no test package and nothing of the dev extra, and `make run`
  speaks what `mosquitto_pub` sends;
- `sudo make install` installs the service; the unit's command, run as the unit runs it (its
  user, groups, directories and environment: scripts/run_unit.py, for no systemd runs here),
  speaks what `mosquitto_pub` sends in an ALSA capture, its voice prepared at install; an
  upgrade keeps the configuration; `make uninstall` leaves nothing but the configuration.

Root only (debootstrap, chroot, mounts); each run takes minutes, most of it downloads. The
clone is of the commit: uncommitted changes are not what is tested."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness import ROOT

pytestmark = [
    pytest.mark.install,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: debootstrap, chroot and mounts"),
]


def scenario(name: str, cache: Path) -> dict[str, object]:
    """Run one scenario on a new root; its report."""
    done = subprocess.run(
        ["bash", "scripts/fresh_machine.sh", "--scenario", name, "--cache", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2 * 3600,
        check=False,
    )
    print(done.stdout[-6000:])
    written = cache / "report.json"
    assert written.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, object] = json.loads(written.read_text(encoding="utf-8"))
    assert "error" not in report, report["error"]
    assert done.returncode == 0, done.stderr[-3000:]
    return report


def test_make_run_installs_what_running_needs_and_speaks(tmp_path: Path) -> None:
    report = scenario("run", tmp_path)
    checks = report["checks"]
    assert isinstance(checks, dict)
    assert checks == dict.fromkeys(checks, True)
    assert set(checks) >= {
        "make run installs no test package",
        "make run installs nothing of the dev extra",
        "make run speaks a mosquitto_pub message",
    }


def test_make_install_runs_the_unit_and_uninstall_leaves_the_configuration(
    tmp_path: Path,
) -> None:
    report = scenario("install", tmp_path)
    checks = report["checks"]
    assert isinstance(checks, dict)
    assert checks == dict.fromkeys(checks, True)
    assert set(checks) >= {
        "the unit's command speaks a mosquitto_pub message",
        "nothing is analysed at the service's start",
        "an upgrade keeps the configuration",
        "make uninstall leaves nothing but the configuration",
    }
