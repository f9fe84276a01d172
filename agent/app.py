"""The composition root: builds the edges from the config, pumps events through the core.

Threads: the MQTT network thread (parses, hands off), the synthesis thread, the ALSA writer
thread, and the main thread running `App.serve`, the only caller of the core. Everything
crosses threads through bounded queues.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Final

from .config import AgentConfig, resolve_cache_dir
from .core import SpeakCore
from .messages import (
    Acknowledge,
    Action,
    Delivery,
    Event,
    Notify,
    Rejection,
    SpeakInvalid,
    SpeakReceived,
    Synthesize,
)
from .mqtt_link import MqttLink
from .payloads import encode_event, parse_speak
from .player import Player, alsa_opener
from .synthesizer import Synthesizer
from .topics import Topics
from .voice import Voice, bundled_voice

_LOGGER = logging.getLogger(__name__)

INBOX_SIZE: Final = 1024
"""Events waiting for the core. MQTT can hold at most `mqtt.receive_maximum` unacknowledged
QoS 1 messages in it; the rest are bounded per utterance by the player's buffer."""
_POLL_SECONDS: Final = 0.2


def load_voice(config: AgentConfig) -> Voice:
    """Load and prewarm the configured voice (the bundled one by default)."""
    path = config.tts.voice or bundled_voice()
    cache_dir = resolve_cache_dir(config.cache, os.environ)
    started = time.monotonic()
    voice = Voice.load(path, config.tts.threads, cache_dir)
    loaded = time.monotonic()
    voice.prewarm()
    _LOGGER.info(
        "Voice %s (sha256 %s…) loaded in %.2f s, prewarmed in %.2f s",
        path.name,
        voice.sha256[:12],
        loaded - started,
        time.monotonic() - loaded,
    )
    return voice


class App:
    """One running agent: the core and its edges, wired."""

    def __init__(self, config: AgentConfig, voice: Voice) -> None:
        self._config = config
        self._topics = Topics(config.mqtt.topic_prefix, config.node_id)
        self._inbox: queue.Queue[Event] = queue.Queue(maxsize=INBOX_SIZE)
        self._core = SpeakCore(config.speak.queue_size, config.speak.remembered_ids)
        self._stopping = threading.Event()
        audio = config.audio
        opener = alsa_opener(audio.device, voice.sample_rate, audio.period_ms, audio.periods)
        self._player = Player(opener, voice.sample_rate, self._inbox.put)
        self._synthesizer = Synthesizer(voice, self._player.put, self._inbox.put)
        speak = self._on_speak_message
        self._link = MqttLink(
            config.mqtt,
            client_id=f"voice-agent-{config.node_id}",
            status_topic=self._topics.status,
            handlers={self._topics.speak: speak, self._topics.speak_all: speak},
        )

    def request_stop(self) -> None:
        """Ask `serve` to return (safe from a signal handler: it only sets a flag)."""
        self._stopping.set()

    def serve(self) -> None:
        """Run until `request_stop`: start the edges, then feed every event to the core."""
        self._player.open()
        self._player.start()
        self._synthesizer.start()
        self._link.start()
        _LOGGER.info(
            "Serving node %s: speak on %s and %s",
            self._config.node_id,
            self._topics.speak,
            self._topics.speak_all,
        )
        try:
            while not self._stopping.is_set():
                try:
                    event = self._inbox.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    continue
                for action in self._core.handle(event):
                    self._execute(action)
        finally:
            self._link.stop()
            self._player.stop()  # first: a synthesizer waiting on the buffer is released
            self._synthesizer.stop()

    def _execute(self, action: Action) -> None:
        match action:
            case Acknowledge(delivery):
                self._link.ack(delivery)
            case Notify(request_id, event, details):
                payload = encode_event(
                    self._config.node_id, request_id, event, details, time.time()
                )
                self._link.publish(self._topics.events, payload)
                _LOGGER.info("%s %s %s", request_id, event, dict(details) or "")
            case Synthesize(request):
                self._synthesizer.submit(request)

    def _on_speak_message(self, payload: bytes, delivery: Delivery) -> None:
        """On the MQTT thread: parse, then hand off without blocking."""
        parsed = parse_speak(payload, self._config.speak.max_payload_bytes, _new_id)
        event: Event
        if isinstance(parsed, Rejection):
            event = SpeakInvalid(parsed, delivery)
        else:
            event = SpeakReceived(parsed, delivery)
        try:
            self._inbox.put_nowait(event)
        except queue.Full:
            _LOGGER.error("Inbox full: a speak message was dropped unacknowledged")


def _new_id() -> str:
    return uuid.uuid4().hex


def run(config: AgentConfig, install_signals: Callable[[Callable[[], None]], None]) -> None:
    """Load the voice, then serve until a signal asks to stop."""
    voice = load_voice(config)
    app = App(config, voice)
    install_signals(app.request_stop)
    app.serve()
