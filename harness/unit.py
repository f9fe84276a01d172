"""The shipped systemd unit, run the way systemd would run it where this machine can emulate it
(no systemd runs as PID 1 here).

`sandbox_command` builds a bubblewrap command for the unit's mount namespace (ProtectSystem=
strict, ProtectHome, PrivateTmp, a /dev of pseudo devices and ALSA's, ProtectKernelTunables,
ProtectKernelLogs, ProtectHostname), whose program is this module's `exec` step: in the process,
as systemd's exec does last, the user and groups, an empty capability bounding set,
no_new_privs, the UMask, and the seccomp filters the unit's settings make (SystemCallFilter=,
SystemCallArchitectures=, SystemCallErrorNumber=, RestrictAddressFamilies=,
MemoryDenyWriteExecute=, LockPersonality=, RestrictNamespaces=, RestrictRealtime=,
RestrictSUIDSGID=, ProtectClock=, ProtectKernelModules=, ProtectKernelLogs=), built with
libseccomp as systemd builds them; then it executes the program. The system-call groups are
systemd's own (`systemd-analyze syscall-filter`).

Not emulated: the cgroup device policy (the sandbox's /dev has no other device to refuse),
ProtectProc= (bubblewrap mounts /proc without hidepid), RemoveIPC= (at stop).

    python -m harness.unit exec UNIT_FILE -- PROGRAM ARGS...
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import grp
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

Settings = Mapping[str, Sequence[str]]
"""A unit's [Service] settings: each key's values, in order (a key may repeat)."""

_ACT_ALLOW: Final = 0x7FFF0000
_ACT_KILL_PROCESS: Final = 0x80000000
_CMP_NE, _CMP_LT, _CMP_EQ, _CMP_GT, _CMP_MASKED_EQ = 1, 2, 4, 6, 7
_PROT_WRITE, _PROT_EXEC = 0x2, 0x4
_SHM_EXEC: Final = 0o100000
_S_ISUID, _S_ISGID = 0o4000, 0o2000
_PER_LINUX: Final = 0
_NAMESPACE_FLAGS: Final = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
_SCHED_FIFO, _SCHED_RR, _SCHED_DEADLINE = 1, 2, 6
_AF_MAX: Final = 46
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 24, 38
_ADDRESS_FAMILIES: Final = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}


def unit_settings(unit: Path) -> dict[str, list[str]]:
    """The [Service] settings of a unit file (comments and other sections left out)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in unit.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _yes(settings: Settings, key: str) -> bool:
    values = settings.get(key, [])
    return bool(values) and values[-1].lower() in {"1", "yes", "true", "on"}


def syscall_group(name: str) -> set[str]:
    """The system calls of a systemd group (`@system-service`), nested groups expanded, or the
    one call named."""
    if not name.startswith("@"):
        return {name}
    listing = subprocess.run(
        ["systemd-analyze", "syscall-filter", name],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    calls: set[str] = set()
    for line in listing.splitlines()[1:]:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        calls |= syscall_group(entry) if entry.startswith("@") else {entry}
    return calls


def allowed_syscalls(settings: Settings) -> set[str] | None:
    """The allow list the unit's SystemCallFilter= lines make, in order as systemd reads them
    (a `~` line removes, a later plain line adds back); None without an allow list."""
    lines = settings.get("SystemCallFilter", [])
    if not lines or lines[0].startswith("~"):
        return None
    allowed: set[str] = set()
    for line in lines:
        invert = line.startswith("~")
        names = set().union(*(syscall_group(n) for n in line.removeprefix("~").split()))
        allowed = allowed - names if invert else allowed | names
    return allowed


class _Compare(ctypes.Structure):
    """libseccomp's `struct scmp_arg_cmp`."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)


class _Filter:
    """One seccomp program, built with libseccomp (native architecture only)."""

    def __init__(self, library: ctypes.CDLL, default: int) -> None:
        self._lib = library
        library.seccomp_init.restype = ctypes.c_void_p
        library.seccomp_init.argtypes = [ctypes.c_uint32]
        library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        library.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_Compare),
        ]
        library.seccomp_load.argtypes = [ctypes.c_void_p]
        library.seccomp_release.argtypes = [ctypes.c_void_p]
        self._context = library.seccomp_init(default)
        if not self._context:
            raise OSError("seccomp_init failed")

    def rule(self, action: int, name: str, *compares: tuple[int, int, int, int]) -> None:
        """Add a rule for a system call of this architecture (others are skipped, as systemd
        skips them)."""
        number = self._lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:
            return
        array = (_Compare * max(1, len(compares)))(*(_Compare(*c) for c in compares))
        done = self._lib.seccomp_rule_add_array(self._context, action, number, len(compares), array)
        if done < 0:
            raise OSError(-done, f"seccomp rule for {name}: {os.strerror(-done)}")

    def load(self) -> None:
        """Install it in this process (kept across execve, inherited by children)."""
        done = self._lib.seccomp_load(self._context)
        self._lib.seccomp_release(self._context)
        if done < 0:
            raise OSError(-done, f"seccomp_load: {os.strerror(-done)}")


def _libseccomp() -> ctypes.CDLL:
    path = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    return ctypes.CDLL(path, use_errno=True)


def seccomp_filters(settings: Settings) -> list[_Filter]:
    """The seccomp programs systemd would install for these settings, one per setting (the
    allow list last: loading the others needs seccomp(), which it may refuse)."""
    library = _libseccomp()
    filters: list[_Filter] = []
    for key, build in (
        ("ProtectClock", _deny_group("@clock")),
        ("ProtectKernelModules", _deny_group("@module")),
        ("PrivateDevices", _deny_group("@raw-io")),
        ("ProtectKernelLogs", _deny_group("syslog")),
        ("MemoryDenyWriteExecute", _memory_deny_write_execute),
        ("LockPersonality", _lock_personality),
        ("RestrictNamespaces", _restrict_namespaces),
        ("RestrictRealtime", _restrict_realtime),
        ("RestrictSUIDSGID", _restrict_suid_sgid),
    ):
        if _yes(settings, key):
            filters.append(_Filter(library, _ACT_ALLOW))
            build(filters[-1])
    families = settings.get("RestrictAddressFamilies", [])
    if families and not families[0].startswith("~"):
        listed = {_ADDRESS_FAMILIES[name] for line in families for name in line.split()}
        filters.append(_Filter(library, _ACT_ALLOW))
        refused = _errno_action(errno.EAFNOSUPPORT)
        for family in range(_AF_MAX):
            if family not in listed:
                filters[-1].rule(refused, "socket", (0, _CMP_EQ, family, 0))
        filters[-1].rule(refused, "socket", (0, _CMP_GT, _AF_MAX - 1, 0))
    allowed = allowed_syscalls(settings)
    if allowed is not None:
        error = settings.get("SystemCallErrorNumber", [""])[-1]
        default = _errno_action(getattr(errno, error)) if error else _ACT_KILL_PROCESS
        filters.append(_Filter(library, default))
        for name in sorted(allowed):
            filters[-1].rule(_ACT_ALLOW, name)
    return filters


_EPERM: Final = _errno_action(errno.EPERM)


def _deny_group(group: str) -> Callable[[_Filter], None]:
    def build(denied: _Filter) -> None:
        for name in sorted(syscall_group(group)):
            denied.rule(_EPERM, name)

    return build


def _memory_deny_write_execute(memory: _Filter) -> None:
    both = _PROT_WRITE | _PROT_EXEC
    memory.rule(_EPERM, "mmap", (2, _CMP_MASKED_EQ, both, both))
    for name in ("mprotect", "pkey_mprotect"):
        memory.rule(_EPERM, name, (2, _CMP_MASKED_EQ, _PROT_EXEC, _PROT_EXEC))
    memory.rule(_EPERM, "shmat", (2, _CMP_MASKED_EQ, _SHM_EXEC, _SHM_EXEC))


def _lock_personality(personality: _Filter) -> None:
    personality.rule(_EPERM, "personality", (0, _CMP_NE, _PER_LINUX, 0))  # as systemd does


def _restrict_namespaces(namespaces: _Filter) -> None:
    namespaces.rule(_EPERM, "setns")
    namespaces.rule(_errno_action(errno.ENOSYS), "clone3")  # glibc then falls back to clone
    for flag in _NAMESPACE_FLAGS:
        for name in ("clone", "unshare"):
            namespaces.rule(_EPERM, name, (0, _CMP_MASKED_EQ, flag, flag))


def _restrict_realtime(realtime: _Filter) -> None:
    for policy in (_SCHED_FIFO, _SCHED_RR, _SCHED_DEADLINE):
        realtime.rule(_EPERM, "sched_setscheduler", (1, _CMP_EQ, policy, 0))


def _restrict_suid_sgid(modes: _Filter) -> None:
    for bit in (_S_ISUID, _S_ISGID):
        modes.rule(_EPERM, "chmod", (1, _CMP_MASKED_EQ, bit, bit))
        modes.rule(_EPERM, "fchmod", (1, _CMP_MASKED_EQ, bit, bit))
        modes.rule(_EPERM, "fchmodat", (2, _CMP_MASKED_EQ, bit, bit))


def _drop_privileges(settings: Settings, uid: int, gid: int) -> None:
    """The user, its groups and the bounding set (systemd: User=, Group=,
    SupplementaryGroups=, CapabilityBoundingSet=), then no_new_privs (NoNewPrivileges=)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if "CapabilityBoundingSet" in settings and not settings["CapabilityBoundingSet"][-1]:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text(encoding="ascii"))
        for capability in range(last + 1):
            if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and os.geteuid() == 0:
                raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {capability}")
    if os.geteuid() == 0:
        groups = [
            grp.getgrnam(g).gr_gid for g in settings.get("SupplementaryGroups", [""])[-1].split()
        ]
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # the effective and permitted capabilities go with root
    if _yes(settings, "NoNewPrivileges") and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")


def sandbox_command(
    unit: Path,
    program: Sequence[str],
    *,
    writable: Iterable[Path],
    readable: Iterable[Path] = (),
    uid: int | None = None,
    gid: int | None = None,
) -> list[str]:
    """bubblewrap running `program` as the unit would: its mount namespace, then the `exec`
    step. `writable` are the unit's StateDirectory and CacheDirectory (bound read-write);
    `readable` what the install holds (the checkout, the interpreter), bound read-only, also
    where ProtectHome or PrivateTmp would hide them. uid/gid: the unit's user when run as root
    (default: the caller's)."""
    settings = unit_settings(unit)
    command = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--ro-bind", "/", "/"]
    command += ["--dev", "/dev", "--proc", "/proc", "--unshare-ipc"]
    if Path("/dev/snd").is_dir():  # DeviceAllow=char-alsa: the only physical devices
        command += ["--dev-bind", "/dev/snd", "/dev/snd"]
    if _yes(settings, "ProtectKernelTunables"):
        command += ["--ro-bind", "/proc/sys", "/proc/sys"]
    if _yes(settings, "ProtectHostname"):
        command += ["--unshare-uts"]
    if _yes(settings, "ProtectHome"):
        for home in ("/home", "/root", "/run/user"):
            if Path(home).is_dir():
                command += ["--tmpfs", home]
    if _yes(settings, "PrivateTmp"):
        command += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/var/tmp"]
    readable, writable = list(readable), list(writable)
    parents = {a for p in (*readable, *writable) for a in p.parents if a != Path("/")}
    for parent in sorted(parents, key=lambda a: len(a.parts)):  # bwrap would make them 0700
        command += ["--perms", "0755", "--dir", str(parent)]
    for path in readable:
        command += ["--ro-bind", str(path), str(path)]
    for path in writable:
        command += ["--bind", str(path), str(path)]
    me = [str(os.getuid() if uid is None else uid), str(os.getgid() if gid is None else gid)]
    command += [sys.executable, "-m", "harness.unit", "exec", str(unit), *me, "--", *program]
    return command


def _exec(arguments: Sequence[str]) -> None:
    unit, uid, gid, separator, *program = arguments
    if separator != "--" or not program:
        raise SystemExit("usage: python -m harness.unit exec UNIT UID GID -- PROGRAM ARGS...")
    settings = unit_settings(Path(unit))
    filters = seccomp_filters(settings)  # built before: building runs systemd-analyze
    os.umask(int(settings.get("UMask", ["0022"])[-1], 8))
    if "Nice" in settings:  # set by systemd as root, before the user is taken
        os.setpriority(os.PRIO_PROCESS, 0, int(settings["Nice"][-1]))
    _drop_privileges(settings, int(uid), int(gid))
    for made in filters:
        made.load()
    os.execvp(program[0], program)  # noqa: S606 - the unit's program, as systemd runs it


if __name__ == "__main__":
    if sys.argv[1:2] != ["exec"]:
        raise SystemExit(__doc__)
    _exec(sys.argv[2:])
