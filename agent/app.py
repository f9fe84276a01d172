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
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from . import hermes
from . import manifest as manifests
from . import version as package_version
from .chimes import ChimePlan, chime_bank
from .config import (
    DEFAULT_CHIMES,
    AgentConfig,
    resolve_cache_dir,
    resolve_storage_dir,
)
from .core import SpeakCore
from .discovery import DeviceInfo, discovery_messages, update_state
from .journal import ENDED, QUEUED, STARTED, Journal
from .messages import (
    Acknowledge,
    AckRequested,
    Action,
    AudioStatus,
    Cut,
    Delivery,
    Event,
    Lifecycle,
    Notify,
    Priority,
    Record,
    Rejection,
    ReplayRequested,
    SetVolume,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
    SynthesisDone,
    Synthesize,
    Tick,
    UtteranceEnded,
    UtteranceStarted,
    VoiceSelected,
    VolumeRequested,
)
from .mqtt_link import MessageHandler, MqttLink
from .payloads import (
    SpeakLimits,
    encode_event,
    parse_ack,
    parse_json_object,
    parse_speak,
    parse_stop,
    parse_volume,
)
from .phrase_cache import PhraseCache
from .player import PcmOpener, Player, alsa_opener
from .synthesizer import Synthesizer, VoiceChoice
from .systemd import Notifier
from .telemetry import Telemetry
from .topics import Topics
from .updater import Updater, UpdateReport, start_model
from .voice import SynthesisParams, Voice, bundled_voice, seed_random

_LOGGER = logging.getLogger(__name__)

INBOX_SIZE: Final = 1024
"""Events waiting for the core. MQTT can hold at most `mqtt.receive_maximum` unacknowledged
QoS 1 messages in it; the rest are bounded per utterance by the player's buffer."""
_TICK_SECONDS: Final = 0.1
"""How often time passes for the core when nothing else happens (deadlines, repeats)."""
_STATE_MIN_SECONDS: Final = 0.25
"""Changes are gathered this long before the state is published again."""


def factory_model(config: AgentConfig) -> Path:
    """The default voice's model as configured (`tts.voice`, or the bundled one)."""
    return config.tts.voice or bundled_voice()


def ota_directory(config: AgentConfig) -> Path:
    """Where model slots, downloads and the update state live."""
    storage = resolve_storage_dir(config.storage, os.environ)
    return config.ota.dir or storage / "ota" / config.node_id


def load_voice(
    config: AgentConfig, voice_id: str = "default", path: Path | None = None
) -> VoiceChoice:
    """Load and prewarm one voice (`default` is `tts.voice`, the bundled one when null)."""
    tts = config.tts
    if path is None:
        path = factory_model(config) if voice_id == "default" else tts.voices[voice_id]
    if tts.seed is not None:
        seed_random(tts.seed)  # before the session is made: it starts from this seed
    started = time.monotonic()
    voice = Voice.load(path, tts.threads, resolve_cache_dir(config.cache, os.environ))
    loaded = time.monotonic()
    voice.prewarm()
    return _choice(config, voice_id, voice, started, loaded)


def _choice(
    config: AgentConfig, voice_id: str, voice: Voice, started: float, loaded: float
) -> VoiceChoice:
    tts = config.tts
    path = voice.path
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
    """Every configured voice, loaded and prewarmed; the default one from its update slot when a
    model update is installed (see `updater.start_model`)."""
    default = factory_model(config)
    if config.ota.trusted_keys:
        default = start_model(config.ota, ota_directory(config), default)
    voices = {"default": load_voice(config, "default", default)}
    voices |= {vid: load_voice(config, vid) for vid in config.tts.voices}
    return voices


class App:
    """One running agent: the core and its edges, wired."""

    def __init__(
        self,
        config: AgentConfig,
        voices: dict[str, VoiceChoice],
        open_pcm: PcmOpener | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        environ = os.environ if environ is None else environ
        self._topics = topics = Topics(config.mqtt.topic_prefix, config.node_id)
        self._inbox: queue.Queue[Event] = queue.Queue(maxsize=INBOX_SIZE)
        speak, audio, cache = config.speak, config.audio, config.cache
        self._limits = SpeakLimits(speak.max_payload_bytes, speak.max_text_chars)
        self._voices = voices
        rate = _common_rate(voices)
        bank = chime_bank(audio.chime_files, rate)
        self._core = SpeakCore(
            speak.queue_size, speak.remembered_ids, frozenset(voices), frozenset(bank)
        )
        self._stopping = threading.Event()
        opener = open_pcm or alsa_opener(audio.device, rate, audio.period_ms, audio.periods)
        self._player = Player(opener, rate, self._inbox.put, audio.volume, audio.alarm_volume_floor)
        self._cache = PhraseCache(
            resolve_cache_dir(cache, environ) / "phrases", cache.memory_bytes, cache.disk_bytes
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
        self._journal = Journal(
            resolve_storage_dir(config.storage, environ) / f"journal-{config.node_id}.sqlite3",
            speak.remembered_ids,
        )
        self._outbox: dict[int, int] = {}  # publish mid -> outbox key
        self._unsent: list[Delivery | tuple[int, bytes]] = []
        self._telemetry = Telemetry()
        self._systemd = Notifier(environ)
        self._audio_available = True
        self._started_at = time.monotonic()
        self._state_due = 0.0
        self._state_dirty = True
        self._announce_at: float | None = None  # when to (re)publish discovery
        self._hermes: dict[str, hermes.HermesContext] = {}
        self._hermes_lock = threading.Lock()
        self._hermes_muted = False
        handlers: dict[str, MessageHandler] = {
            topics.speak: self._on_speak_message,
            topics.speak_all: self._on_speak_message,
            topics.stop: self._on_stop_message,
            topics.ack: self._on_ack_message,
            topics.volume: self._on_volume_message,
            topics.replay: self._on_replay_message,
            topics.voice: self._on_voice_message,
        }
        if config.homeassistant.discovery:
            handlers[f"{config.homeassistant.prefix}/status"] = self._on_homeassistant_status
        if config.hermes.enabled:
            site = config.hermes.site_id
            handlers |= {
                hermes.SAY: self._on_hermes_say,
                hermes.play_bytes_topic(site): self._on_hermes_play,
                hermes.TOGGLE_ON: self._on_hermes_toggle,
                hermes.TOGGLE_OFF: self._on_hermes_toggle,
                hermes.GET_VOICES: self._on_hermes_get_voices,
            }
        self._updates: queue.Queue[UpdateReport | _Swap] = queue.Queue()
        self._swap_waiting: _Swap | None = None
        self._update_view = _UpdateView()
        self._updater: Updater | None = None
        if config.ota.trusted_keys:
            self._updater = Updater(
                config.ota,
                ota_directory(config),
                factory_model(config),
                rate,
                config.tts.threads,
                self._updates.put,
                self._request_swap,
                resolve_cache_dir(config.cache, environ),
            )
            ota = self._on_ota_message
            handlers[topics.ota] = ota
            handlers[f"{topics.prefix}/all/ota"] = ota
            for group in config.ota.groups:
                handlers[f"{topics.prefix}/group/{group}/ota"] = ota
        self._link = MqttLink(
            config.mqtt,
            client_id=f"voice-agent-{config.node_id}",
            status_topic=topics.status,
            handlers=handlers,
            retained=frozenset({topics.volume, topics.voice}),
            on_connected=self._on_connected,
        )

    def request_stop(self) -> None:
        """Ask `serve` to return (safe from a signal handler: it only sets a flag)."""
        self._stopping.set()

    def serve(self) -> int:
        """Run until `request_stop` (0) or until the MQTT link fails for good (1)."""
        self._player.open()
        self._player.start()
        self._synthesizer.start()
        self._restore(time.monotonic())
        if self._updater is not None:
            self._updater.started()  # up with the active model: a pending switch is confirmed
            self._updater.start()
        self._link.start()
        self._systemd.notify("READY=1", f"STATUS=Serving {self._topics.speak}")
        _LOGGER.info("Serving node %s on %s/…", self._config.node_id, self._topics.speak[:-6])
        next_tick = next_ping = time.monotonic()
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
                next_ping = self._housekeeping(now, next_ping)
        finally:
            self._systemd.notify("STOPPING=1")
            if self._updater is not None:
                self._updater.stop()
            self._link.stop()
            self._player.stop()  # first: a synthesizer waiting on the buffer is released
            self._synthesizer.stop()
            self._settle_outbox()
            self._journal.close()
            _LOGGER.info("Phrase cache: %s", self._cache.stats())
        return 0

    def _flush(self) -> None:
        """Send what the last journal transaction made safe: acks and events, in order."""
        for item in self._unsent:
            if isinstance(item, Delivery):
                self._link.ack(item)
            else:
                key, payload = item
                self._outbox[self._link.publish(self._topics.events, payload)] = key
        self._unsent.clear()

    def _restore(self, now: float) -> None:
        """After a restart: unsent events go out again; unfinished announcements queue again."""
        for key, topic, payload in self._journal.outbox_pending():
            self._outbox[self._link.publish(topic, payload)] = key
        wall = time.time()
        pending = [
            (
                p.request,
                None if p.request.ttl is None else p.request.ttl - (wall - p.received),
                p.started,
            )
            for p in self._journal.pending()
        ]
        ids, fingerprints = self._journal.remembered()
        if pending:
            _LOGGER.info("Journal: %d announcements had not ended; queued again", len(pending))
        with self._journal.transaction():
            for action in self._core.restore(pending, ids, fingerprints, now):
                self._execute(action, now)
        self._flush()

    def _settle_outbox(self) -> None:
        """Forget the events the broker acknowledged."""
        keys = []
        while self._link.acknowledged:
            key = self._outbox.pop(self._link.acknowledged.popleft(), None)
            if key is not None:
                keys.append(key)
        if keys:
            self._journal.outbox_done(keys)

    def _housekeeping(self, now: float, next_ping: float) -> float:
        """Watchdog pings, discovery when due, the state when changed or due; next ping time."""
        self._settle_outbox()
        self._handle_updates(now)
        interval = self._systemd.watchdog_interval
        if interval is not None and now >= next_ping:
            self._systemd.notify("WATCHDOG=1")  # from the main loop: a stuck loop stops pinging
            next_ping = now + interval
        if self._announce_at is not None and now >= self._announce_at:
            self._announce_at = None
            self._announce()
        debounced = now >= self._state_due - self._config.state.interval + _STATE_MIN_SECONDS
        if (self._state_dirty and debounced) or now >= self._state_due:
            self._publish_state(now)
        return next_ping

    def _handle(self, event: Event, now: float) -> None:
        """One event: its journal writes in one transaction (one sync), and only then the
        acknowledgements and events it caused go out."""
        wall = None  # when its events happened: the audio writer's time for these, else now
        if isinstance(event, UtteranceStarted | UtteranceEnded) and event.wall:
            wall = event.wall
        with self._journal.transaction():
            for action in self._core.handle(event, now):
                self._execute(action, now, wall)  # its events carry when it was played
        self._flush()
        if isinstance(event, AudioStatus):
            self._audio_available = event.available
        if not isinstance(event, Tick | SynthesisDone):
            self._state_dirty = True

    def _execute(self, action: Action, now: float, wall: float | None = None) -> None:
        """Carry out one action; `wall` is the time its events carry (default: now)."""
        match action:
            case Record(request, fingerprint):
                if request.audio is None:  # recorded audio (Hermes) is real-time only
                    self._journal.record(request, fingerprint, time.time())
            case Acknowledge(delivery):
                self._unsent.append(delivery)  # after the journal is synced
            case Notify(request_id, event, details):
                at = time.time() if wall is None else wall
                payload = encode_event(self._config.node_id, request_id, event, details, at)
                state = _journal_state(action)  # the state and its event, in one transaction
                key = self._journal.note_event(request_id, state, self._topics.events, payload)
                self._unsent.append((key, payload))
                self._telemetry.record(action, now)
                self._reply_hermes(action)
                _LOGGER.info("%s %s %s", request_id, event, dict(details) or "")
            case Synthesize(request, play, job):
                self._synthesizer.submit(request, job)
                _LOGGER.debug("Synthesizing %s, play %d (job %d)", request.id, play, job)
            case Cut(_, job):
                self._synthesizer.cancel(job)
                self._player.cut(job)
            case SetVolume(volume):
                self._player.volume = volume

    # ---- model updates --------------------------------------------------------------------------

    def _request_swap(self, voice: Voice) -> bool:
        """On the updater's thread: have the app loop switch to this voice; wait for the answer."""
        swap = _Swap(voice)
        self._updates.put(swap)
        if not swap.done.wait(_SWAP_WAIT_SECONDS) and swap.cancel():
            return False
        swap.done.wait()  # claimed by the loop: it is switching now
        return swap.ok

    def _handle_updates(self, now: float) -> None:
        """Reports become events and the update entity's state; a switch waits for silence."""
        while True:
            try:
                item = self._updates.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Swap):
                self._swap_waiting = item
                self._hold(True, now)
            else:
                self._publish_update(item, now)
        swap = self._swap_waiting
        if swap is not None and (self._core.idle or swap.cancelled):
            self._swap_waiting = None
            if swap.claim():
                swap.ok = self._switch_voice(swap.voice)
            swap.done.set()
            self._hold(False, now)

    def _hold(self, held: bool, now: float) -> None:
        with self._journal.transaction():
            for action in self._core.hold(held, now):
                self._execute(action, now)
        self._flush()

    def _switch_voice(self, voice: Voice) -> bool:
        current = self._voices["default"].voice
        if voice.sample_rate != current.sample_rate:
            return False
        now = time.monotonic()
        self._voices["default"] = _choice(self._config, "default", voice, now, now)
        self._synthesizer.render_phrases_again()  # the cache follows the new digest
        self._announce()
        self._state_dirty = True
        _LOGGER.info("Switched to the model %s (sha256 %s…)", voice.path, voice.sha256[:12])
        return True

    def _publish_update(self, report: UpdateReport, now: float) -> None:
        view = self._update_view
        if (
            report.state == "downloading"
            and view.progress is not None
            and report.progress is not None
            and report.progress // 10 == view.progress // 10
            and report.progress != 100
        ):
            view.progress = report.progress
            return  # progress events in steps of 10 %
        in_progress = report.state in _UPDATE_RUNNING
        keeps_notes = in_progress or report.state == "installed"  # else not (or no longer) ours
        self._update_view = _UpdateView(
            latest=report.version or view.latest,
            notes=(report.notes or view.notes) if keeps_notes else None,
            progress=report.progress if in_progress else None,
            in_progress=in_progress,
        )
        details = {
            k: v
            for k, v in asdict(report).items()
            if v not in (None, "") and k not in {"offer", "notes"}
        }
        self._handle_notify(Notify(report.offer, Lifecycle.UPDATE, details), now)
        self._publish_update_state()

    def _handle_notify(self, notify: Notify, now: float) -> None:
        with self._journal.transaction():
            self._execute(notify, now)
        self._flush()

    def _model_version(self) -> str:
        """The installed release's version; the configured model's first 12 sha256 digits."""
        installed = self._updater.installed_version if self._updater else None
        return installed or self._voices["default"].voice.sha256[:12]

    def _publish_update_state(self) -> None:
        view = self._update_view
        body = update_state(
            self._model_version(),
            view.latest,
            f"Voice model {self._voices['default'].voice.path.stem}",
            in_progress=view.in_progress,
            percentage=view.progress,
            notes=view.notes,
        )
        self._link.publish(self._topics.update, body, retain=True)

    def _on_ota_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        """On the MQTT thread: an offer, a cancel or a rollback; the updater works on it."""
        self._link.ack(delivery)
        assert self._updater is not None  # noqa: S101 - only subscribed with an updater
        body = parse_json_object(payload, manifests.MAX_ENVELOPE_BYTES + 4096, _new_id)
        if isinstance(body, Rejection):
            self._updates.put(
                UpdateReport(body.id, "failed", reason="malformed", detail=body.detail)
            )
            return
        offer = body.get("id")
        self._updater.command(offer if isinstance(offer, str) and offer else _new_id(), body)

    # ---- what the agent publishes about itself ---------------------------------------------

    def _on_connected(self) -> None:
        """On the MQTT thread, at every connect: announce and report soon (from the loop)."""
        self._announce_at = time.monotonic()
        self._state_dirty = True

    def _announce(self) -> None:
        voice = self._voices["default"].voice
        self._publish_update_state()
        if not self._config.homeassistant.discovery:
            return
        ha = self._config.homeassistant
        device = DeviceInfo(
            node_id=self._config.node_id,
            name=ha.name or f"Voice {self._config.node_id}",
            version=package_version(),
            model=f"voice-agent ({voice.path.stem})",
            voices=sorted(self._voices),
        )
        for topic, payload in discovery_messages(ha.prefix, self._topics, device):
            self._link.publish(topic, payload, retain=True)
        _LOGGER.info("Published Home Assistant discovery under %s/", ha.prefix)

    def _publish_state(self, now: float) -> None:
        self._state_dirty = False
        self._state_due = now + self._config.state.interval
        voice = self._voices["default"].voice
        stats = self._cache.stats()
        telemetry = self._telemetry
        state = {
            "audio": "available" if self._audio_available else "unavailable",
            "volume": round(self._player.volume, 3),
            "voice": self._core.selected_voice,
            "queue_depth": self._core.queue_depth,
            "underruns": self._player.underruns,
            "model": voice.path.stem,
            "model_version": self._model_version(),
            "model_sha256": voice.sha256,
            "model_release": self._updater.state.release if self._updater else 0,
            "last_ttfa_ms": telemetry.last_ttfa_ms,
            "synthesis_speed": telemetry.synthesis_speed,
            "last_error": self._link.last_error or telemetry.last_error,
            "events": dict(telemetry.counts),
            "cache": {
                "hit_rate": round(stats.hit_rate, 3),
                "hits": stats.memory_hits + stats.disk_hits,
                "misses": stats.misses,
                "memory_bytes": stats.memory_bytes,
                "disk_bytes": stats.disk_bytes,
            },
            "hermes_audio": "off" if self._hermes_muted else "on",
            "uptime_s": round(now - self._started_at),
        }
        self._link.publish(self._topics.state, json.dumps(state), retain=True)

    # ---- Hermes ------------------------------------------------------------------------------

    def _reply_hermes(self, notify: Notify) -> None:
        if notify.event not in _TERMINAL:
            return
        with self._hermes_lock:
            context = self._hermes.pop(notify.id, None)
        if context is None:
            return
        if notify.event in (Lifecycle.FAILED, Lifecycle.REJECTED):
            self._link.publish(*hermes.error(context, str(notify.details.get("reason"))))
            if context.kind == "say":
                return
        self._link.publish(*hermes.finished(context))  # an audio server always says it finished

    # ---- on the MQTT thread: parse, then hand off without blocking ------------------------

    def _on_speak_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_speak(payload, self._limits, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else SpeakReceived(parsed, delivery)
        )

    def _on_stop_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_stop(payload, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else StopRequested(parsed, delivery)
        )

    def _on_ack_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_ack(payload, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else AckRequested(parsed, delivery)
        )

    def _on_volume_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        parsed = parse_volume(payload, _new_id)
        self._hand_off(
            SpeakInvalid(parsed, delivery)
            if isinstance(parsed, Rejection)
            else VolumeRequested(parsed, delivery)
        )

    def _on_replay_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        self._hand_off(ReplayRequested(delivery))

    def _on_voice_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        voice = payload.decode("utf-8", errors="replace").strip()
        self._hand_off(VoiceSelected(voice, delivery))

    def _on_homeassistant_status(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        self._link.ack(delivery)
        if payload.strip() == b"online":  # Home Assistant restarted: announce again, spread out
            self._announce_at = time.monotonic() + random.uniform(0.5, 5.0)  # noqa: S311

    def _on_hermes_say(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        parsed = hermes.parse_say(payload, self._config.hermes.site_id, self._limits, _new_id)
        self._hermes_request(parsed, delivery)

    def _on_hermes_play(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        parsed = hermes.parse_play_bytes(topic, payload, self._config.hermes.site_id, _new_id)
        if isinstance(parsed, Rejection):  # invalid WAV: error, and playFinished as Rhasspy does
            request_id = topic.rsplit("/", 1)[-1]
            context = hermes.HermesContext("play", request_id, self._config.hermes.site_id, None)
            self._link.publish(*hermes.error(context, parsed.detail))
            self._link.publish(*hermes.finished(context))
        self._hermes_request(parsed, delivery)

    def _hermes_request(
        self,
        parsed: tuple[SpeakRequest, hermes.HermesContext] | Rejection | None,
        delivery: Delivery,
    ) -> None:
        if parsed is None:  # another site's message
            self._link.ack(delivery)
            return
        if isinstance(parsed, Rejection):
            self._hand_off(SpeakInvalid(parsed, delivery))
            return
        request, context = parsed
        if self._hermes_muted:  # toggled off: not played, answered as done
            self._link.publish(*hermes.finished(context))
            self._link.ack(delivery)
            return
        with self._hermes_lock:
            self._hermes[request.id] = context
        self._hand_off(SpeakReceived(request, delivery))

    def _on_hermes_toggle(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        self._link.ack(delivery)
        if hermes.parse_site(payload, self._config.hermes.site_id):
            self._hermes_muted = topic == hermes.TOGGLE_OFF
            self._state_dirty = True

    def _on_hermes_get_voices(self, topic: str, payload: bytes, delivery: Delivery) -> None:
        self._link.ack(delivery)
        voices = {vid: choice.voice.path.stem for vid, choice in self._voices.items()}
        reply = hermes.voices_reply(payload, self._config.hermes.site_id, voices)
        if reply is not None:
            self._link.publish(*reply)

    def _hand_off(self, event: Event) -> None:
        try:
            self._inbox.put_nowait(event)
        except queue.Full:
            # Only QoS 0 floods can get here (QoS 1 is bounded by mqtt.receive_maximum). Ack so
            # that a receive slot is never held for good.
            _LOGGER.error("Inbox full: a message was dropped")
            delivery = getattr(event, "delivery", None)
            if isinstance(delivery, Delivery):
                self._link.ack(delivery)


def _journal_state(notify: Notify) -> str | None:
    """What an event means for the announcement's journal entry."""
    event = notify.event
    if event == Lifecycle.STARTED:
        return STARTED
    if event in (Lifecycle.REQUEUED, Lifecycle.INTERRUPTED) or (
        event == Lifecycle.FINISHED and notify.details.get("repeats_left") not in (0, None)
    ):
        return QUEUED
    return ENDED if event in _TERMINAL else None


_SWAP_WAIT_SECONDS: Final = 600.0
"""How long a model switch may wait for the current announcement to end."""
_UPDATE_RUNNING: Final = frozenset(
    {"verifying", "downloading", "installing", "checking", "switching"}
)


@dataclass(slots=True)
class _UpdateView:
    """What Home Assistant's update entity shows of the update in progress (or the last)."""

    latest: str | None = None
    notes: str | None = None
    progress: int | None = None
    in_progress: bool = False


@dataclass(slots=True)
class _Swap:
    """A switch to a new default voice, asked by the updater, done by the app loop. Exactly one
    of `claim` (the loop) and `cancel` (the updater, at its timeout) wins."""

    voice: Voice
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    _state: str = "waiting"
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """The loop is about to switch; False if the updater gave up first."""
        with self._lock:
            if self._state == "waiting":
                self._state = "claimed"
            return self._state == "claimed"

    def cancel(self) -> bool:
        """The updater gives up; False if the loop is already switching."""
        with self._lock:
            if self._state == "waiting":
                self._state = "cancelled"
            return self._state == "cancelled"

    @property
    def cancelled(self) -> bool:
        with self._lock:
            return self._state == "cancelled"


_TERMINAL: Final = frozenset(
    {
        Lifecycle.FINISHED,
        Lifecycle.FAILED,
        Lifecycle.REJECTED,
        Lifecycle.EXPIRED,
        Lifecycle.STOPPED,
        Lifecycle.ACKNOWLEDGED,
        Lifecycle.COALESCED,
        Lifecycle.PREEMPTED,
    }
)
"""Events after which a Hermes request gets its reply (`finished` of a repeat is the last)."""


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
