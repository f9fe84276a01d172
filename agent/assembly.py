"""The wiring of one agent: every part built from the config and given the parts it works with,
none started. With `app` (which runs the loop over these parts) and `voices` (which loads what
speaks), this is the composition root.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from agent.audio.device import PcmOpener, alsa_opener
from agent.audio.player import IdlePolicy, Player
from agent.core.admission import Timing
from agent.core.catalog import Catalog
from agent.core.egress import EgressPolicy
from agent.core.flood import FloodGate
from agent.core.messages import Priority, SpeakReceived
from agent.core.scheduler import SpeakCore
from agent.formats.media import MAX_AUDIO_BYTES
from agent.link.mqtt.link import MqttLink
from agent.loop.entrance import Entrance
from agent.loop.inbox import Inbox
from agent.loop.voice_swap import SwapDesk
from agent.protocol.hermes_bridge import HermesBridge
from agent.protocol.inputs import HermesRequest, LoopInput
from agent.protocol.rooms import SOURCES
from agent.protocol.routes import overflowed, route_table
from agent.protocol.status import Status
from agent.protocol.topics import Topics
from agent.settings.declarations import DEFAULT_CHIMES, AgentConfig
from agent.settings.loading import resolve_cache_dir, resolve_storage_dir
from agent.speaker_link import RemotePlayer, SpeakerLink
from agent.speech.chimes import ChimePlan, chime_bank
from agent.speech.media_decoder import MediaDecoder
from agent.speech.media_source import FetchLimits, MediaSource
from agent.speech.phrase_cache import PhraseCache
from agent.speech.synthesizer import Synthesizer, VoiceChoice
from agent.speech.urgent import UrgentGate
from agent.speech.voice import Voice
from agent.storage.journal import Journal
from agent.storage.ledger import Ledger
from agent.storage.step_marker import StepMarker
from agent.system import allocator
from agent.system.systemd import Notifier
from agent.updates.update_store import last_result
from agent.updates.updater import Updater
from agent.voices import catalog, factory_model, ota_directory, voice_names

if TYPE_CHECKING:  # imported when the edge node is on: protobuf costs a node without it
    from agent.sparkplug_node import SparkplugNode
    from agent.wyoming_service import Wyoming

REPORT_SLOTS: Final = 256
"""Reports of the workers that can wait in the inbox (a worker waits for room beyond)."""
SOURCE_SLOTS: Final = 256
"""Messages of one source (a topic family, Sparkplug, Wyoming's announce target) that can wait
in the inbox beyond `mqtt.receive_maximum` (more are answered `queue_full` and acknowledged)."""
URGENT_SLOTS: Final = 256
"""Alarm-class requests of one source that can wait in the inbox's urgent lane."""
REFUSAL_SLOTS: Final = 64
"""Answers to messages that found their source full (more are only counted)."""

InboxEvent = LoopInput[Voice]
"""Every input of the loop (`agent/protocol/inputs.py` lists them), with this process's voices."""


@dataclass(frozen=True, slots=True)
class Parts:
    """One agent's parts, built and wired, not yet started."""

    topics: Topics
    inbox: Inbox[InboxEvent]
    catalog: Catalog
    core: SpeakCore
    player: Player | RemotePlayer
    """The speaker: the sounder's, through the pipe (`speaker`), or one of this process's own
    (an engine run on its own, as tests run it)."""
    cache: PhraseCache
    marker: StepMarker
    notes: tuple[str, ...]
    """What is wrong with the files (the journal, the cache, the step marker)."""
    media: MediaSource
    synthesizer: Synthesizer
    status: Status
    hermes: HermesBridge
    flood: FloodGate
    systemd: Notifier
    voice_names: dict[str, str]
    swaps: SwapDesk[Voice]
    updater: Updater[Voice] | None
    link: MqttLink
    ledger: Ledger
    sparkplug: SparkplugNode | None
    """The Sparkplug B edge node (`sparkplug.enabled`)."""
    wyoming: Wyoming | None = None
    """The Wyoming TTS server and its render worker (`wyoming.enabled`)."""
    speaker: SpeakerLink | None = None
    """The pipe to the sounder, when this process is the engine of one."""
    words: Synthesizer | None = None
    """The synthesizer of the alarm lane's words (the sounder asks; with `speaker`)."""
    chime_files: dict[str, bytes] | None = None
    """The chime files as decoded here (for the sounder, which decodes nothing)."""


def assemble(
    config: AgentConfig,
    voices: dict[str, VoiceChoice],
    open_pcm: PcmOpener | None,
    environ: Mapping[str, str],
    speaker: SpeakerLink | None = None,
) -> Parts:
    """Every part of the agent for this config and these loaded voices (`voices` is the
    synthesizer's; the loop keeps its own). The decoder child is started: the chimes are
    decoded in it. With `speaker` this process is the sounder's engine: it plays through the
    sounder, leaves the alarm classes of its own session to it, and says an alarm's words
    when the sounder asks."""
    topics = Topics(config.mqtt.topic_prefix, config.node_id)
    budget = config.mqtt.receive_maximum + SOURCE_SLOTS
    inbox: Inbox[InboxEvent] = Inbox(
        dict.fromkeys(SOURCES, budget),
        default=budget,
        urgent=URGENT_SLOTS,
        refusals=REFUSAL_SLOTS,
        reports=REPORT_SLOTS,
        evicted=_evicted,
    )
    speak, audio, cache = config.speak, config.audio, config.cache
    rate = voices["default"].voice.sample_rate  # the device's; other voices are resampled
    decoder = MediaDecoder()  # every sound file is decoded in its child, chimes too: started
    # when the first one is fetched, ended when idle (docs/memory.md, "The node's processes")
    bank = chime_bank(
        audio.chime_files,
        rate,
        lambda data, at: decoder.decode(data, at, max_bytes=MAX_AUDIO_BYTES).samples,
    )
    timing = Timing(speak.max_lead_seconds, speak.max_late_seconds, speak.prepare_seconds)
    media_hosts = EgressPolicy.parse(audio.media_hosts, "audio.media_hosts")
    known = catalog(voices, frozenset(bank), frozenset(audio.media), media_hosts)
    core = SpeakCore(
        speak.queue_size,
        speak.remembered_ids,
        timing=timing,
        catalog=known,
        media_budget=audio.max_queued_media_bytes,
    )
    report = inbox.report
    player: Player | RemotePlayer
    if speaker is None:
        opener = open_pcm or alsa_opener(audio.device, rate, audio.period_ms, audio.periods)
        idle = IdlePolicy(audio.lead_in_ms / 1000, audio.idle_wake_s, audio.release_when_idle_s)
        player = Player(opener, rate, report, audio.volume, audio.alarm_volume_floor, idle)
    else:
        player = speaker.player
        player.volume = audio.volume  # as the sounder's player began (remembered ones follow)
    cache_dir = resolve_cache_dir(cache, environ)
    phrases = PhraseCache(cache_dir / "phrases", cache.memory_bytes, cache.disk_bytes)
    storage = resolve_storage_dir(config.storage, environ)
    journal, problem = Journal.open_or_renew(
        storage / f"journal-{config.node_id}.sqlite3", speak.remembered_ids
    )
    marker = StepMarker(
        None if journal.path is None else storage, f"steps-{config.node_id}", environ
    )
    by_class = {**DEFAULT_CHIMES, **audio.chimes}
    plan = ChimePlan(
        bank,
        {p: by_class[p.label] for p in Priority if by_class[p.label] != "none"},
        defaults={p: DEFAULT_CHIMES[p.label] for p in Priority},
    )
    limits = FetchLimits(
        audio.max_media_bytes, audio.media_timeout_s, audio.media_stall_timeout_s, media_hosts
    )
    media = MediaSource(audio.media, rate, phrases, limits, decoder, report, allocator.trim)
    # renders (and, with a sounder, this process's own lane) give way to alarms
    gate = UrgentGate() if config.wyoming.enabled or speaker is not None else None
    chunking = (config.tts.first_chunk_phonemes, config.tts.max_chunk_phonemes)
    synthesizer = Synthesizer(
        voices,
        phrases,
        (config.tts.first_chunk_phonemes, config.tts.max_chunk_phonemes),
        player.put,
        report,
        cache.phrases,
        plan,
        max_seconds=speak.max_audio_seconds,
        media=media,
        after_request=allocator.trim,
        steps=marker,
        urgent=gate if speaker is None else None,
        yields_to=gate if speaker is not None else None,
    )
    words = None
    if speaker is not None:  # the alarm lane's words: no chime (the sounder played it)
        words = Synthesizer(
            voices,
            phrases,
            chunking,
            speaker.put_words,
            lambda _event: None,  # its chunks' end says it all
            max_seconds=speak.max_audio_seconds,
            media=media,
            after_request=allocator.trim,
            # no marker file (the sounder counts the engines lost on an alarm's words), but the
            # fault hook: a text that kills the engine in its words' inference, in every engine
            steps=StepMarker(None, f"words-{config.node_id}", environ),
            urgent=gate,
        )
    names = voice_names(voices)
    swaps: SwapDesk[Voice] = SwapDesk(inbox.report)
    updater: Updater[Voice] | None = None
    if config.ota.trusted_keys:
        updater = Updater(
            config.ota,
            ota_directory(config),
            factory_model(config),
            rate,
            config.tts.threads,
            report,
            lambda path: _prewarmed(Voice.load(path, config.tts.threads, cache_dir)),
            swaps.ask,
            cache_dir=cache_dir,  # the check builds the candidate there; the agent only loads
        )
    table = route_table(config, topics, new_id, {n: v for v, n in names.items()})
    # the alarm classes are the sounder's when there is one
    entrance = Entrance(inbox, table, new_id, alarms_elsewhere=speaker is not None)
    link = MqttLink(
        config.mqtt,
        client_id=f"voice-agent-{config.node_id}",
        status_topic=topics.status if speaker is None else topics.engine,
        handlers={t: entrance.message_handler(t) for t in table.routes},
        retained=table.restored,
        on_connected=entrance.connected,
        # the engine's: the broker keeps what the inbox has no room for (a Mosquitto resuming a
        # session sends all it queued at once), read on once there is room, never refused
        # `queue_full`; the alarms this would hold back are the sounder's, read by its own
        # session. Alone (no sounder) it refuses instead, and reads on for an alarm-class one.
        room=entrance.has_room if speaker is not None else None,
        # the sounder says `online` where this session is subscribed, and leads it to its server
        on_session=speaker.session if speaker is not None else None,
    )
    if speaker is not None:
        speaker.follow_with(link.follow)
    status = Status(config, topics)
    if updater is not None and (last := last_result(updater.state)) is not None:
        status.recall_update(*last)  # from before this start (state.json)
    return Parts(
        topics=topics,
        inbox=inbox,
        catalog=known,
        core=core,
        player=player,
        cache=phrases,
        marker=marker,
        notes=tuple(n for n in (problem, phrases.problem, marker.problem) if n),
        media=media,
        synthesizer=synthesizer,
        status=status,
        hermes=HermesBridge(config.hermes.site_id, known),
        flood=FloodGate(),
        systemd=Notifier(environ),
        voice_names=names,
        swaps=swaps,
        updater=updater,
        link=link,
        ledger=Ledger(journal, link, topics.events),
        sparkplug=_sparkplug(config, entrance, None if journal.path is None else storage),
        wyoming=None
        if not config.wyoming.enabled
        else _wyoming(config, voices, phrases, entrance, gate or UrgentGate()),
        speaker=speaker,
        words=words,
        chime_files={name: bytes(bank[name]) for name in audio.chime_files if name in bank},
    )


def _wyoming(
    config: AgentConfig,
    voices: dict[str, VoiceChoice],
    phrases: PhraseCache,
    entrance: Entrance[Voice],
    gate: UrgentGate,
) -> Wyoming:
    """The Wyoming server, its render worker (giving way to the alarms the main synthesizer
    holds `gate` for) and its announce target, whose announcements reach the loop as requests
    that need no acknowledgement (the package imported only when on)."""
    from agent.wyoming_service import build  # noqa: PLC0415 - wyoming only when on

    return build(config, voices, phrases, new_id, entrance.announced, gate=gate)


def _sparkplug(
    config: AgentConfig, entrance: Entrance[Voice], storage: Path | None
) -> SparkplugNode | None:
    """The edge node, its session's events handed to the inbox (`Entrance.sparkplug`): its
    commands ranked by the class they speak at, as the node judges it."""
    if not config.sparkplug.enabled:
        return None
    from agent.sparkplug_node import SparkplugNode  # noqa: PLC0415 - protobuf only when on

    node = SparkplugNode(config, lambda event: entrance.sparkplug(event, node.urgency), storage)
    return node


def _evicted(event: InboxEvent, source: str) -> InboxEvent | None:
    """The answer to an urgent request a higher class took the place of in the inbox."""
    routed = event if isinstance(event, SpeakReceived | HermesRequest) else None
    return overflowed(routed, source, new_id, taken=True)


def new_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def _prewarmed(voice: Voice) -> Voice:
    voice.prewarm()
    return voice
