"""A real three-node RabbitMQ cluster on one machine, with the MQTT plugin (MQTT 3.1.1 only).

Debian 12's `rabbitmq-server` 3.10.8 (Erlang 25.2.3), run from /usr/lib/rabbitmq/bin as child
processes of the test: each node with its own name (`vaN-<random>@localhost`), loopback ports
(AMQP, distribution, MQTT), data, logs and config in the cluster's folder, one Erlang cookie
(`home/.erlang.cookie`, mode 400) and a private epmd on its own port. So a system RabbitMQ, or
another cluster of another test run, does not matter. MQTT allows anonymous clients (as
`guest`/`guest`, which `username`/`password` also give), vhost `/`, exchange `amq.topic`.

Measured here (2 cores, other test runs beside, tests/test_rabbitmq_cluster.py asserts each):

- Start: 18-26 s for the three nodes booting at once (about 15-25 s of that the boot, each
  `rabbitmqctl` call about 2 s: await_startup, stop_app, join_cluster, start_app); up to 38 s
  under more load. A graceful stop takes 1-4 s; a node restarted and back in the cluster, 7-11 s.
- MQTT 5 (protocol level 5): no CONNACK at all, so no return code 1. The 3.1.1 frame parser
  fails on the 5.0 properties (the node logs `MQTT cannot parse a frame ... badmatch` at ERROR)
  and closes the socket, within 3 ms. paho-mqtt 2.2 with MQTTv5: connect() returns success,
  on_connect is never called, on_disconnect gets reason code 128 `Unspecified error` with
  `is_disconnect_packet_from_server=False`, loop() returns MQTT_ERR_CONN_LOST (loop_start()
  then reconnects with 5.0 again and again). A 3.1.1-shaped CONNECT with level 5 or 6 is closed
  the same way (framing error `protocol_header_corrupt`); only levels 3 and 4 get a CONNACK.
  So: fall back to 3.1.1 when a 5.0 connection is lost before any CONNACK.
- Retained messages are per node (a DETS file per vhost on each node, not replicated): a
  subscriber gets one only on the node it was published to; another node can hold a different
  one for the same topic. Only a filter equal to the topic gets it (`a/#`, `a/+`: nothing, even
  on that node). It survives the node's graceful restart; published 2 s before a SIGKILL of
  its node it was gone after the restart (DETS in RAM, written after ~2-4 s without access).
- Persistent sessions (clean_session=False, QoS 1): a durable classic queue
  `mqtt-subscription-<client id>qos1` on the node where the client subscribed. While that node
  runs, the client resumes from any node (session present = 1, queued messages delivered
  through the other node). With that node stopped (gracefully or killed): a reconnect elsewhere
  gets CONNACK 0 with session present = 0 and nothing; SUBSCRIBE there makes the node close
  the connection (queue.declare: `home node ... of durable queue ... is down or
  inaccessible`); QoS 1 messages published meanwhile get their PUBACK and are lost. When the
  node is back, the session is present again with what was queued before it went down (also
  after a SIGKILL: the messages are persistent).
- Last Will: published when the client's TCP connection dies without DISCONNECT (RST: at once,
  and a subscriber on another node gets it). Not published when the client's node is killed
  (SIGKILL of the Erlang VM) or stopped gracefully (SIGTERM), neither then nor after the node
  is back (waited 6 s and 3 s more after the restart).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from .wait import wait_until

RABBIT_BIN: Final = Path("/usr/lib/rabbitmq/bin")
"""Debian's scripts themselves: /usr/sbin's wrappers `su` to the `rabbitmq` user and use
/var/lib/rabbitmq."""
BOOT_TIMEOUT: Final = 180.0
"""Upper bound for one node's boot (Erlang boot takes 10+ s per node on 2 cores, three at once)."""
CTL_TIMEOUT: Final = 120.0
"""Upper bound for one `rabbitmqctl` command."""
USERNAME: Final = "guest"
PASSWORD: Final = "guest"  # RabbitMQ's default user; `loopback_users = none` lets it in
CTL_PORTS: Final = 20
"""Distribution ports each cluster keeps for its `rabbitmqctl` calls (one each while it runs)."""


_HANDED_OUT: set[int] = set()
"""Ports quiet_port returned in this process (its nodes bind them only later)."""


def quiet_port(count: int = 1) -> int:
    """The first of `count` consecutive free 127.0.0.1 ports below the kernel's ephemeral range.
    Unlike `free_port`'s, no outgoing connection takes one between the choice and the bind
    (a cluster makes hundreds: seen as a `rabbitmqctl` failing with `nodistribution`)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        first = random.randrange(max(1024, low - 12000), low - count)
        ports = set(range(first, first + count))
        if ports & _HANDED_OUT:
            continue
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        _HANDED_OUT.update(ports)
        return first
    raise AssertionError("no free port below the ephemeral range")


class RabbitNode:
    """One RabbitMQ node: `rabbitmq-server` in the foreground as a child process, with its own
    node name, ports, data and log directories, and the cluster's Erlang cookie (in `home`)."""

    def __init__(
        self, index: int, workdir: Path, home: Path, ports: tuple[int, int], tag: str
    ) -> None:
        """`ports`: the cluster's epmd port, and the first of its CTL_PORTS for the CLI."""
        self.index = index
        self.name = f"va{index}-{tag}@localhost"
        """The Erlang node name (RABBITMQ_NODENAME)."""
        self.host = "127.0.0.1"
        self.amqp_port = quiet_port()
        self.dist_port = quiet_port()
        self.mqtt_port = quiet_port()
        """The MQTT 3.1.1 listener, on `host`."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "rabbitmq.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = {self.host}:{self.amqp_port}",
                    "loopback_users = none",
                    "disk_free_limit.absolute = 10MB",
                    f"mqtt.listeners.tcp.default = {self.host}:{self.mqtt_port}",
                    "mqtt.allow_anonymous = true",
                    f"mqtt.default_user = {USERNAME}",
                    f"mqtt.default_pass = {PASSWORD}",
                    "mqtt.vhost = /",
                    "mqtt.exchange = amq.topic",
                    "log.console = false",
                    "log.file.level = info",
                ]
            )
            + "\n",
            encoding="utf-8",
        )
        plugins = workdir / "enabled_plugins"
        plugins.write_text("[rabbitmq_mqtt].\n", encoding="utf-8")
        env_file = workdir / "rabbitmq-env.conf"
        env_file.write_text("# none: /etc/rabbitmq/rabbitmq-env.conf is not read\n", "utf-8")
        self.log_dir = workdir / "log"
        self.output = workdir / "stdout.log"
        self.pid_file = workdir / "beam.pid"
        self.env = {
            **os.environ,
            "HOME": str(home),
            "ERL_EPMD_PORT": str(ports[0]),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_CONF_ENV_FILE": str(env_file),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(ports[1]),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(ports[1] + CTL_PORTS - 1),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"RabbitNode({self.name}, mqtt {self.host}:{self.mqtt_port})"

    def start(self) -> None:
        """Start the node (returns at once: `wait_ready` waits for it). A node that was in the
        cluster rejoins it by itself."""
        assert not self.alive(), f"{self.name} is running"
        self.pid_file.unlink(missing_ok=True)
        with self.output.open("ab") as out:
            self._process = subprocess.Popen(
                [str(RABBIT_BIN / "rabbitmq-server")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,  # its own process group: kill() takes all of it
            )

    def alive(self) -> bool:
        """Whether the node's process is running."""
        return self._process is not None and self._process.poll() is None

    def accepts_mqtt(self) -> bool:
        """Whether the MQTT listener accepts TCP connections now."""
        try:
            with socket.create_connection((self.host, self.mqtt_port), timeout=0.5):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Wait until the node has booted (`rabbitmqctl await_startup`) and its MQTT listener
        accepts connections."""
        deadline = time.monotonic() + timeout

        def booted() -> bool:  # this boot's pid file: no listener of an earlier VM counts
            return not self.alive() or (self.pid_file.exists() and self.accepts_mqtt())

        wait_until(booted, timeout, f"{self.name}'s MQTT port")
        while True:
            assert self.alive(), f"{self.name} exited: {self.tail()}"
            left = int(deadline - time.monotonic())
            waited = self.ctl("await_startup", "--timeout", str(max(left, 1)), check=False)
            if waited.returncode == 0:
                return
            # exit 69: not reachable yet (epmd registration can trail the listener)
            assert time.monotonic() < deadline, f"{self.name}: {waited.stdout}{waited.stderr}"
            time.sleep(1)

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`rabbitmqctl -n <this node> ...`."""
        done = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.name, *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.workdir,
            timeout=CTL_TIMEOUT,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"rabbitmqctl -n {self.name} {' '.join(args)}: exit {done.returncode}\n"
                f"{done.stdout}{done.stderr}"
            )
        return done

    def beam_pid(self) -> int:
        """The Erlang VM's process id (the node writes it at boot)."""
        wait_until(self.pid_file.exists, BOOT_TIMEOUT, f"{self.name}'s pid file")
        return int(self.pid_file.read_text(encoding="utf-8").strip())

    def stop(self, timeout: float = 90.0) -> None:
        """Stop gracefully (SIGTERM: RabbitMQ shuts down in order, MQTT connections closed),
        and wait; kill it when it does not stop in `timeout` s."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)  # the script passes it on to the VM
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole node at once (script, Erlang VM and its helpers): a crash, as a
        power cut looks from the other nodes; nothing runs shutdown code."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait(30)
        self._process = None
        # the VM is the script's child: gone (or a zombie) only a moment after the script
        wait_until(lambda: not self.accepts_mqtt(), 30, f"{self.name}'s MQTT port to close")

    def tail(self, lines: int = 40) -> str:
        """The end of the node's output and log, for failure messages."""
        texts = [self.output, *sorted(self.log_dir.glob("*.log"))]
        found = [p.read_text(encoding="utf-8", errors="replace") for p in texts if p.exists()]
        return "\n".join("\n".join(t.splitlines()[-lines:]) for t in found)


class RabbitCluster:
    """Three (`size`) RabbitMQ nodes clustered on one machine, with a private epmd: nodes 2.. join
    node 1 with `rabbitmqctl stop_app; join_cluster; start_app`. Use as a context manager, or
    start() and stop() (stop() also after a failed start)."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.home = workdir / "home"
        self.home.mkdir(exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16), encoding="utf-8")
        cookie.chmod(0o400)
        self.epmd_port = quiet_port()
        ports = (self.epmd_port, quiet_port(CTL_PORTS))
        tag = secrets.token_hex(3)
        self.nodes = [
            RabbitNode(i, workdir / f"node{i}", self.home, ports, tag) for i in range(1, size + 1)
        ]
        self.username = USERNAME
        self.password = PASSWORD
        self.started_in = 0.0
        """Seconds start() took, until every node ran in the cluster."""
        self._epmd: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RabbitCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start epmd and every node at once, then cluster nodes 2.. with node 1, and wait until
        the cluster runs every node."""
        began = time.monotonic()
        with (self.workdir / "epmd.log").open("ab") as log:
            self._epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        for node in self.nodes:
            node.start()
        seed, joining = self.nodes[0], self.nodes[1:]
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # each rabbitmqctl boots a VM: ~2 s
            list(pool.map(lambda n: n.wait_ready(), self.nodes))
            list(pool.map(lambda n: n.ctl("stop_app"), joining))
            for node in joining:  # one at a time, as the clustering guide does
                node.ctl("join_cluster", seed.name)
            list(pool.map(lambda n: n.ctl("start_app"), joining))
        wanted = {n.name for n in self.nodes}
        wait_until(lambda: self.running_nodes(seed) == wanted, BOOT_TIMEOUT, "the cluster")
        self.started_in = time.monotonic() - began

    def stop(self) -> None:
        """Stop every node (gracefully, killed if that hangs), then epmd."""
        try:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda n: n.stop(), self.nodes))
        finally:
            if self._epmd is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._epmd.pid, signal.SIGKILL)
                self._epmd.wait(30)
                self._epmd = None

    def node(self, name: str) -> RabbitNode:
        """The node with this Erlang name."""
        return next(n for n in self.nodes if n.name == name)

    def cluster_status(self, via: RabbitNode | None = None) -> dict[str, Any]:
        """`rabbitmqctl cluster_status --formatter json`, asked of `via` (default: the first
        running node)."""
        via = via or next(n for n in self.nodes if n.alive())
        status = json.loads(via.ctl("cluster_status", "--formatter", "json").stdout)
        assert isinstance(status, dict)
        return status

    def running_nodes(self, via: RabbitNode | None = None) -> set[str]:
        """The nodes the cluster reports as running."""
        return set(self.cluster_status(via)["running_nodes"])

    def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Wait until every node whose process runs has booted, listens for MQTT and is
        reported running by the cluster."""
        up = [n for n in self.nodes if n.alive()]
        with ThreadPoolExecutor(len(up)) as pool:
            list(pool.map(lambda n: n.wait_ready(timeout), up))
        wanted = {n.name for n in up}
        deadline = time.monotonic() + timeout
        while (running := self.running_nodes(up[0])) != wanted:
            assert time.monotonic() < deadline, f"cluster runs {running}, not {wanted}"
            time.sleep(1)
