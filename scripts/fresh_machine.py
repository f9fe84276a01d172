"""`scripts/fresh_machine.sh`: `make test` from a fresh clone on a new machine.

The machine: a new Debian 12 root (debootstrap --variant=minbase bookworm, the mirror read from
this machine's apt sources at run time, as scripts/arm64 does), with nothing added but what the
README's Quick start says a user must have (git, make, python3). The repository's current commit
is cloned into it (from a git bundle: nothing of this checkout's files, venv or caches comes
along) at --clone-dir (default under /tmp, where the unit's sandbox hides the checkout unless
it is bound back), and `make setup` (what `make test` does first: the system packages, .venv)
then `make test` run there as root in the chroot. The host's pip configuration goes along when
it reaches an index over the network (scripts/arm64/pip_config.py). Prints each step's time and
pytest's counts, writes them to <cache>/report.json, and removes the root (--keep keeps it).

Run as root through scripts/fresh_machine.sh (it installs debootstrap and runs this in private
mount and PID namespaces, so no mount or process outlives the run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import IO, Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "arm64"))

import fresh_install  # noqa: E402
from bookworm_root import SUITE, bookworm_sources, host_codename, host_sources  # noqa: E402
from chroot_session import ROOT_PATH, remove_tree, unmount_all  # noqa: E402
from pip_config import ROOT_CA_BUNDLE, host_pip_config  # noqa: E402

USER_PACKAGES: Final = ("git", "make", "python3")
"""What the README's Quick start says a default Debian lacks before `make run`."""
DEBOOTSTRAP_TIMEOUT: Final = 3600.0
APT_TIMEOUT: Final = 3600.0
MAKE_TIMEOUT: Final = 4 * 3600.0
"""Longest `make setup` or `make test` (seconds; measured: see the README's Quick start)."""
BUNDLE: Final = PurePosixPath("/root/voice-agent.bundle")
SUMMARY: Final = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s", re.MULTILINE)


HOSTS: Final = "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"
"""The /etc/hosts a Debian install starts with (`localhost` resolves through it alone)."""


class FreshRoot:
    """The root with /proc, /sys, /dev, /dev/pts, resolv.conf and (if missing) /etc/hosts while
    in a `with`; the root is bound on itself first, so that inside it `/` is a mount point
    (bubblewrap pivots the root)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._chroot = shutil.which("chroot") or "/usr/sbin/chroot"

    def __enter__(self) -> FreshRoot:
        try:
            self._mount(["--bind", str(self.path)], "")
            self._mount(["-t", "proc", "proc"], "proc")
            for inside in ("sys", "dev", "dev/pts"):
                self._mount(["--bind", f"/{inside}"], inside)
            resolv = self.path / "etc/resolv.conf"
            if resolv.is_symlink():
                resolv.unlink()
            shutil.copyfile("/etc/resolv.conf", resolv)
            hosts = self.path / "etc/hosts"
            if not hosts.exists():  # debootstrap writes none; Debian's installer (and a
                hosts.write_text(HOSTS, encoding="ascii")  # container) always does
        except BaseException:
            unmount_all(self.path)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        unmount_all(self.path)

    def _mount(self, args: list[str], inside: str) -> None:
        target = self.path / inside
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", *args, str(target)], check=True, timeout=60)

    def command(self, args: list[str], cwd: str = "/") -> list[str]:
        """The command line that runs `args` inside the root, in `cwd`."""
        return [self._chroot, str(self.path), "sh", "-c", 'cd "$0" && exec "$@"', cwd, *args]

    @staticmethod
    def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
        """A login's clean environment in the root, and `extra`."""
        return {
            "PATH": ROOT_PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive",
            "SSL_CERT_FILE": str(ROOT_CA_BUNDLE),
            **(extra or {}),
        }

    def run(
        self,
        args: list[str],
        log: IO[str],
        timeout: float,
        cwd: str = "/",
        env: dict[str, str] | None = None,
    ) -> None:
        """Run inside the root (a login's clean environment), output to log; raise on failure."""
        log.write(f"\n$ (cd {cwd} && {' '.join(args)})\n")
        log.flush()
        subprocess.run(
            self.command(args, cwd),
            env=self.environment(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=True,
        )

    def output(self, args: list[str], cwd: str = "/") -> str:
        """What a command run inside the root prints (raise on failure)."""
        done = subprocess.run(
            self.command(args, cwd),
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return done.stdout

    def start(
        self, args: list[str], log: IO[str], cwd: str = "/", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start inside the root in a process group of its own, output to log."""
        log.write(f"\n$ (cd {cwd} && {' '.join(args)}) &\n")
        log.flush()
        return subprocess.Popen(
            self.command(args, cwd),
            env=self.environment(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Steps:
    """Named steps, timed; a failing one shows the end of its log."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def run(self, name: str, log: Path, action: Callable[[], None]) -> None:
        """Run `action()` as the step `name`."""
        print(f"--- {name}", flush=True)
        start = time.monotonic()
        try:
            action()
        except BaseException:
            if log.is_file():
                tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
                print(f"--- last lines of {log}:", *tail, sep="\n", file=sys.stderr)
            raise
        finally:
            self.times[name] = round(time.monotonic() - start, 1)
            print(f"    {self.times[name]:.1f} s", flush=True)


def debootstrap(root: Path, log: IO[str]) -> None:
    """A minbase bookworm root of this machine's architecture, from its own Debian mirror; its
    sources are the host's bookworm ones; no service starts from a package's install script."""
    sources = bookworm_sources(host_sources(), host_codename())
    mirror = next(s for s in sources if s.suite == SUITE)
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    command = ["debootstrap", f"--arch={arch}", "--variant=minbase"]
    command += [f"--components={','.join(mirror.components)}", SUITE, str(root), mirror.uri]
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
    (root / "etc/apt/sources.list").write_text("\n".join(s.line() for s in sources) + "\n")
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text(
        "#!/bin/sh\n# scripts/fresh_machine.py: no services in this root.\nexit 101\n"
    )
    policy.chmod(0o755)


def configure_pip(root: Path) -> list[str]:
    """The host's pip configuration, without its host-only paths, as the root's /etc/pip.conf
    (with the CA bundle it trusts); returns what was left out."""
    config = host_pip_config([sys.executable, "-m", "pip"], dict(os.environ))
    target = root / ROOT_CA_BUNDLE.relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config.ca_bundle, target)
    (root / "etc/pip.conf").write_text(config.text(), encoding="utf-8")
    return config.dropped


def pytest_summary(log: Path) -> dict[str, object]:
    """pytest's last summary line in the log: its counts and time."""
    text = log.read_text(encoding="utf-8", errors="replace")
    found = list(SUMMARY.finditer(text))
    if not found:
        return {"summary": None}
    last = found[-1]
    counts = {
        word: int(number)
        for number, word in re.findall(
            r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)", last["counts"]
        )
    }
    return {
        "summary": last.group(0).strip("= "),
        "counts": counts,
        "seconds": float(last["seconds"]),
    }


def make(machine: FreshRoot, steps: Steps, logs: Path, target: str, clone_dir: str) -> None:
    """`make <target>` in the clone, as the step `make <target>`, logged to make-<target>.log."""
    target_log = logs / f"make-{target}.log"
    with target_log.open("a", encoding="utf-8") as log:
        steps.run(
            f"make {target}",
            target_log,
            lambda: machine.run(["make", target], log, MAKE_TIMEOUT, clone_dir),
        )


Scenario = Callable[[FreshRoot, Steps, Path, str, dict[str, Any]], None]
"""What is done in the root once the clone is there: (root, steps, logs, clone, report)."""


def make_test(
    machine: FreshRoot, steps: Steps, logs: Path, clone: str, report: dict[str, Any]
) -> None:
    """`make setup`, then `make test` (counted from pytest's summary)."""
    make(machine, steps, logs, "setup", clone)
    with contextlib.suppress(subprocess.CalledProcessError):
        make(machine, steps, logs, "test", clone)
    report |= pytest_summary(logs / "make-test.log")


SCENARIOS: Final[dict[str, Scenario]] = {
    "test": make_test,
    "run": fresh_install.run_scenario,
    "install": fresh_install.install_scenario,
}


def in_a_new_root(  # noqa: PLR0917 - the run's facts
    root: Path,
    logs: Path,
    steps: Steps,
    clone_dir: str,
    commit: str,
    scenario: Scenario,
    report: dict[str, Any],
) -> None:
    """The steps: the root, the user's packages, the pip configuration, the clone, then the
    scenario."""
    with (logs / "root.log").open("a", encoding="utf-8") as log:
        steps.run(
            "debootstrap --variant=minbase bookworm",
            logs / "root.log",
            lambda: debootstrap(root, log),
        )
    with FreshRoot(root) as machine:
        with (logs / "root.log").open("a", encoding="utf-8") as log:

            def user_packages() -> None:
                machine.run(["apt-get", "update"], log, APT_TIMEOUT)
                install = ["apt-get", "install", "-y", "--no-install-recommends"]
                machine.run([*install, *USER_PACKAGES], log, APT_TIMEOUT)
                machine.run(["apt-get", "clean"], log, APT_TIMEOUT)

            steps.run(
                f"apt-get install {' '.join(USER_PACKAGES)}", logs / "root.log", user_packages
            )
        for dropped in configure_pip(root):
            print(f"    pip setting of the host left out: {dropped}")
        bundle = ["git", "-C", str(REPO), "bundle", "create", str(root / BUNDLE.relative_to("/"))]
        subprocess.run([*bundle, "HEAD"], check=True, capture_output=True, timeout=600)
        with (logs / "clone.log").open("a", encoding="utf-8") as log:

            def clone() -> None:
                machine.run(["git", "clone", "--quiet", str(BUNDLE), clone_dir], log, 600)
                machine.run(["git", "checkout", "--quiet", "--detach", commit], log, 600, clone_dir)

            steps.run(f"git clone {commit[:12]} into {clone_dir}", logs / "clone.log", clone)
        scenario(machine, steps, logs, clone_dir, report)


def machine_facts() -> dict[str, object]:
    """What the times were measured on: the CPU, its cores, the date."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> int:
    """Build the machine, clone, set up and test; 0 when `make test` passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "fresh")
    parser.add_argument("--clone-dir", default="/tmp/voice-agent", help="inside the root")  # noqa: S108 - the new machine's
    parser.add_argument("--keep", action="store_true", help="keep the root afterwards")
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="test",
        help="test: make setup, make test (the default); run: make run's set-up and make run; "
        "install: make install, the unit's command, make uninstall (scripts/fresh_install.py)",
    )
    args = parser.parse_args()
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    status = [*git, "status", "--porcelain", "--untracked-files=no"]
    if subprocess.run(status, capture_output=True, text=True, check=True).stdout:
        print("note: uncommitted changes are not tested (the clone is of the commit)")
    logs = args.cache / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    root = args.cache / f"root-{time.strftime('%Y%m%d-%H%M%S')}"
    steps = Steps()
    started = time.monotonic()
    report: dict[str, Any] = {
        "commit": commit,
        "clone_dir": args.clone_dir,
        "scenario": args.scenario,
        "machine": machine_facts(),
    }
    try:
        in_a_new_root(root, logs, steps, args.clone_dir, commit, SCENARIOS[args.scenario], report)
    except Exception as err:  # noqa: BLE001 - whatever failed, the report says what
        report["error"] = f"{type(err).__name__}: {err}"
        print(f"FAILED: {report['error']}", file=sys.stderr)
    finally:
        total = round(time.monotonic() - started, 1)
        report |= {"times": steps.times, "total_seconds": total}
        report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        (args.cache / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        if not args.keep and root.exists():
            remove_tree(root)
    if args.scenario != "test":
        checks = report.get("checks", {})
        passed = sum(checks.values())
        print(f"{args.scenario}: {passed} of {len(checks)} checks passed; {total / 60:.1f} min")
        return 0 if checks and all(checks.values()) and "error" not in report else 1
    first = steps.times.get("make setup", 0.0) + steps.times.get("make test", 0.0)
    print(f"pytest: {report.get('summary')}")
    print(f"first make test, set-up included: {first / 60:.1f} min; whole run {total / 60:.1f} min")
    counts = report.get("counts")
    bad = ("failed", "error", "errors")
    ok = isinstance(counts, dict) and counts.get("passed", 0) > 0
    return 0 if ok and isinstance(counts, dict) and not any(counts.get(k) for k in bad) else 1


if __name__ == "__main__":
    sys.exit(main())
