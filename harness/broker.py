"""A real Mosquitto for tests and benchmarks, and a throwaway PKI for its TLS listener."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .wait import TIMEOUT, wait_until


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Broker:
    """A real Mosquitto in the foreground on a free loopback port, with persistence."""

    def __init__(self, workdir: Path, tls: Pki | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            "set_tcp_nodelay true",
            "persistence true",
            f"persistence_location {workdir}/",
            "autosave_interval 1",
            "autosave_on_changes true",  # with interval 1: every change saved (SIGKILL tests)
            "max_queued_messages 10000",
            "log_type all",
        ]
        if tls is not None:  # this listener speaks TLS only
            lines += [f"cafile {tls.ca}", f"certfile {tls.cert}", f"keyfile {tls.key}"]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to `mosquitto` and cannot persist here
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.log = workdir / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None

    def require_login(self, passwords: Mapping[str, str], acl: Path | None = None) -> Path:
        """Refuse anonymous clients: only these users, with these passwords (a password file
        made by `mosquitto_passwd`), and `acl` as its ACL file when given. Call before start();
        returns the password file."""
        passwd = self.workdir / "passwd"
        passwd.unlink(missing_ok=True)
        for user, password in passwords.items():
            args = ["mosquitto_passwd", "-b", str(passwd), user, password]
            if not passwd.exists():
                args.insert(1, "-c")
            subprocess.run(args, check=True, capture_output=True, timeout=TIMEOUT)
        passwd.chmod(0o600)  # Mosquitto 2.0 warns about a password file others can read
        text = self.config.read_text(encoding="utf-8")
        text = text.replace("allow_anonymous true", "allow_anonymous false")
        text += f"password_file {passwd}\n"
        if acl is not None:
            text += f"acl_file {acl}\n"
        self.config.write_text(text, encoding="utf-8")
        return passwd

    def start(self) -> None:
        """Start and wait until the port accepts connections."""
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                ["mosquitto", "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(self._accepts, 10, "mosquitto to listen")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop with a signal and wait for the process."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(sig)
            self._process.wait(10)
        self._process = None


@dataclass(frozen=True)
class Pki:
    """A throwaway CA and a certificate for 127.0.0.1 / localhost signed by it."""

    ca: Path
    cert: Path
    key: Path


def make_pki(directory: Path, name: str = "test") -> Pki:
    """Generate a CA and a broker certificate with the `openssl` command (EC P-256)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = directory / f"{name}-ca.key", directory / f"{name}-ca.pem"
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n", encoding="utf-8")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sign = ["-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2"]
    commands = [
        ["openssl", "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2"],
        ["openssl", "req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1"],
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            str(csr),
            *sign,
            "-out",
            str(cert),
            "-extfile",
            str(ext),
        ],
    ]
    commands[0] += ["-subj", f"/CN={name} test CA"]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True, timeout=TIMEOUT)
    for path in (key, cert, ca):
        path.chmod(0o644)  # readable by the broker, which may run as another user
    return Pki(ca, cert, key)
