"""The MQTT topic names of one node. Pure. Allowed imports: stdlib."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Topics:
    """Topics under `<prefix>/<node_id>/` and the fleet-wide `<prefix>/all/`."""

    prefix: str
    node_id: str

    @property
    def speak(self) -> str:
        """Speak requests for this node (subscribed, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/speak"

    @property
    def speak_all(self) -> str:
        """Speak requests for every node (subscribed, QoS 1)."""
        return f"{self.prefix}/all/speak"

    @property
    def events(self) -> str:
        """Lifecycle events of this node's requests (published, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/events"

    @property
    def status(self) -> str:
        """Availability, `online` or `offline` (published retained, QoS 1; the Last Will)."""
        return f"{self.prefix}/{self.node_id}/status"
