"""Reading a process's memory from /proc, and memory cgroups (v1) to hold a process to a budget.

Used by bench/memory/measure_memory.py and the workloads it starts. Sizes are MiB (written "MB" in
the reports, as bench/SOAK.md does). A phase's peak is measured by resetting the kernel's
high-water mark (`/proc/PID/clear_refs` <- 5) at its start and reading VmHWM at its end.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

KIB_PER_MIB: Final = 1024
"""/proc reports kB (KiB); the reports use MiB."""
BYTES_PER_MIB: Final = 1024 * 1024
CGROUP_ROOT: Final = Path("/sys/fs/cgroup/memory")
"""Where the cgroup v1 memory controller is mounted (platform-notes.md)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A process's memory at one moment, MiB."""

    rss: float
    """VmRSS: resident now."""
    peak: float
    """VmHWM: the most resident since the process started or since `reset_peak`."""
    pss: float
    """Pss from smaps_rollup: resident, shared pages divided among the processes sharing them."""
    anon: float
    """RssAnon: resident anonymous memory (heap, arenas, thread stacks)."""
    file: float
    """RssFile: resident file-backed pages (libraries, memory-mapped files)."""

    def as_dict(self) -> dict[str, float]:
        """Rounded to 0.1 MiB, for JSON."""
        return {key: round(value, 1) for key, value in asdict(self).items()}


def _fields(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="ascii", errors="replace").splitlines()
    return {name.strip(): value for name, _, value in (line.partition(":") for line in lines)}


def _mib(value: str) -> float:
    return int(value.split(maxsplit=1)[0]) / KIB_PER_MIB


def usage(pid: int | str = "self") -> Usage:
    """The memory of a process (`self` for this one)."""
    status = _fields(Path(f"/proc/{pid}/status"))
    rollup = _fields(Path(f"/proc/{pid}/smaps_rollup"))
    return Usage(
        rss=_mib(status["VmRSS"]),
        peak=_mib(status["VmHWM"]),
        pss=_mib(rollup["Pss"]),
        anon=_mib(status["RssAnon"]),
        file=_mib(status["RssFile"]),
    )


def reset_peak(pid: int | str = "self") -> None:
    """Reset VmHWM to the current RSS, so the next reading is the peak of what follows."""
    Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")


def threads(pid: int | str = "self") -> int:
    """The process's thread count."""
    return int(_fields(Path(f"/proc/{pid}/status"))["Threads"])


_LIBC: ctypes.CDLL | None = None


def malloc_trim() -> int:
    """glibc's `malloc_trim(0)`: give the free memory of every malloc arena back to the kernel;
    1 when some was released."""
    global _LIBC  # noqa: PLW0603 - one handle per process
    if _LIBC is None:
        _LIBC = ctypes.CDLL("libc.so.6")
    return int(_LIBC.malloc_trim(0))


def own_cgroup() -> Path:
    """This process's memory cgroup directory (new groups go under it, so whatever started this
    process still accounts for everything in them)."""
    for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / path.lstrip("/")
    raise RuntimeError("no cgroup v1 memory controller for this process")


class MemoryCgroup:
    """A cgroup v1 memory group with a limit, under this process's own group: what processes
    in it allocate is charged to it, and they are OOM-killed when it cannot reclaim enough.
    Needs root. Charges do not move with a process on this kernel (move_charge_at_immigrate
    is refused), so a process must be in the group before it allocates: `spawn_inside`."""

    def __init__(self, name: str, limit_mb: float) -> None:
        self.parent = own_cgroup()
        self.path = self.parent / name
        self.path.mkdir()
        self._write("memory.limit_in_bytes", str(int(limit_mb * BYTES_PER_MIB)))
        self.limit_mb = limit_mb

    @contextlib.contextmanager
    def spawn_inside(self) -> Iterator[None]:
        """Within the block this process is in the group, so the children it starts are born
        in it; then it returns to its own group (the few pages it touched meanwhile stay
        charged here)."""
        self._write("cgroup.procs", str(os.getpid()))
        try:
            yield
        finally:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()), encoding="ascii")

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value, encoding="ascii")

    def _read(self, name: str) -> str:
        return (self.path / name).read_text(encoding="ascii")

    def reset_max(self) -> None:
        """Restart the peak (`memory.max_usage_in_bytes`) from the current usage."""
        self._write("memory.max_usage_in_bytes", "0")

    @property
    def usage_mb(self) -> float:
        """Memory charged now (anonymous and page cache), MiB."""
        return int(self._read("memory.usage_in_bytes")) / BYTES_PER_MIB

    @property
    def max_usage_mb(self) -> float:
        """The most ever charged since creation or `reset_max`, MiB."""
        return int(self._read("memory.max_usage_in_bytes")) / BYTES_PER_MIB

    @property
    def failcnt(self) -> int:
        """How often a charge hit the limit (each time the kernel had to reclaim)."""
        return int(self._read("memory.failcnt"))

    @property
    def oom_kills(self) -> int:
        """Processes the group's OOM killer has killed."""
        return int(_fields_space(self._read("memory.oom_control")).get("oom_kill", "0"))

    def stat(self) -> dict[str, float]:
        """`rss` (anonymous), `cache` (page cache) and `mapped_file`, MiB."""
        values = _fields_space(self._read("memory.stat"))
        return {
            key: round(int(values.get(key, "0")) / BYTES_PER_MIB, 1)
            for key in ("rss", "cache", "mapped_file")
        }

    def pids(self) -> list[int]:
        """The processes in the group."""
        return [int(p) for p in self._read("cgroup.procs").split()]

    def close(self) -> None:
        """Remove the group once its processes have exited (waits up to 10 s)."""
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _fields_space(text: str) -> dict[str, str]:
    pairs = (line.split(maxsplit=1) for line in text.splitlines() if line.strip())
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def is_root() -> bool:
    """Whether this process may create cgroups and write other processes' clear_refs."""
    return os.geteuid() == 0
