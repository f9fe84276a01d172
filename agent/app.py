"""The composition root: builds the edges from the config, pumps events through the core.

Threads: the MQTT network thread (parses, hands off), the synthesis thread, the ALSA writer
thread, and the main thread running `App.serve`, the only caller of the core. Everything
crosses threads through bounded queues.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Final

from .chimes import ChimePlan, chime_bank
from .config import DEFAULT_CHIMES, AgentConfig, resolve_cache_dir
from .core import SpeakCore
from .messages import (
    Acknowledge,
    AckRequested,
    Action,
    AudioStatus,
    Cut,
    Delivery,
    Event,
    Notify,
    Priority,
    Rejection,
    SetVolume,
    SpeakInvalid,
    SpeakReceived,
    StopRequested,
    Synthesize,
    Tick,
    UtteranceEnded,
    VolumeRequested,
)
from .mqtt_link import MqttLink
from .payloads import SpeakLimits, encode_event, parse_ack, parse_speak, parse_stop, parse_volume
from .phrase_cache import PhraseCache
from .player import PcmOpener, Player, alsa_opener
from .synthesizer import Synthesizer, VoiceChoice
from .topics import Topics
from .voice import SynthesisParams, Voice, bundled_voice, seed_random

_LOGGER = logging.getLogger(__name__)

INBOX_SIZE: Final = 1024
"""Events waiting for the core. MQTT can hold at most `mqtt.receive_maximum` unacknowledged
QoS 1 messages in it; the rest are bounded per utterance by the player's buffer."""
_TICK_SECONDS: Final = 0.1
"""How often time passes for the core when nothing else happens (deadlines, repeats)."""


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

    def __init__(
        self,
        config: AgentConfig,
        voices: dict[str, VoiceChoice],
        open_pcm: PcmOpener | None = None,
    ) -> None:
        self._config = config
        self._topics = Topics(config.mqtt.topic_prefix, config.node_id)
        self._inbox: queue.Queue[Event] = queue.Queue(maxsize=INBOX_SIZE)
        speak, audio, cache = config.speak, config.audio, config.cache
        self._limits = SpeakLimits(speak.max_payload_bytes, speak.max_text_chars)
        rate = _common_rate(voices)
        bank = chime_bank(audio.chime_files, rate)
        self._core = SpeakCore(
            speak.queue_size, speak.remembered_ids, frozenset(voices), frozenset(bank)
        )
        self._stopping = threading.Event()
        opener = open_pcm or alsa_opener(audio.device, rate, audio.period_ms, audio.periods)
        self._player = Player(opener, rate, self._inbox.put, audio.volume, audio.alarm_volume_floor)
        self._cache = PhraseCache(
            resolve_cache_dir(cache, os.environ) / "phrases", cache.memory_bytes, cache.disk_bytes
        )
        by_class = {**DEFAULT_CHIMES, **audio.chimes}
        plan = ChimePlan(
            bank, {p: by_class[p.label] for p in Priority if by_class[p.label] != "none"}
        )
        self._synthesizer = Synthesizer(
            voices,
            self._cache,
            (config.tts.first_chunk_phonemes, config.tts.max_chunk_phonemes),
            self._player.put,
            self._inbox.put,
            cache.phrases,
            plan,
        )
        self._audio_available = True
        topics = self._topics
        self._link = MqttLink(
            config.mqtt,
            client_id=f"voice-agent-{config.node_id}",
            status_topic=topics.status,
            handlers={
                topics.speak: self._on_speak_message,
                topics.speak_all: self._on_speak_message,
                topics.stop: self._on_stop_message,
                topics.ack: self._on_ack_message,
                topics.volume: self._on_volume_message,
            },
            retained=frozenset({topics.volume}),
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
        self._publish_state()
        _LOGGER.info("Serving node %s on %s/…", self._config.node_id, self._topics.speak[:-6])
        next_tick = time.monotonic()
        try:
            while not self._stopping.is_set():
                if self._link.failed.is_set():
                    return 1
                try:
                    event: Event = self._inbox.get(timeout=_TICK_SECONDS)
                except queue.Empty:
                    event = Tick()
                now = time.monotonic()
                if isinstance(event, Tick):
                    next_tick = now + _TICK_SECONDS
                elif now >= next_tick:  # busy: still let time pass for deadlines and repeats
                    self._handle(Tick(), now)
                    next_tick = now + _TICK_SECONDS
                self._handle(event, now)
        finally:
            self._link.stop()
            self._player.stop()  # first: a synthesizer waiting on the buffer is released
            self._synthesizer.stop()
            _LOGGER.info("Phrase cache: %s", self._cache.stats())
        return 0

    def _handle(self, event: Event, now: float) -> None:
        for action in self._core.handle(event, now):
            self._execute(action)
        if isinstance(event, AudioStatus):
            self._audio_available = event.available
            self._publish_state()
        elif isinstance(event, SpeakReceived | UtteranceEnded | StopRequested | AckRequested):
            self._publish_state()

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
            case Synthesize(request, play):
                self._synthesizer.submit(request)
                _LOGGER.debug("Synthesizing %s, play %d", request.id, play)
            case Cut(request_id):
                self._synthesizer.cancel(request_id)
                self._player.cut(request_id)
            case SetVolume(volume):
                self._player.volume = volume
                self._publish_state()

    def _publish_state(self) -> None:
        state = {
            "audio": "available" if self._audio_available else "unavailable",
            "volume": round(self._player.volume, 3),
            "queue_depth": self._core.queue_depth,
            "underruns": self._player.underruns,
        }
        self._link.publish(self._topics.state, json.dumps(state), retain=True)

    # ---- on the MQTT thread: parse, then hand off without blocking ------------------------

    def _on_speak_message(self, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_speak(payload, self._limits, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else SpeakReceived(parsed, delivery)
        )

    def _on_stop_message(self, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_stop(payload, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else StopRequested(parsed, delivery)
        )

    def _on_ack_message(self, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_ack(payload, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else AckRequested(parsed, delivery)
        )

    def _on_volume_message(self, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_volume(payload, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else VolumeRequested(parsed, delivery)
        )

    def _hand_off(self, event: Event) -> None:
        try:
            self._inbox.put_nowait(event)
        except queue.Full:
            _LOGGER.error("Inbox full: a message was dropped unacknowledged")


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
