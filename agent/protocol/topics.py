"""The MQTT topic names of one node. Pure."""

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
    def say(self) -> str:
        """Plain text to say, never parsed as JSON: Home Assistant's notify and text entities
        (subscribed, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/say"

    @property
    def result(self) -> str:
        """The end of each announcement, for Home Assistant's event entity (published)."""
        return f"{self.prefix}/{self.node_id}/result"

    def group(self, group: str, command: str) -> str:
        """A speak group's topic (`speak`, `stop` or `ack`), subscribed by every node in it."""
        return f"{self.prefix}/group/{group}/{command}"

    @property
    def stop(self) -> str:
        """Stop what is playing; `{"clear": true}` also empties the queue (subscribed, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/stop"

    @property
    def ack(self) -> str:
        """Acknowledge a repeating announcement by id (subscribed, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/ack"

    @property
    def volume(self) -> str:
        """Set the global volume, 0 to 1 (subscribed, QoS 1; kept across restarts)."""
        return f"{self.prefix}/{self.node_id}/volume"

    @property
    def replay(self) -> str:
        """Say the last announcement again (subscribed, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/replay"

    @property
    def voice(self) -> str:
        """Select the voice of requests that name none (subscribed, QoS 1; kept across restarts)."""
        return f"{self.prefix}/{self.node_id}/voice"

    @property
    def ota(self) -> str:
        """Model update offers, cancel and rollback for this node (subscribed, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/ota"

    @property
    def revocation(self) -> str:
        """The fleet's signed revocation of releases (subscribed, QoS 1; the retained one is
        read at every connect)."""
        return f"{self.prefix}/all/revocation"

    @property
    def update(self) -> str:
        """The voice model's version for Home Assistant's update entity (published retained)."""
        return f"{self.prefix}/{self.node_id}/update"

    @property
    def state(self) -> str:
        """The agent's state as JSON (published retained, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/state"

    @property
    def events(self) -> str:
        """Lifecycle events of this node's requests (published, QoS 1)."""
        return f"{self.prefix}/{self.node_id}/events"

    @property
    def engine(self) -> str:
        """The engine process's availability (`online`/`offline`, retained; its Last Will):
        the node's `status` is the sounder's."""
        return f"{self.prefix}/{self.node_id}/engine"

    @property
    def status(self) -> str:
        """Availability, `online` or `offline` (published retained, QoS 1; the Last Will)."""
        return f"{self.prefix}/{self.node_id}/status"
