"""The operator's tool (`python -m ota`) and its brokers' credentials: each `--broker` its own, a
password only over TLS or to this machine unless the operator says so, and a hostile broker
first in the list receives nothing (tests/hostile_server.py: the attacker).

docs/security.md, "A hostile or compromised server in the ring"; docs/fleet.md."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import Broker
from ota import connection
from tests.hostile_server import HostileServer


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    connection.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_each_broker_names_its_own_credentials(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pw", tmp_path / "b.pw"
    a.write_text("pa\n")
    b.write_text("pb\n")
    settings = connection.settings_from_args(
        args(
            "--tls",
            "--broker",
            f"broker-a.lan:8883,user=ops,password-file={a}",
            "--broker",
            "broker-b.lan:8883",
            "--broker",
            f"broker-c.lan,user=ops-c,password-file={b}",
        )
    )
    assert settings.servers == (
        ("broker-a.lan", 8883),
        ("broker-b.lan", 8883),
        ("broker-c.lan", 1883),
    )
    assert settings.login(0) == connection.Login("ops", a)
    assert settings.login(1) is None
    assert settings.login(2) == connection.Login("ops-c", b)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--broker", "a:1883", "--broker", "b:1883", "--username", "ops"], "single --broker"),
        (["--broker", "broker.lan", "--username", "ops", "--password-file", "{pw}"], "in clear"),
        (["--broker", "broker.lan,user=ops,password-file={pw}"], "in clear"),
        (["--broker", "broker.lan,user=ops,colour=red"], "unknown or repeated option"),
        (["--broker", "broker.lan,password-file={pw}"], "needs user="),
        (["--broker", "broker.lan,user=ops,password-file=/nowhere/pw"], "no such file"),
    ],
)
def test_credentials_that_would_leak_or_make_no_sense_are_refused(
    tmp_path: Path, argv: list[str], problem: str
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    with pytest.raises(ValueError, match=problem):
        connection.settings_from_args(args(*(a.format(pw=secret) for a in argv)))


def test_a_password_in_clear_goes_only_where_the_operator_allows_it(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    login = ["--username", "o", "--password-file", str(secret)]
    for argv in (
        ["--broker", "broker.lan", *login, "--tls"],
        ["--broker", "broker.lan", *login, "--allow-plaintext-password"],
        ["--broker", f"broker.lan,user=o,password-file={secret},plaintext-password"],
        ["--broker", "127.0.0.1", *login],
        ["--broker", "localhost", *login],
    ):
        assert connection.settings_from_args(args(*argv)).login(0) is not None


@pytest.mark.broker
def test_a_hostile_broker_first_in_the_list_receives_no_credentials(tmp_path: Path) -> None:
    """`--broker` = [a hostile server, the real broker with its own credentials]: the hostile
    server (tried first, refusing) gets no user name and no password; the real broker lets the
    tool in with its own, and `status` answers."""
    broker = Broker(tmp_path / "secured")
    broker.require_login({"ops": "s3cret-ops"})
    broker.start()
    secret = tmp_path / "ops.pw"
    secret.write_text("s3cret-ops\n")
    hostile = HostileServer(lambda _conn: None, refuse=lambda _c: True)
    try:
        line = [sys.executable, "-m", "ota", "status", "--json", "--sync-timeout", "2"]
        line += ["--broker", hostile.entry_address]
        line += ["--broker", f"{broker.host}:{broker.port},user=ops,password-file={secret}"]
        done = subprocess.run(line, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["nodes"] == []
        assert hostile.connects, "the hostile server was never tried"
        assert all(c.username is None and c.password is None for c in hostile.connects)
        assert "s3cret" not in done.stdout + done.stderr
    finally:
        hostile.stop()
        broker.stop()
