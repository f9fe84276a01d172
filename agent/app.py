"""The loop of the composition root: over the parts `assembly` built from the config, it hands
every input to the room that owns it and carries out what they decide.

Threads: paho's network thread (routes a message to one event, puts it on the inbox), the synthesis
thread, the ALSA writer thread, the updater's thread, the media source's fetch and decode threads
(the decode thread drives the decoder child process: `media_decoder`), and the main thread
running `App.serve`: the only caller of the core, the Hermes bridge and the status, and the
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
from collections.abc import Callable, Mapping
from typing import Final

from agent.assembly import InboxEvent, assemble, new_id
from agent.audio.device import PcmOpener
from agent.audio.player import announce_role
from agent.core.messages import (
    AudioStatus,
    Delivery,
    Event,
    Lifecycle,
    Notify,
    SpeakReceived,
    SpeakRequest,
    SwapCancelled,
    SwapRequested,
    SynthesisDone,
    Tick,
    UtteranceEnded,
    UtteranceStarted,
)
from agent.core.reasons import Reason
from agent.core.states import UpdateReport
from agent.default_voice import DefaultVoice
from agent.execution import Execution
from agent.fact_sheet import FactSheet
from agent.housekeeping import Housekeeping
from agent.protocol.inputs import (
    AlarmLaneState,
    AlarmNotified,
    Connected,
    HermesRequest,
    HermesToggle,
    HermesVoicesAsked,
    HomeAssistantBirth,
    Ignored,
    OtaCommand,
    SounderNotes,
    SounderReport,
    SparkplugCommand,
    SparkplugConnected,
    SparkplugHostState,
    SparkplugLost,
    SwapAsked,
    SwapWithdrawn,
    TierDecided,
    VoicesLoaded,
)
from agent.protocol.status import NodeFacts
from agent.settings.declarations import AgentConfig
from agent.sounder_duty import SounderDuty
from agent.speaker_link import SpeakerLink
from agent.speech.synthesizer import VoiceChoice
from agent.speech.voice import Voice

_LOGGER = logging.getLogger(__name__)

_TICK_SECONDS: Final = 0.1
"""How often time passes for the core when nothing else happens (deadlines, repeats)."""


class App:
    """One running agent: the core and its edges, wired."""

    def __init__(
        self,
        config: AgentConfig,
        voices: dict[str, VoiceChoice],
        open_pcm: PcmOpener | None = None,
        environ: Mapping[str, str] | None = None,
        speaker: SpeakerLink | None = None,
    ) -> None:
        self._config = config
        self._exit_code = 0
        parts = assemble(
            config, voices, open_pcm, os.environ if environ is None else environ, speaker
        )
        self._chime_files = parts.chime_files or {}
        self._duty: SounderDuty | None = None
        """What this engine owes its sounder (None: this process plays itself)."""
        if parts.speaker is not None and parts.words is not None:
            phrases = [*config.cache.phrases, config.cache.alarm_phrase]
            self._duty = SounderDuty(
                parts.speaker, parts.words, parts.media, config.speak.remembered_ids, phrases
            )
        self._topics = parts.topics
        self._inbox = parts.inbox
        self._core = parts.core
        self._player = parts.player
        self._cache = parts.cache
        self._marker = parts.marker
        self._media = parts.media
        self._synthesizer = parts.synthesizer
        self._status = parts.status
        self._hermes = parts.hermes
        self._systemd = parts.systemd
        self._swaps = parts.swaps
        self._updater = parts.updater
        self._link = parts.link
        self._ledger = parts.ledger
        self._sparkplug = parts.sparkplug
        self._wyoming = parts.wyoming
        self._voice_names = parts.voice_names
        self._notes = list(parts.notes)
        """What is wrong with the files (the journal, the cache): the state's `storage`."""
        self._audio_available = True
        self._sheet = FactSheet(parts, voices)  # the loop's own (the synthesizer's: a copy)
        self._voice = DefaultVoice(config, voices, parts, self._sheet, self._duty)
        self._stopping = False
        self._failures: set[tuple[str, str]] = set()
        self._execution = Execution(config.node_id, parts, self._voice)
        self._housekeeping = Housekeeping(
            parts, self._execution, self._facts, config.homeassistant.prefix
        )

    def report(self, event: InboxEvent) -> None:
        """A report from the sounder's pipe, into the inbox (never dropped)."""
        self._inbox.report(event)

    def request_stop(self) -> None:
        """Ask `serve` to return (safe from a signal handler: it only sets a flag)."""
        self._stopping = True

    def serve(self) -> int:
        """Run until `request_stop` (0) or until the MQTT link fails for good (1); 1 at once
        when the Wyoming port cannot be bound (before any thread or session starts)."""
        if not self._listen():
            return 1
        self._player.open()
        self._player.start()
        self._media.start()
        self._synthesizer.start()
        if self._duty is not None:
            self._duty.serve(self._chime_files, self.request_stop)
        self._voice.start_loading()  # the voices' sessions: cached phrases play meanwhile
        self._restore(time.monotonic())
        self._link.start()
        if self._sparkplug is not None:
            self._sparkplug.link.start()
        self._systemd.notify("READY=1", f"STATUS=Serving {self._topics.speak}")
        _LOGGER.info("Serving node %s on %s/…", self._config.node_id, self._topics.speak[:-6])
        next_tick = time.monotonic()
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
                self._housekeeping(now)
        finally:
            self._systemd.notify("STOPPING=1")
            self._inbox.close()  # workers waiting to report are released
            if self._updater is not None:
                self._updater.stop()
            if self._sparkplug is not None:
                self._sparkplug.link.stop()  # its NDEATH first: the host sees the node go
            if self._wyoming is not None:
                self._wyoming.stop()
            self._link.stop()
            self._player.stop()  # first: a synthesizer waiting on the buffer is released
            self._media.stop()  # and one waiting for a download
            self._synthesizer.stop()
            if self._duty is not None:
                self._duty.stop()
            self._marker.close()
            self._ledger.close()
            _LOGGER.info("Phrase cache: %s", self._cache.stats())
        return self._exit_code

    def _listen(self) -> bool:
        """The Wyoming server listening and its render worker started (before the node says
        it is online); False, logged in one line, when its port cannot be bound."""
        if self._wyoming is None:
            return True
        try:
            self._wyoming.server.start()
        except OSError as err:
            _LOGGER.error("Wyoming: cannot listen: %s", err)
            return False
        self._wyoming.renderer.start()
        self._wyoming.server.start_rendering()
        self._wyoming.advertise(self._config)
        return True

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

    def _dispatch(self, event: InboxEvent | Tick, now: float) -> None:  # noqa: PLR0912, PLR0915 - by kind
        match event:
            case UpdateReport():
                self._update_reported(event, now)
            case SwapAsked():
                self._handle(SwapRequested(self._swaps.taken(event)), now)
            case SwapWithdrawn(token):
                self._handle(SwapCancelled(token), now)
            case Connected():
                self._connected(now)
            case AlarmNotified():
                self._alarm_notified(event.notify, now)
            case AlarmLaneState(speaking, repeating):
                if self._sheet.alarm_lane != (speaking, repeating):
                    self._sheet.alarm_lane = (speaking, repeating)
                    self._status.changed()
            case SounderNotes(notes):
                self._notes += [n for n in notes if n not in self._notes]
                self._status.changed()
            case TierDecided():
                self._voice.tier_decided(event)
            case VoicesLoaded():
                self._voices_loaded(event)
            case HomeAssistantBirth(delivery):
                self._status.home_assistant_born(now, random.uniform(0.5, 5.0))  # noqa: S311
                self._link.ack(delivery)
            case Ignored(delivery):
                self._link.ack(delivery)
            case HermesRequest():
                replies, core_event = self._hermes.request(event)
                for topic, payload in replies:
                    self._execution.publish(topic, payload)
                if core_event is None:
                    self._link.ack(event.delivery)
                else:
                    self._handle(core_event, now)
            case HermesToggle(on, delivery):
                self._hermes.toggle(on)
                self._status.changed()
                self._link.ack(delivery)
            case HermesVoicesAsked(request_id, delivery):
                self._execution.publish(*self._hermes.voices(request_id, self._voice_names))
                self._link.ack(delivery)
            case OtaCommand(offer_id, body, delivery):
                assert self._updater is not None  # noqa: S101 - only routed with an updater
                if body is None:
                    self._update_reported(event.refused(), now)
                else:
                    self._updater.command(offer_id, body)
                self._link.ack(delivery)
            case SparkplugConnected() | SparkplugLost() | SparkplugHostState() | SparkplugCommand():
                assert self._sparkplug is not None  # noqa: S101 - only sent with the edge node
                for follow in self._sparkplug.handle(event):
                    if isinstance(follow, Notify):
                        self._execution.notify(follow, now)
                    else:
                        self._dispatch(follow, now)
            case _:
                self._handle(event, now)

    def _update_reported(self, report: UpdateReport, now: float) -> None:
        notify = self._status.update_reported(report)
        if notify is not None:
            self._execution.notify(notify, now)
        self._execution.publish(*self._status.update_entity(self._facts(now)))

    def _handle(self, event: Event, now: float) -> None:
        """One core event: its journal writes in one transaction (one sync), and only then the
        acknowledgements and events it caused go out. With a sounder, an alarm-class request
        (from Hermes, Sparkplug, Wyoming's announce) is handed to its alarm lane, and an ack
        of an alarm it holds is its."""
        if self._duty is not None and self._duty.takes(event):
            self._link.ack(event.delivery)  # type: ignore[union-attr]
            return
        wall = None  # when its events happened: the audio writer's time for these, else now
        if isinstance(event, UtteranceStarted | UtteranceEnded) and event.wall:
            wall = event.wall
        with self._ledger.transaction():
            for action in self._core.handle(event, now, time.time()):
                self._execution.execute(action, now, wall)
        if isinstance(event, AudioStatus):
            self._audio_available = event.available
        if not isinstance(event, Tick | SynthesisDone):
            self._status.changed()

    def _connected(self, now: float) -> None:
        self._status.connected(now)

    def _alarm_notified(self, notify: Notify, now: float) -> None:
        self._execution.alarm_notified(notify, now)
        if self._duty is not None:
            self._duty.notified(notify)

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
                        self._execution.execute(action, now)
            if isinstance(delivery, Delivery) or subject is not None:
                ended = Lifecycle.REJECTED if isinstance(delivery, Delivery) else Lifecycle.FAILED
                details = {"reason": str(Reason.INTERNAL), "detail": type(err).__name__}
                self._execution.notify(Notify(subject or new_id(), ended, details), now)
        finally:
            if isinstance(delivery, Delivery):
                self._link.ack(delivery)

    # ---- around the events ------------------------------------------------------------------

    def _restore(self, now: float) -> None:
        """After a restart: the death of the previous process is counted against the
        announcement it died on (if it died inside a step of one); unsent events go out again;
        unfinished announcements queue again; those whose journal rows cannot be used end
        `failed` (`damaged_journal`)."""
        restored = self._ledger.unfinished(self._marker.last, self._marker.boot_id)
        self._marker.clear()  # counted (once: the journal keeps the process's token)
        if restored.pending:
            count = len(restored.pending)
            _LOGGER.info("Journal: %d announcements had not ended; queued again", count)
        settings = self._ledger.settings()
        with self._ledger.transaction():
            for notify in restored.damaged:
                self._execution.execute(notify, now)
            actions = self._core.restore(
                restored.pending, restored.ids, restored.fingerprints, now, settings
            )
            for action in actions:
                self._execution.execute(action, now)
        self._notes += self._ledger.notes

    def _facts(self, now: float) -> NodeFacts:
        return self._sheet.facts(now, self._audio_available, self._notes)

    def _voices_loaded(self, event: VoicesLoaded[Voice]) -> None:
        """The voices can speak (`DefaultVoice.loaded`), and the update of this start is
        confirmed (the agent is up with a model that speaks). The configured model not loading
        ends the agent (exit status 1: systemd's restart, and its journal, say so)."""
        if not self._voice.loaded(event):
            self._exit_code = 1
            self._stopping = True
            return
        if self._updater is not None:
            self._updater.started()  # up with the active model: a pending switch is confirmed
            self._updater.start()


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


def run(config: AgentConfig, install_signals: Callable[[Callable[[], None]], None]) -> int:
    """This process alone, with a player of its own (no sounder): serve until a signal asks
    to stop; returns the exit code."""
    from agent.voices import describe_voices  # noqa: PLC0415 - beside run for the CLI

    os.umask(0o077)  # the journal, update slots, staged downloads and caches: the agent's only
    announce_role(config.audio.device, config.audio.media_role, os.environ)

    app = App(config, describe_voices(config))
    install_signals(app.request_stop)
    return app.serve()


def run_engine(
    config: AgentConfig, fd: int, install_signals: Callable[[Callable[[], None]], None]
) -> int:
    """The engine of a sounder: plays through it (the socket `fd`), serves until a signal asks
    to stop or the sounder is gone."""
    import socket  # noqa: PLC0415

    from agent.voices import describe_voices  # noqa: PLC0415 - beside run for the CLI

    os.umask(0o077)
    sock = socket.socket(fileno=fd)
    pending: list[SounderReport] = []
    app: App | None = None

    def report(event: SounderReport) -> None:
        if app is None:
            pending.append(event)  # before the loop exists (the sounder's first credits)
        else:
            app.report(event)

    speaker = SpeakerLink(sock, report)
    speaker.start()
    app = App(config, describe_voices(config), speaker=speaker)
    for event in pending:
        app.report(event)
    install_signals(app.request_stop)
    return app.serve()
