"""The one list of system packages (scripts/system-packages.txt): the installers read it (set-up
for `make run` and the tests, `sudo make install`, CI), the README names what it holds where it
says who installs it, `make run` installs what running needs and `make test` the rest, and
every program the tests start comes from it."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from harness import ROOT

LIST = ROOT / "scripts" / "system-packages.txt"
KINDS = {"run", "test", "python", "install"}
PROGRAMS = {
    "make": "the Makefile",
    "mosquitto": "harness/broker.py",
    "mosquitto_passwd": "harness/broker.py",
    "mosquitto_pub": "harness/mqtt.py",
    "openssl": "harness/broker.py (make_pki)",
    "pulseaudio": "harness/audio.py",
    "pactl": "harness/audio.py",
    "aplay": "harness/audio.py",
    "gcc": "pyalsaaudio's build",
    "bwrap": "harness/unit.py",
    "systemd-analyze": "harness/unit.py, tests/test_systemd.py",
}
"""The programs `make test` starts, and who starts them."""


def listed() -> dict[str, set[str]]:
    """package -> what needs it (run, test, python, install), from the list."""
    packages = {}
    for line in LIST.read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            assert len(fields) == 2, line
            kinds = set(fields[1].split(","))
            assert kinds <= KINDS, line
            packages[fields[0]] = kinds
    return packages


def install_lines(script: str) -> list[str]:
    """The `apt-get install` commands of a shell script, continuation lines joined."""
    joined = script.replace("\\\n", " ")
    return [line for line in joined.splitlines() if "apt-get install" in line]


def test_setup_and_ci_install_the_one_list_and_name_no_package_of_their_own() -> None:
    """Both scripts read the list, and their install commands name no package themselves (they
    install what they read from it)."""
    packages = listed()
    scripts = ("scripts/setup.sh", "scripts/install.sh", ".ci/run")
    for script in (ROOT / name for name in scripts):
        text = script.read_text(encoding="utf-8")
        assert "scripts/system-packages.txt" in text, script
        lines = install_lines(text)
        assert lines, script
        for line in lines:
            words = set(re.findall(r"[\w.+-]+", line.split("#", 1)[0]))
            assert not words & set(packages), (script, line)
    assert packages["bubblewrap"] == packages["systemd"] == {"test"}


def section(title: str) -> str:
    """A section of the README, up to the next one."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_docs_name_every_package_where_they_say_who_installs_it() -> None:
    """docs/development.md's table of what set-up installs has a row for each listed package,
    marked for the commands the list gives it; the README's "Two commands" names what a
    default Debian lacks before them."""
    development = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    table = development.split("## What set-up installs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for package, kinds in listed().items():
        (row,) = [r for r in rows if f"`{package}`" in r.split("|")[1]]
        cells = [cell.strip() for cell in row.split("|")[2:5]]  # make run, make test, install
        assert bool(cells[0]) == bool(kinds & {"run", "python"}), (package, cells)
        assert cells[1], package  # the tests need everything on the list
        installs = bool(cells[2]) and cells[2] != "(there already)"
        assert installs == ("install" in kinds), (package, cells)
    commands = section("Two commands")
    assert "`git`" in commands
    assert "`make`" in commands


def test_running_needs_no_test_package_and_the_install_no_build_of_its_own() -> None:
    """What `make run` installs holds no test package; the install needs what builds the venv
    (the system Python's venv and headers, a compiler, ALSA's headers) and nothing of the
    tests'."""
    packages = listed()
    run = {p for p, kinds in packages.items() if "run" in kinds}
    install = {p for p, kinds in packages.items() if "install" in kinds}
    assert not {p for p in run | install if "test" in packages[p]}
    assert {"python3-venv", "python3-dev", "gcc", "libasound2-dev"} <= install
    assert "mosquitto" not in install  # a node uses the broker it is given


@cache
def package_of(program: str) -> str:
    """The Debian package that installed a program on PATH (it must be on PATH)."""
    found = shutil.which(program)
    assert found is not None, f"{program} is not installed: scripts/setup.sh installs its package"
    real = Path(found).resolve()
    for path in (real, Path("/bin") / real.name, Path("/usr/bin") / real.name):
        owner = subprocess.run(
            ["dpkg-query", "-S", str(path)], capture_output=True, text=True, check=False
        )
        if owner.returncode == 0:
            return owner.stdout.split(":", 1)[0].split(",")[0].strip()
    raise AssertionError(f"{real}: installed by no Debian package")


def depends(package: str) -> set[str]:
    """The packages a package depends on directly."""
    shown = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends},${Pre-Depends}", package],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {re.split(r"[\s:(]", alt.strip())[0] for alt in re.split("[,|]", shown) if alt.strip()}


def essential(package: str) -> bool:
    """Whether every Debian system has it (Essential, or priority required)."""
    shown = subprocess.run(
        ["dpkg-query", "-W", "-f=${Essential} ${Priority}", package],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return "yes" in shown or "required" in shown


def test_every_program_the_tests_start_comes_from_a_listed_package() -> None:
    """Each program of PROGRAMS comes from a listed package or one it depends on, and so does
    every program a command line in tests/ or harness/ starts (a list literal: a program
    on PATH, then options), unless every Debian system has it."""
    packages = set(listed())
    accepted = packages | set().union(*(depends(p) for p in packages))
    for program, user in PROGRAMS.items():
        owner = package_of(program)
        assert owner in accepted, f"{program} ({user}) comes from {owner}, not in the list"
    started: set[str] = set()
    for source in [*(ROOT / "tests").glob("*.py"), *(ROOT / "harness").glob("*.py")]:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            words = [e.value for e in getattr(node, "elts", []) if isinstance(e, ast.Constant)]
            strings = [w for w in words if isinstance(w, str)]
            if isinstance(node, ast.List) and strings and any(w.startswith("-") for w in strings):
                started.add(strings[0])  # a command line: a program, then options
    programs = {
        name
        for name in started
        if re.fullmatch(r"[a-z][a-z0-9_.+-]*", name)
        and str(shutil.which(name)).startswith(("/usr/", "/bin/", "/sbin/"))  # not pyenv's
    }
    assert programs >= {"mosquitto", "openssl", "pulseaudio", "aplay"}, programs
    unlisted = {
        name
        for name in programs
        if package_of(name) not in accepted and not essential(package_of(name))
    }
    assert not unlisted, {name: package_of(name) for name in unlisted}
