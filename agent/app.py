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
from .payloads import SpeakLimits, encode_event, parse_speak
from .phrase_cache import PhraseCache
from .player import Player, alsa_opener
from .synthesizer import Synthesizer, VoiceChoice
from .topics import Topics
from .voice import SynthesisParams, Voice, bundled_voice, seed_random

_LOGGER = logging.getLogger(__name__)

INBOX_SIZE: Final = 1024
"""Events waiting for the core. MQTT can hold at most `mqtt.receive_maximum` unacknowledged
QoS 1 messages in it; the rest are bounded per utterance by the player's buffer."""
_POLL_SECONDS: Final = 0.2


def load_voice(config: AgentConfig, voice_id: str = "default") -> VoiceChoice:
    """Load and prewarm one voice (`default` is `tts.voice`, the bundled one when null)."""
    tts = config.tts
    path = (tts.voice or bundled_voice()) if voice_id == "default" else tts.voices[voice_id]
    if tts.seed is not None:
        seed_random(tts.seed)  # before the session is made: it starts from this seed
    started = time.monotonic()
    voice = Voice.load(path, tts.threads, resolve_cache_dir(config.cache, os.environ))
    loaded = time.monotonic()
    voice.prewarm()
    _LOGGER.info(
        "Voice %s (%s, sha256 %s…) loaded in %.2f s, prewarmed in %.2f s",
        voice_id,
        path.name,
        voice.sha256[:12],
        loaded - started,
        time.monotonic() - loaded,
    )
    base = voice.default_params
    params = SynthesisParams(
        base.noise_scale if tts.noise_scale is None else tts.noise_scale,
        base.length_scale if tts.length_scale is None else tts.length_scale,
        base.noise_w if tts.noise_w is None else tts.noise_w,
    )
    return VoiceChoice(voice_id, voice, params)


def load_voices(config: AgentConfig) -> dict[str, VoiceChoice]:
    """Every configured voice, loaded and prewarmed."""
    return {vid: load_voice(config, vid) for vid in ("default", *config.tts.voices)}


class App:
    """One running agent: the core and its edges, wired."""

    def __init__(self, config: AgentConfig, voices: dict[str, VoiceChoice]) -> None:
        self._config = config
        self._topics = Topics(config.mqtt.topic_prefix, config.node_id)
        self._inbox: queue.Queue[Event] = queue.Queue(maxsize=INBOX_SIZE)
        speak = config.speak
        self._limits = SpeakLimits(speak.max_payload_bytes, speak.max_text_chars)
        self._core = SpeakCore(speak.queue_size, speak.remembered_ids, frozenset(voices))
        self._stopping = threading.Event()
        rate = _common_rate(voices)
        audio = config.audio
        opener = alsa_opener(audio.device, rate, audio.period_ms, audio.periods)
        self._player = Player(opener, rate, self._inbox.put)
        cache = config.cache
        self._cache = PhraseCache(
            resolve_cache_dir(cache, os.environ) / "phrases", cache.memory_bytes, cache.disk_bytes
        )
        self._synthesizer = Synthesizer(
            voices,
            self._cache,
            config.tts.first_chunk_phonemes,
            self._player.put,
            self._inbox.put,
            cache.phrases,
        )
        on_speak = self._on_speak_message
        self._link = MqttLink(
            config.mqtt,
            client_id=f"voice-agent-{config.node_id}",
            status_topic=self._topics.status,
            handlers={self._topics.speak: on_speak, self._topics.speak_all: on_speak},
        )

    def request_stop(self) -> None:
        """Ask `serve` to return (safe from a signal handler: it only sets a flag)."""
        self._stopping.set()

    def serve(self) -> int:
        """Run until `request_stop` (0) or until the MQTT link fails for good (1)."""
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
                if self._link.failed.is_set():
                    return 1
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
            _LOGGER.info("Phrase cache: %s", self._cache.stats())
        return 0

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
        parsed = parse_speak(payload, self._limits, _new_id)
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


def _common_rate(voices: dict[str, VoiceChoice]) -> int:
    """The one sample rate of all voices (the PCM stays open at one rate)."""
    rates = {choice.voice.sample_rate for choice in voices.values()}
    if len(rates) != 1:
        raise ValueError(f"all voices must share one sample rate, got {sorted(rates)}")
    return rates.pop()


def run(config: AgentConfig, install_signals: Callable[[Callable[[], None]], None]) -> int:
    """Load the voices, then serve until a signal asks to stop; returns the exit code."""
    app = App(config, load_voices(config))
    install_signals(app.request_stop)
    return app.serve()
