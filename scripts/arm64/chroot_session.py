"""Commands inside the arm64 root: the mounts they need (undone on exit, even on failure), an
aarch64-looking /proc/cpuinfo, and a clean environment with QEMU_CPU set.

The kernel runs the root's aarch64 programs through qemu-aarch64-static (binfmt_misc), which reads
QEMU_CPU from each program's environment. The environment is built from nothing (as `env -i`
would): the host's PIP_* and other variables name host-only paths.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from types import TracebackType
from typing import IO, Final

QEMU_CPU: Final = "cortex-a76"
"""The CPU QEMU emulates: the Raspberry Pi 5's core (ARMv8.2-A with dot product)."""
ROOT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside the root."""
UMOUNT_TIMEOUT: Final = 60.0
"""Longest wait for one unmount (seconds)."""

_CORTEX_A76: Final = (
    "BogoMIPS\t: 108.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
    "lrcpc dcpop asimddp\n"
    "CPU implementer\t: 0x41\n"
    "CPU architecture: 8\n"
    "CPU variant\t: 0x4\n"
    "CPU part\t: 0xd0b\n"
    "CPU revision\t: 1\n"
)
"""One core's /proc/cpuinfo block on a Raspberry Pi 5 (Cortex-A76), after its `processor` line."""

Arg = str | PurePath
"""A command-line argument; paths inside the root are PurePosixPath."""


def cortex_a76_cpuinfo(cores: int) -> str:
    """An aarch64 /proc/cpuinfo with one Cortex-A76 block per core.

    onnxruntime parses /proc/cpuinfo at import (cpuinfo library); under emulation it would read
    the host's x86 file and crash (SIGSEGV, measured), so this one is bind-mounted over it.
    """
    return "\n".join(f"processor\t: {core}\n{_CORTEX_A76}" for core in range(cores))


def root_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every command in the root: nothing of the host's but what is needed."""
    env = {
        "PATH": ROOT_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "QEMU_CPU": QEMU_CPU,
        "DEBIAN_FRONTEND": "noninteractive",
    }
    env.update(extra or {})
    return env


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below path, deepest first."""
    listing = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], check=True, capture_output=True, text=True
    ).stdout
    # findmnt escapes blanks in paths as \x20; paths here have none.
    targets = [Path(line) for line in listing.splitlines() if line]
    below = [t for t in targets if t == path or path in t.parents]
    return sorted(below, key=lambda t: len(t.parts), reverse=True)


def unmount_all(path: Path) -> None:
    """Unmount everything at or below path (lazily when busy); raise if anything stays."""
    for target in mounts_under(path):
        umount = ["umount", str(target)]
        done = subprocess.run(umount, check=False, capture_output=True, timeout=UMOUNT_TIMEOUT)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=False, timeout=UMOUNT_TIMEOUT)
    left = mounts_under(path)
    if left:
        raise RuntimeError(f"still mounted under {path}: {', '.join(map(str, left))}")


def remove_tree(path: Path) -> None:
    """Delete a root folder safely: unmount what is under it first, never cross a mount."""
    if not path.exists():
        return
    unmount_all(path)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


class Chroot:
    """The root with /proc (and the fake cpuinfo), /sys and /dev mounted while in a `with`."""

    def __init__(self, root: Path, cpuinfo: Path) -> None:
        self.root = root
        self._cpuinfo = cpuinfo
        self._chroot = shutil.which("chroot") or "/usr/sbin/chroot"

    def __enter__(self) -> Chroot:
        self._cpuinfo.write_text(cortex_a76_cpuinfo(os.cpu_count() or 1), encoding="ascii")
        try:
            self._mount(["-t", "proc", "proc"], "proc")
            self._mount(["--bind", str(self._cpuinfo)], "proc/cpuinfo")
            self._mount(["--bind", "/sys"], "sys")
            self._mount(["--bind", "/dev"], "dev")
            self._mount(["-t", "tmpfs", "-o", "mode=1777", "tmpfs"], "dev/shm")
            self._copy_resolv_conf()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Unmount everything under the root, deepest first."""
        unmount_all(self.root)

    def _mount(self, args: Sequence[str], inside: str) -> None:
        target = self.root / inside
        if inside == "dev/shm":
            target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", *args, str(target)], check=True, timeout=UMOUNT_TIMEOUT)

    def _copy_resolv_conf(self) -> None:
        target = self.root / "etc/resolv.conf"
        if target.is_symlink():
            target.unlink()
        shutil.copyfile("/etc/resolv.conf", target)

    def path(self, inside: Arg) -> Path:
        """The host path of a path inside the root."""
        return self.root / Path(inside).relative_to("/")

    def command(self, args: Sequence[Arg]) -> list[str]:
        """The host command that runs args inside the root."""
        return [self._chroot, str(self.root), *map(str, args)]

    def run(
        self,
        args: Sequence[Arg],
        log: IO[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run inside the root, output appended to log; raise on failure or timeout."""
        log.write(f"\n$ {' '.join(map(str, args))}\n")
        log.flush()
        return subprocess.run(
            self.command(args),
            env=root_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=True,
        )

    def output(self, args: Sequence[Arg], timeout: float) -> str:
        """Run inside the root and return its standard output; raise on failure or timeout."""
        return subprocess.run(
            self.command(args),
            env=root_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout

    def popen(
        self, args: Sequence[Arg], log: IO[bytes], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start inside the root in the background, output to log. `chroot` execs the program,
        so the process (qemu running it) is the one signals reach."""
        return subprocess.Popen(
            self.command(args),
            env=root_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@contextlib.contextmanager
def stopped_on_exit(processes: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """Kill whatever of processes still runs when the block ends (before the unmounts)."""
    try:
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(UMOUNT_TIMEOUT)
