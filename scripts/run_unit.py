"""Run a systemd unit's command the way systemd starts it, where no systemd runs (a container,
a chroot): `sudo python3 scripts/run_unit.py /etc/systemd/system/voice-agent.service`.

From the unit's [Service] section: the user (`User=`), its groups (`Group=`,
`SupplementaryGroups=`), `WorkingDirectory=`, `UMask=`, `Environment=`, and the directories of
`StateDirectory=` and `CacheDirectory=` (made under /var/lib and /var/cache with their modes,
owned by the user, and named in $STATE_DIRECTORY and $CACHE_DIRECTORY), with the environment
systemd gives a service (PATH, LANG, HOME, USER, LOGNAME, SHELL of the user) and nothing else of
the caller's; then `ExecStart=` replaces this process. `--env NAME=VALUE` adds a variable (a
deployment value: `VOICE_AGENT_MQTT_HOST=...`).

Not applied: the sandbox (ProtectSystem=, the system-call filters and the rest: harness/unit.py
emulates those for the tests), the notify socket and watchdog, restarts. Standard library only:
it runs on the system's python3.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import shlex
import sys
from pathlib import Path

SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The PATH systemd gives a service."""


def service_settings(unit: Path) -> dict[str, list[str]]:
    """The [Service] settings of a unit file, each key's values in order."""
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


def last(settings: dict[str, list[str]], key: str, default: str = "") -> str:
    """The value that counts (the last one given)."""
    return settings.get(key, [default])[-1]


def environment(settings: dict[str, list[str]], extra: list[str]) -> dict[str, str]:
    """What systemd puts in the service's environment (for the settings this unit uses)."""
    user = pwd.getpwnam(last(settings, "User", "root"))
    env = {
        "PATH": SERVICE_PATH,
        "LANG": "C.UTF-8",
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": user.pw_shell,
    }
    for value in settings.get("Environment", []):
        for assignment in shlex.split(value):
            name, _, setting = assignment.partition("=")
            env[name] = setting
    for kind, base in (("State", "/var/lib"), ("Cache", "/var/cache")):
        names = last(settings, f"{kind}Directory").split()
        if names:
            env[f"{kind.upper()}_DIRECTORY"] = ":".join(f"{base}/{name}" for name in names)
    for assignment in extra:
        name, _, setting = assignment.partition("=")
        env[name] = setting
    return env


def make_directories(settings: dict[str, list[str]], uid: int, gid: int) -> None:
    """StateDirectory= and CacheDirectory= as systemd makes them: the user's, in their mode."""
    for kind, base in (("State", "/var/lib"), ("Cache", "/var/cache")):
        mode = int(last(settings, f"{kind}DirectoryMode", "0755"), 8)
        for name in last(settings, f"{kind}Directory").split():
            path = Path(base) / name
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            os.chown(path, uid, gid)
            path.chmod(mode)


def main() -> int:
    """Become the unit's user and run its ExecStart (does not return on success)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("unit", type=Path)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    settings = service_settings(args.unit)
    user = pwd.getpwnam(last(settings, "User", "root"))
    group = grp.getgrnam(last(settings, "Group", grp.getgrgid(user.pw_gid).gr_name))
    groups = [group.gr_gid]
    for name in " ".join(settings.get("SupplementaryGroups", [])).split():
        groups.append(grp.getgrnam(name).gr_gid)
    env = environment(settings, args.env)
    make_directories(settings, user.pw_uid, group.gr_gid)
    command = shlex.split(last(settings, "ExecStart").lstrip("-@:+!"))
    os.chdir(last(settings, "WorkingDirectory", user.pw_dir).lstrip("-") or "/")
    os.umask(int(last(settings, "UMask", "0022"), 8))
    os.setgroups(groups)
    os.setgid(group.gr_gid)
    os.setuid(user.pw_uid)
    sys.stdout.flush()
    os.execve(command[0], command, env)  # noqa: S606 - the unit's own command line
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
