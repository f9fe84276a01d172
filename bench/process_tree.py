"""A process and all its descendants, read from /proc: CPU time and memory of the whole tree.

The node is more than one process (the agent, its media decoder child, and whatever else it
starts), so every figure of the node counts all of them: the tree is found again at each
reading (children that start later are counted, those that ended drop out).

CPU time is the sum over every thread of every process of the kernel's run time in
nanoseconds (`/proc/PID/task/TID/schedstat`), so short requests are measured to the
microsecond rather than in 10 ms clock ticks; the time of threads and processes that ended
between two readings is not in it (the node's threads live as long as it does).
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from harness import process_tree

_KIB: Final = 1024
_MB: Final = 1e6
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_PRESENT: Final = np.uint64(1 << 63)
_PFN_MASK: Final = np.uint64((1 << 55) - 1)


def descendants(root: int) -> list[int]:
    """`root` and every process below it (those alive now)."""
    return process_tree(root)


def cpu_seconds(root: int) -> float:
    """CPU seconds used so far by the live threads of `root` and its descendants."""
    total = 0
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int(Path(task.path, "schedstat").read_text().split()[0])
    return total / 1e9


@dataclass(frozen=True, slots=True)
class TreeMemory:
    """The tree's memory at one moment, MB: resident (each process's RSS added: shared pages
    counted once per process), proportional (Pss added: shared pages divided among their
    users, so the tree's own share), and how many processes."""

    rss_mb: float
    pss_mb: float
    processes: int


def resident_pages(pid: int) -> np.ndarray | None:
    """The physical page frames `pid` has resident now (/proc/PID/pagemap), or None where the
    kernel hides frame numbers (not root) or the process is gone. A page shared by several
    processes has one frame number, so the union over a tree counts it once."""
    parts: list[np.ndarray] = []
    try:
        maps = Path(f"/proc/{pid}/maps").read_text(encoding="utf-8", errors="replace")
        with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
            for line in maps.splitlines():
                start, _, end = line.split(maxsplit=1)[0].partition("-")
                if line.rstrip().endswith("[vsyscall]"):
                    continue
                first, last = int(start, 16) // _PAGE, int(end, 16) // _PAGE
                raw = os.pread(pagemap.fileno(), (last - first) * 8, first * 8)
                entries = np.frombuffer(raw, dtype="<u8")
                parts.append(entries[(entries & _PRESENT) != 0] & _PFN_MASK)
    except OSError:
        return None
    frames = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype="<u8")
    if len(frames) and not frames.any():
        return None  # frame numbers zeroed: not allowed to see them
    return frames


def unique_mb(root: int) -> float | None:
    """The tree's resident memory with every physical page counted once (the union of the
    frames of `root` and its descendants): what the node's processes hold together, pages
    shared among them once, pages shared with processes outside the node in full. For one
    process it is its RSS. None where frame numbers are hidden (not root)."""
    found: list[np.ndarray] = []
    for pid in descendants(root):
        frames = resident_pages(pid)
        if frames is None:
            if Path(f"/proc/{pid}").exists():
                return None
            continue
        found.append(frames)
    return len(np.unique(np.concatenate(found))) * _PAGE / _MB if found else 0.0


def memory(root: int) -> TreeMemory:
    """RSS and Pss of `root` and its descendants now."""
    rss = pss = 0
    pids = descendants(root)
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "Rss":
                    rss += int(value.split()[0])
                elif key == "Pss":
                    pss += int(value.split()[0])
    return TreeMemory(rss * _KIB / _MB, pss * _KIB / _MB, len(pids))


class PeakSampler:
    """Samples the tree's memory every `interval` seconds on a thread of its own until
    stopped; the peaks of the sums (the tree's own peak: not each process's peak added, which
    would count peaks that never coincide), and of the union of its pages (`unique_mb`, the
    gate: docs/memory.md, "Which figure")."""

    def __init__(self, root: int, interval: float = 0.02) -> None:
        self._root = root
        self._interval = interval
        self._stop = threading.Event()
        self.peak_rss_mb = 0.0
        self.peak_pss_mb = 0.0
        self.peak_unique_mb: float | None = 0.0
        """None where frame numbers are hidden (not root)."""
        self.most_processes = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            now = memory(self._root)
            unique = unique_mb(self._root)
            self.peak_rss_mb = max(self.peak_rss_mb, now.rss_mb)
            self.peak_pss_mb = max(self.peak_pss_mb, now.pss_mb)
            if unique is None or self.peak_unique_mb is None:
                self.peak_unique_mb = None
            else:
                self.peak_unique_mb = max(self.peak_unique_mb, unique)
            self.most_processes = max(self.most_processes, now.processes)
            self.samples += 1
            if self._stop.wait(self._interval):
                return


def together_mb(root: int) -> float:
    """The memory the tree's processes hold together now: the union of their pages
    (`unique_mb`), or where frame numbers are hidden, their RSS added (an upper bound)."""
    unique = unique_mb(root)
    return memory(root).rss_mb if unique is None else unique


def process_peak_mb(pid: int) -> float:
    """One process's own peak RSS (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * _KIB / _MB
    return 0.0
