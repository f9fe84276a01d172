"""Memory budgets held by the kernel: a cgroup v1 memory group with a limit, processes started
inside it, and what the kernel counted (peak, limit hits, OOM kills).

The group is made under this process's own memory group, so whatever accounts for the caller
also accounts for everything in it. Needs root and the v1 memory controller (mounted at
`/sys/fs/cgroup/memory` on the project's machines, `platform-notes.md`); without them
`MemoryCgroup` raises `CgroupError`: a budget that cannot be held must not pass as held.
Charges stay where a page was first touched (they do not follow a process that moves), so a
process joins before it allocates: `spawn_inside`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MEMORY_ROOT: Final = Path("/sys/fs/cgroup/memory")
"""Where the cgroup v1 memory controller is mounted."""
MIB: Final = 2**20
"""Bytes per MiB."""
DRAIN_SECONDS: Final = 10.0
"""How long `close` waits for the group's processes to exit before moving them out (seconds)."""


class CgroupError(RuntimeError):
    """No cgroup v1 memory controller, or no right to make a group: no budget can be held."""


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """What the kernel counted for a group, in bytes where not said otherwise."""

    usage: int
    """Charged now: anonymous memory and page cache (file pages the group read or wrote)."""
    max_usage: int
    """The most ever charged, since the group was made or `reset_peak`."""
    failcnt: int
    """Charges that hit the limit (each made the kernel reclaim; count)."""
    oom_kills: int | None
    """Processes of the group its OOM killer killed (count); None where the kernel does not
    count them (before Linux 4.13)."""
    rss: int
    """Anonymous memory (heap, stacks, arenas): what cannot be dropped without swap."""
    cache: int
    """Page cache charged to the group (reclaimable unless mapped and in use)."""
    mapped_file: int
    """Page cache mapped into the group's processes (libraries, memory-mapped weights)."""
    swap: int
    """Swapped out (0: the group's swappiness is 0)."""


def own_memory_group() -> Path:
    """This process's cgroup v1 memory group directory; CgroupError on a machine without one
    (a cgroup v2-only machine has no `memory.limit_in_bytes`)."""
    if not (MEMORY_ROOT / "memory.limit_in_bytes").is_file():
        mounts = [
            f"{fields[1]} ({fields[2]})"
            for fields in map(str.split, Path("/proc/mounts").read_text("utf-8").splitlines())
            if fields[2] in ("cgroup", "cgroup2")
        ]
        raise CgroupError(
            f"no cgroup v1 memory controller at {MEMORY_ROOT} (cgroup mounts here: "
            f"{', '.join(mounts) or 'none'}); memory budgets need it (the project's CI "
            "machines have it)"
        )
    for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return MEMORY_ROOT / path.lstrip("/")
    raise CgroupError("this process is in no cgroup v1 memory group (/proc/self/cgroup)")


class MemoryCgroup:
    """A memory group with a limit and swappiness 0: processes in it that need more than the
    limit after the kernel reclaimed their page cache are OOM-killed. A context manager: leaving
    it removes the group (`close`)."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        """Make the group `name` under this process's own and set its limit."""
        if os.geteuid() != 0:
            raise CgroupError("making a memory cgroup needs root")
        self.parent = own_memory_group()
        self.path = self.parent / name
        self.limit_bytes = limit_bytes
        self.path.mkdir()
        try:
            self._write("memory.limit_in_bytes", limit_bytes)
            # No swap for the group's pages. Not by a memory+swap limit equal to this one: that
            # counter is charged first and counts no failures, so `failcnt` would stay 0.
            self._write("memory.swappiness", 0)
        except BaseException:
            self.path.rmdir()
            raise

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def spawn_inside(self) -> Iterator[None]:
        """Within the block this process is in the group, so the processes it starts are born
        in it (and their children after them); then it returns to its own group. Keep the
        block to the start of a process: what this process touches meanwhile is charged here."""
        self.join(os.getpid())
        try:
            yield
        finally:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()), encoding="ascii")

    def join(self, pid: int) -> None:
        """Move a process (all its threads) into the group; what it already allocated stays
        charged where it was."""
        self._write("cgroup.procs", pid)

    def pids(self) -> list[int]:
        """The processes in the group now."""
        return [int(pid) for pid in self._read("cgroup.procs").split()]

    def reset_peak(self) -> None:
        """Start `max_usage` again from the current usage (a peak per phase)."""
        self._write("memory.max_usage_in_bytes", 0)

    def read(self) -> MemoryReading:
        """The group's counters now."""
        stat = _fields(self._read("memory.stat"))
        oom = _fields(self._read("memory.oom_control"))
        return MemoryReading(
            usage=int(self._read("memory.usage_in_bytes")),
            max_usage=int(self._read("memory.max_usage_in_bytes")),
            failcnt=int(self._read("memory.failcnt")),
            oom_kills=int(oom["oom_kill"]) if "oom_kill" in oom else None,
            rss=int(stat.get("rss", "0")),
            cache=int(stat.get("cache", "0")),
            mapped_file=int(stat.get("mapped_file", "0")),
            swap=int(stat.get("swap", "0")),
        )

    def close(self) -> None:
        """Remove the group: wait a little for its processes to exit, move any left to the
        parent group, then remove it (its remaining charges go to the parent)."""
        if not self.path.is_dir():
            return
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                (self.parent / "cgroup.procs").write_text(str(pid), encoding="ascii")
        self.path.rmdir()

    def _write(self, name: str, value: int) -> None:
        (self.path / name).write_text(str(value), encoding="ascii")

    def _read(self, name: str) -> str:
        return (self.path / name).read_text(encoding="ascii")


def drop_page_cache(path: Path) -> None:
    """Drop a file's clean pages from the page cache, so that the next group to read it is
    charged for them, as on a device where nothing else has read it (pages some process still
    maps stay, charged where they are)."""
    with path.open("rb") as file:
        os.fsync(file.fileno())  # dirty pages are not dropped
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _fields(text: str) -> dict[str, str]:
    """`key value` lines (memory.stat, memory.oom_control) as a dict."""
    pairs = (line.split(maxsplit=1) for line in text.splitlines() if line.strip())
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}
