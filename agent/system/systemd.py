"""systemd's notify protocol: READY, STOPPING, STATUS and watchdog pings over $NOTIFY_SOCKET.

About twenty lines of stdlib `socket`; without $NOTIFY_SOCKET every call does nothing, so the
agent runs unchanged outside systemd. Failures are logged, never raised. A send never waits: the
calls come from the main loop (the sounder's is the alarm lane's), and a datagram socket whose
reader lags blocks a sender once `net.unix.max_dgram_qlen` (10) datagrams are queued; then that
notification is dropped (logged) and the watchdog's next ping follows half an interval later.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

_LOGGER = logging.getLogger(__name__)


class Notifier:
    """Sends notifications to the service manager, if there is one."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        path = environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + path[1:] if path.startswith("@") else path
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval: float | None = (
            int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else None
        )
        """Seconds between watchdog pings (half of WatchdogSec), or None without a watchdog."""

    def notify(self, *fields: str) -> None:
        """Send `KEY=value` fields, e.g. notify("READY=1", "STATUS=Serving")."""
        if not self._address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto("\n".join(fields).encode(), self._address)
        except OSError as err:
            _LOGGER.warning("systemd notification failed: %s", err)
