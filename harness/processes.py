"""The agent's processes as /proc shows them: `voice-agent run` (the sounder) is the parent of the
engine, which is the parent of the media decoder child. What a test measures of "the agent"
(its memory) is the whole tree, never one pid; what it kills or watches is a named member."""

from __future__ import annotations

import contextlib
from pathlib import Path

PROC = Path("/proc")


def _parent(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the command may hold ")" and spaces


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    return [
        int(entry.name)
        for entry in PROC.iterdir()
        if entry.name.isdigit() and _parent(int(entry.name)) == pid
    ]


def process_tree(pid: int) -> list[int]:
    """`pid` and every live descendant of it (parents before their children)."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                parents.setdefault(parent, []).append(int(entry.name))
    tree, index = [pid], 0
    while index < len(tree):
        tree += parents.get(tree[index], [])
        index += 1
    return tree


def command_line(pid: int) -> list[str]:
    """The process's arguments ([] once it is gone)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (`VmRSS`, `VmHWM`); 0 once the process is gone (or
    for a zombie, which has no memory left)."""
    with contextlib.suppress(OSError):
        for line in (PROC / str(pid) / "status").read_text(encoding="ascii").splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def process_tree_rss(pid: int) -> int:
    """The resident set of `pid` and all its descendants, summed, in bytes: the agent's memory
    (the sounder, the engine, the decoder child)."""
    return sum(status_kib(member, "VmRSS") for member in process_tree(pid)) * 1024


def reset_peak_rss(pid: int) -> None:
    """Start each tree member's peak resident set (VmHWM) afresh from its resident set now
    (/proc/<pid>/clear_refs, where the kernel allows)."""
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            (PROC / str(member) / "clear_refs").write_text("5", encoding="ascii")


def process_tree_peak_rss(pid: int) -> int:
    """The peaks (VmHWM) of `pid` and its live descendants since `reset_peak_rss`, summed, in
    bytes. The sum of the peaks is at least the peak of the sum: a bound checked on it holds for
    the tree at every instant (a member that ended meanwhile is not counted)."""
    return sum(status_kib(member, "VmHWM") for member in process_tree(pid)) * 1024
