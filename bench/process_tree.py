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

from harness import process_tree

_KIB: Final = 1024
_MB: Final = 1e6


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
    would count peaks that never coincide)."""

    def __init__(self, root: int, interval: float = 0.02) -> None:
        self._root = root
        self._interval = interval
        self._stop = threading.Event()
        self.peak_rss_mb = 0.0
        self.peak_pss_mb = 0.0
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
            self.peak_rss_mb = max(self.peak_rss_mb, now.rss_mb)
            self.peak_pss_mb = max(self.peak_pss_mb, now.pss_mb)
            self.most_processes = max(self.most_processes, now.processes)
            self.samples += 1
            if self._stop.wait(self._interval):
                return


def process_peak_mb(pid: int) -> float:
    """One process's own peak RSS (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * _KIB / _MB
    return 0.0
