"""The composition root: builds the edges from the config, and runs the loop that hands every
input to the room that owns it and carries out what they decide.

Threads: paho's network thread (routes a message to one event, puts it on the inbox), the synthesis
thread, the ALSA writer thread, the updater's thread, the media fetcher's thread, and the main
thread running `App.serve`: the only caller of the core, the Hermes bridge and the status, and the
only writer of the journal. Everything reaches the loop through one bounded inbox (`inbox`); the
loop reaches the workers through their own bounded queues. Whatever goes wrong while one event is
handled ends that event (a delivery is rejected with reason `internal` and acknowledged), not the
loop.
"""

from __future__ import annotations

import logging
import os
import random
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final

from . import allocator
from . import version as package_version
from .board import board
from .chimes import ChimePlan, chime_bank
from .clock import clock_sync
from .config import DEFAULT_CHIMES, AgentConfig, resolve_cache_dir, resolve_storage_dir
from .core import SpeakCore, Timing
from .discovery import result_message
from .flood import FloodGate
from .hermes_bridge import HermesBridge
from .inbox import Inbox
from .inputs import (
    Connected,
    HermesRequest,
    HermesToggle,
    HermesVoicesAsked,
    HomeAssistantBirth,
    Ignored,
    OtaCommand,
)
from .journal import Journal
from .ledger import Ledger
from .media_source import FetchLimits, MediaSource
from .messages import (
    Acknowledge,
    Action,
    AudioStatus,
    Cut,
    Delivery,
    Event,
    Lifecycle,
    Notify,
    Priority,
    Reason,
    Record,
    Remember,
    SetVolume,
    SpeakReceived,
    SpeakRequest,
    SwapCancelled,
    SwapRequested,
    SwitchDeclined,
    SwitchVoice,
    SynthesisDone,
    Synthesize,
    Tick,
    UtteranceEnded,
    UtteranceStarted,
)
from .mqtt_link import MessageHandler, MqttLink
from .payloads import encode_event
from .phrase_cache import PhraseCache
from .player import IdlePolicy, PcmOpener, Player, alsa_opener, announce_role
from .routes import Route, RoutedEvent, route_table
from .states import UpdatePhase, UpdateReport
from .status import NodeFacts, Status
from .synthesizer import Synthesizer, VoiceChoice
from .systemd import Notifier
from .topics import Topics
from .updater import Updater
from .voice import Voice
from .voice_swap import SwapAsked, SwapDesk, SwapWithdrawn
from .voices import catalog, choice_for, factory_model, ota_directory, voice_names

_LOGGER = logging.getLogger(__name__)

_TICK_SECONDS: Final = 0.1
"""How often time passes for the core when nothing else happens (deadlines, repeats)."""
REPORT_SLOTS: Final = 256
"""Reports of the workers that can wait in the inbox (a worker waits for room beyond)."""
QOS1_SLOTS: Final = 256
"""QoS 1 deliveries that can wait in the inbox beyond `mqtt.receive_maximum` (more are left
unacknowledged and sent again by the broker after a reconnect)."""
QOS0_SLOTS: Final = 256
"""QoS 0 deliveries that can wait in the inbox (more are dropped: QoS 0 is at most once)."""


InboxEvent = RoutedEvent | UpdateReport | SwapAsked[Voice] | SwapWithdrawn | Connected


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
        deliveries = config.mqtt.receive_maximum + QOS1_SLOTS
        self._inbox: Inbox[InboxEvent] = Inbox(deliveries, QOS0_SLOTS, REPORT_SLOTS)
        speak, audio, cache = config.speak, config.audio, config.cache
        self._voices = voices  # the loop's own; the synthesizer has its copy
        rate = voices["default"].voice.sample_rate  # the device's; other voices are resampled
        bank = chime_bank(audio.chime_files, rate)
        timing = Timing(speak.max_lead_seconds, speak.max_late_seconds, speak.prepare_seconds)
        self._catalog = catalog(voices, frozenset(bank), frozenset(audio.media))
        self._core = SpeakCore(
            speak.queue_size, speak.remembered_ids, timing=timing, catalog=self._catalog
        )
        opener = open_pcm or alsa_opener(audio.device, rate, audio.period_ms, audio.periods)
        report = self._inbox.report
        idle = IdlePolicy(audio.lead_in_ms / 1000, audio.idle_wake_s, audio.release_when_idle_s)
        self._player = Player(opener, rate, report, audio.volume, audio.alarm_volume_floor, idle)
        self._cache = PhraseCache(
            resolve_cache_dir(cache, environ) / "phrases", cache.memory_bytes, cache.disk_bytes
        )
        by_class = {**DEFAULT_CHIMES, **audio.chimes}
        plan = ChimePlan(
            bank, {p: by_class[p.label] for p in Priority if by_class[p.label] != "none"}
        )
        limits = FetchLimits(
            audio.max_media_bytes, audio.media_timeout_s, audio.media_stall_timeout_s
        )
        self._media = MediaSource(audio.media, rate, self._cache, limits)
        self._synthesizer = Synthesizer(
            voices,
            self._cache,
            (config.tts.first_chunk_phonemes, config.tts.max_chunk_phonemes),
            self._player.put,
            report,
            cache.phrases,
            plan,
            max_seconds=speak.max_audio_seconds,
            media=self._media,
            after_request=allocator.trim,
        )
        journal, self._storage_note = Journal.open_or_renew(
            resolve_storage_dir(config.storage, environ) / f"journal-{config.node_id}.sqlite3",
            speak.remembered_ids,
        )
        self._status = Status(config, topics)
        self._hermes = HermesBridge(config.hermes.site_id)
        self._flood = FloodGate()
        self._systemd = Notifier(environ)
        self._audio_available = True
        self._started_at = time.monotonic()
        self._started_wall = time.time()
        self._board = board()
        self._voice_names = voice_names(voices)
        self._swaps: SwapDesk[Voice] = SwapDesk(self._inbox.report)
        self._stopping = False
        self._failures: set[tuple[str, str]] = set()
        self._updater: Updater[Voice] | None = None
        cache_dir = resolve_cache_dir(cache, environ)
        if config.ota.trusted_keys:
            self._updater = Updater(
                config.ota,
                ota_directory(config),
                factory_model(config),
                rate,
                config.tts.threads,
                report,
                lambda path: _prewarmed(Voice.load(path, config.tts.threads, cache_dir)),
                self._swaps.ask,
                cache_dir=cache_dir,  # the check builds the candidate there; the agent only loads
            )
        table = route_table(config, topics, _new_id, {n: v for v, n in self._voice_names.items()})
        self._link = MqttLink(
            config.mqtt,
            client_id=f"voice-agent-{config.node_id}",
            status_topic=topics.status,
            handlers={topic: self._hand_off(route) for topic, route in table.routes.items()},
            retained=table.restored,
            on_connected=lambda: self._inbox.notice(Connected()),
        )
        self._ledger = Ledger(journal, self._link, topics.events)

    def _hand_off(self, route: Route) -> MessageHandler:
        """The handler on paho's thread: route the message to one event and queue it, never
        blocking (a refused QoS 1 delivery stays unacknowledged; see `_housekeeping`)."""

        def handle(topic: str, payload: bytes, delivery: Delivery) -> None:
            self._inbox.deliver(route(topic, payload, delivery), delivery.qos)

        return handle

    def request_stop(self) -> None:
        """Ask `serve` to return (safe from a signal handler: it only sets a flag)."""
        self._stopping = True

    def serve(self) -> int:
        """Run until `request_stop` (0) or until the MQTT link fails for good (1)."""
        self._player.open()
        self._player.start()
        self._media.start()
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
            while not self._stopping:
                if self._link.failed.is_set():
                    return 1
                event: InboxEvent | Tick = self._inbox.get(_TICK_SECONDS) or Tick()
                now = time.monotonic()
                if isinstance(event, Tick):
                    next_tick = now + _TICK_SECONDS
                elif now >= next_tick:  # busy: still let time pass for deadlines and repeats
                    self._guarded(Tick(), now)
                    next_tick = now + _TICK_SECONDS
                self._guarded(event, now)
                next_ping = self._housekeeping(now, next_ping)
        finally:
            self._systemd.notify("STOPPING=1")
            self._inbox.close()  # workers waiting to report are released
            if self._updater is not None:
                self._updater.stop()
            self._link.stop()
            self._player.stop()  # first: a synthesizer waiting on the buffer is released
            self._media.stop()  # and one waiting for a download
            self._synthesizer.stop()
            self._ledger.close()
            _LOGGER.info("Phrase cache: %s", self._cache.stats())
        return 0

    # ---- one event --------------------------------------------------------------------------

    def _guarded(self, event: InboxEvent | Tick, now: float) -> None:
        """Handle one event; whatever goes wrong ends this event, not the loop."""
        try:
            self._dispatch(event, now)
        except Exception as err:  # noqa: BLE001 - the guard of the loop: one event fails, not all
            try:
                self._failed(event, err, now)
            except Exception:
                _LOGGER.exception("Answering a failed %s failed too", type(event).__name__)

    def _dispatch(self, event: InboxEvent | Tick, now: float) -> None:  # noqa: PLR0912 - by kind
        match event:
            case UpdateReport():
                self._update_reported(event, now)
            case SwapAsked():
                self._handle(SwapRequested(self._swaps.taken(event)), now)
            case SwapWithdrawn(token):
                self._handle(SwapCancelled(token), now)
            case Connected():
                self._status.connected(now)
            case HomeAssistantBirth(delivery):
                self._status.home_assistant_born(now, random.uniform(0.5, 5.0))  # noqa: S311
                self._link.ack(delivery)
            case Ignored(delivery):
                self._link.ack(delivery)
            case HermesRequest():
                replies, core_event = self._hermes.request(event)
                for topic, payload in replies:
                    self._publish(topic, payload)
                core_event = self._spoken_somehow(core_event)
                if core_event is None:
                    self._link.ack(event.delivery)
                else:
                    self._handle(core_event, now)
            case HermesToggle(on, delivery):
                self._hermes.toggle(on)
                self._status.changed()
                self._link.ack(delivery)
            case HermesVoicesAsked(request_id, delivery):
                self._publish(*self._hermes.voices(request_id, self._voice_names))
                self._link.ack(delivery)
            case OtaCommand(offer_id, body, delivery, problem):
                assert self._updater is not None  # noqa: S101 - only routed with an updater
                if body is None:
                    failed = UpdatePhase.FAILED
                    report = UpdateReport(offer_id, failed, reason="malformed", detail=problem)
                    self._update_reported(report, now)
                else:
                    self._updater.command(offer_id, body)
                self._link.ack(delivery)
            case _:
                self._handle(event, now)

    def _update_reported(self, report: UpdateReport, now: float) -> None:
        notify = self._status.update_reported(report)
        if notify is not None:
            self._handle_notify(notify, now)
        self._publish(*self._status.update_entity(self._facts(now)))

    def _spoken_somehow(self, event: Event | None) -> Event | None:
        """A Hermes say whose `lang` no voice speaks is said by the selected voice (Rhasspy
        sends its profile's language with every say; refusing would leave it silent)."""
        if not isinstance(event, SpeakReceived) or event.request.lang is None:
            return event
        if self._catalog.voice_for(event.request.lang) is None:
            return replace(event, request=replace(event.request, lang=None))
        return event

    def _handle(self, event: Event, now: float) -> None:
        """One core event: its journal writes in one transaction (one sync), and only then the
        acknowledgements and events it caused go out."""
        wall = None  # when its events happened: the audio writer's time for these, else now
        if isinstance(event, UtteranceStarted | UtteranceEnded) and event.wall:
            wall = event.wall
        if isinstance(event, SpeakReceived):
            if not event.wall:  # places a request's `at` on the core's clock
                event = replace(event, wall=time.time())
            if event.request.urls:  # downloaded while it waits: ready when its turn comes
                self._media.prefetch(event.request.urls, renew=True)
        with self._ledger.transaction():
            for action in self._core.handle(event, now):
                self._execute(action, now, wall)
        if isinstance(event, AudioStatus):
            self._audio_available = event.available
        if not isinstance(event, Tick | SynthesisDone):
            self._status.changed()

    def _guarded_notify(self, notify: Notify, now: float) -> None:
        try:
            self._handle_notify(notify, now)
        except Exception:
            _LOGGER.exception("Publishing %s failed", notify.event)

    def _handle_notify(self, notify: Notify, now: float) -> None:
        with self._ledger.transaction():
            self._execute(notify, now)

    def _failed(self, event: InboxEvent | Tick, err: Exception, now: float) -> None:
        """The guard's answer to a fault while handling `event`: the traceback is logged once
        per kind of fault; the request it was about is dropped and answered (`rejected`, or
        `failed` when it was already under way) with reason `internal`; a delivery is
        acknowledged (it would only fail again)."""
        where = traceback.extract_tb(err.__traceback__)[-1]
        kind = (type(err).__name__, f"{where.filename}:{where.lineno}")
        if kind in self._failures:
            _LOGGER.error("Handling %s failed again: %r", type(event).__name__, err)
        else:
            self._failures.add(kind)
            _LOGGER.exception("Handling %s failed; the loop goes on", type(event).__name__)
        delivery = getattr(event, "delivery", None)
        subject = _subject(event)
        try:
            if subject is not None:
                with self._ledger.transaction():
                    for action in self._core.discard(subject, now):
                        self._execute(action, now)
            if isinstance(delivery, Delivery) or subject is not None:
                ended = Lifecycle.REJECTED if isinstance(delivery, Delivery) else Lifecycle.FAILED
                details = {"reason": str(Reason.INTERNAL), "detail": type(err).__name__}
                self._handle_notify(Notify(subject or _new_id(), ended, details), now)
        finally:
            if isinstance(delivery, Delivery):
                self._link.ack(delivery)

    def _execute(self, action: Action, now: float, wall: float | None = None) -> None:
        """Carry out one action; `wall` is the time its events carry (default: now)."""
        match action:
            case Record(request, fingerprint):
                if request.audio is None:  # recorded audio (Hermes) is real-time only
                    self._ledger.record(request, fingerprint)
            case Acknowledge(delivery):
                self._ledger.acknowledge(delivery)  # after the journal is synced
            case Notify():
                self._notify(action, now, time.time() if wall is None else wall)
            case Synthesize(request, play, job):
                self._ledger.activated(request.id)  # a crash from here on counts (crash loops)
                self._synthesizer.submit(request, job, start_at=request.at if play == 1 else None)
                _LOGGER.debug("Synthesizing %s, play %d (job %d)", request.id, play, job)
            case Cut(_, job):
                self._synthesizer.cancel(job)
                self._player.cut(job)
            case SetVolume(volume):
                self._player.volume = volume
            case Remember(name, value):
                self._ledger.remember(name, value)
            case SwitchVoice(token):
                self._swaps.answer(token, self._switch_voice(self._swaps.voice(token)))
            case SwitchDeclined(token):
                self._swaps.answer(token, False)

    def _notify(self, notify: Notify, now: float, at: float) -> None:
        """A lifecycle event: its Hermes reply, the status, the event itself (counted instead in
        a flood), Home Assistant's event entity, the log."""
        request_id, event, details = notify.id, notify.event, notify.details
        for topic, reply in self._hermes.notified(notify):
            self._publish(topic, reply)  # every Hermes request has its answer, flood or not
        self._status.record(notify, now, at)
        if event == Lifecycle.REJECTED and not self._flood.allow(str(details.get("reason")), now):
            self._ledger.unreported(notify)  # its journal entry ends all the same
            return  # counted: one `suppressed` event per interval says how many
        payload = encode_event(self._config.node_id, request_id, event, details, at)
        self._ledger.event(notify, payload)
        result = result_message(event, request_id, details)
        if result is not None:  # Home Assistant's event entity
            self._publish(self._topics.result, result)
        _LOGGER.info("%s %s %r", request_id, event, dict(details) or "")

    # ---- around the events ------------------------------------------------------------------

    def _restore(self, now: float) -> None:
        """After a restart: unsent events go out again; unfinished announcements queue again."""
        pending, ids, fingerprints = self._ledger.unfinished()
        if pending:
            _LOGGER.info("Journal: %d announcements had not ended; queued again", len(pending))
        settings = self._ledger.settings()
        with self._ledger.transaction():
            for action in self._core.restore(pending, ids, fingerprints, now, settings):
                self._execute(action, now)

    def _housekeeping(self, now: float, next_ping: float) -> float:
        """Watchdog pings, discovery when due, the state when changed or due; next ping time."""
        self._ledger.settle()
        refused = self._inbox.refusals_to_redeliver()
        if refused:  # the broker sent more than the inbox holds: have it send them again
            _LOGGER.warning("%d messages found the inbox full; reconnecting to get them", refused)
            self._link.redeliver()
        held = self._flood.summary(now)
        if held is not None:
            count = sum(held.values())
            _LOGGER.warning("Flood: %d rejections not reported one by one: %s", count, held)
            suppressed = Notify(
                f"flood-{_new_id()[:8]}", Lifecycle.SUPPRESSED, {"count": count, "reasons": held}
            )
            self._guarded_notify(suppressed, now)
        if self._ledger.recovered(now):
            self._status.changed()
            if self._ledger.held_back:  # not recorded, so not acknowledged: get them again
                self._ledger.held_back = 0
                self._link.redeliver()
        interval = self._systemd.watchdog_interval
        if interval is not None and now >= next_ping:
            self._systemd.notify("WATCHDOG=1")  # from the main loop: a stuck loop stops pinging
            next_ping = now + interval
        if self._status.announce_due(now):
            self._announce(now)
        if self._status.state_due(now):
            self._publish(*self._status.state(self._facts(now), now, time.time()))
        return next_ping

    def _announce(self, now: float) -> None:
        messages = self._status.announce(self._facts(now))
        for topic, payload, retain in messages:
            self._publish(topic, payload, retain)
        if len(messages) > 1:
            _LOGGER.info(
                "Published Home Assistant discovery under %s/", self._config.homeassistant.prefix
            )

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self._link.publish(topic, payload, retain=retain)

    def _facts(self, now: float) -> NodeFacts:
        voice = self._voices["default"].voice
        stats = self._cache.stats()
        updater = self._updater
        return NodeFacts(
            audio_available=self._audio_available,
            volume=self._player.volume,
            selected_voice=self._core.selected_voice,
            queue_depth=self._core.queue_depth,
            underruns=self._player.underruns,
            model=voice.path.stem,
            model_sha256=voice.sha256,
            installed_version=updater.installed_version if updater else None,
            model_release=updater.state.release if updater else 0,
            voices=sorted(self._voices),
            cache={
                "hit_rate": round(stats.hit_rate, 3),
                "hits": stats.memory_hits + stats.disk_hits,
                "misses": stats.misses,
                "memory_bytes": stats.memory_bytes,
                "disk_bytes": stats.disk_bytes,
            },
            link_error=self._link.last_error,
            storage_error=self._ledger.problem or self._storage_note,
            hermes_muted=self._hermes.muted,
            uptime_s=now - self._started_at,
            agent_version=package_version(),
            speaking=self._core.speaking,
            started_at=self._started_wall,
            voice_names=self._voice_names,
            board=self._board,
            clock=None if (sync := clock_sync()) is None else sync.as_json(),
        )

    # ---- model updates ----------------------------------------------------------------------

    def _switch_voice(self, voice: Voice) -> bool:
        if voice.sample_rate != self._voices["default"].voice.sample_rate:
            return False
        choice = choice_for(self._config, "default", voice)
        self._voices["default"] = choice
        self._synthesizer.use_voice(choice)  # before any later request: one queue, in order
        self._status.connected(time.monotonic())  # announce the new model
        _LOGGER.info("Switched to the model %s (sha256 %s…)", voice.path, voice.sha256[:12])
        return True


def _subject(event: InboxEvent | Tick) -> str | None:
    """The id of the request an event is about, if it is about one."""
    match event:
        case SpeakReceived(request):
            return request.id
        case HermesRequest(parsed=SpeakRequest() as request):
            return request.id
        case SynthesisDone(request_id) | UtteranceStarted(request_id) | UtteranceEnded(request_id):
            return request_id
    return None


def _prewarmed(voice: Voice) -> Voice:
    voice.prewarm()
    return voice


def _new_id() -> str:
    return uuid.uuid4().hex


def run(config: AgentConfig, install_signals: Callable[[Callable[[], None]], None]) -> int:
    """Load the voices, then serve until a signal asks to stop; returns the exit code."""
    from .voices import load_voices  # noqa: PLC0415 - kept beside run for the command line

    os.umask(0o077)  # the journal, update slots, staged downloads and caches: the agent's only
    announce_role(config.audio.device, config.audio.media_role, os.environ)

    app = App(config, load_voices(config))
    install_signals(app.request_stop)
    return app.serve()
