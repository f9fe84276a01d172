"""The Wyoming service's wiring (imported only when `wyoming.enabled`): the render worker, a
second synthesizer over the node's voices and phrase cache whose output goes to the Wyoming
clients (never the player), driven by the render desk alone; the intake, which decides a
Wyoming text's request by the speak message's rules and the core's admission over the node's
catalog; the announce target (Home Assistant's satellite port, whose announcements go to the
loop as requests), and the server, with the `info`s it answers `describe` with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from wyoming.info import Attribution, Info, Satellite, TtsProgram, TtsVoice, TtsVoiceSpeaker

from agent.core.admission import Admission, Timing
from agent.core.messages import SpeakRequest
from agent.formats.media import MAX_AUDIO_BYTES, MAX_AUDIO_SECONDS
from agent.link.wyoming.render import RenderDesk
from agent.link.wyoming.satellite import AnnounceTarget, Limits
from agent.link.wyoming.server import Intake, WyomingServer
from agent.link.wyoming.zeroconf import (
    Advertised,
    ZeroconfAdvertiser,
    addresses_for,
    instance_name,
)
from agent.protocol.payloads import SpeakLimits
from agent.settings.declarations import AgentConfig
from agent.speech.phrase_cache import PhraseCache
from agent.speech.synthesizer import Synthesizer, VoiceChoice
from agent.speech.urgent import UrgentGate
from agent.system import allocator
from agent.voices import catalog

ATTRIBUTION: Final = Attribution(name="voice-agent", url="https://github.com/OHF-Voice/piper1-gpl")


class RenderWorker:
    """The render synthesizer as the agent drives it: started and stopped with the agent, and
    switched to a new model through the render desk (a switch never raises, however many come
    during a render: the desk hands them over between requests)."""

    def __init__(self, synthesizer: Synthesizer, desk: RenderDesk[VoiceChoice]) -> None:
        self._synthesizer = synthesizer
        self._desk = desk

    def start(self) -> None:
        self._synthesizer.start()

    def stop(self) -> None:
        self._synthesizer.stop()

    def use_voice(self, choice: VoiceChoice) -> None:
        """Replace a voice (a model update or rollback), before the next render."""
        self._desk.use_voice(choice)


@dataclass(slots=True)
class Wyoming:
    """The Wyoming server, and the synthesizer that renders for its clients."""

    server: WyomingServer
    renderer: RenderWorker
    desk: RenderDesk[VoiceChoice]
    satellite: AnnounceTarget | None
    """The announce target (None: `wyoming.satellite_port` 0)."""
    gate: UrgentGate
    """Held by the main synthesizer through an alarm: the render worker waits meanwhile."""
    advertiser: ZeroconfAdvertiser | None = None
    """The services on multicast DNS, once listening (`advertise`)."""

    def advertise(self, config: AgentConfig) -> None:
        """With `wyoming.zeroconf`, advertise the ports just bound as `_wyoming._tcp` (it
        returns at once: zeroconf probes on its own thread; a failure is one warning)."""
        if not config.wyoming.zeroconf:
            return
        services = [Advertised(instance_name(config.node_id), self.server.port)]
        if self.server.satellite_port is not None:
            role = instance_name(config.node_id, "satellite")
            services.append(Advertised(role, self.server.satellite_port))
        self.advertiser = ZeroconfAdvertiser(services, addresses_for(config.wyoming.host))
        self.advertiser.start()

    def stop(self) -> None:
        """The advertisement withdrawn (goodbyes), the server and the render worker stopped."""
        if self.advertiser is not None:
            self.advertiser.stop()
        self.server.stop()
        self.renderer.stop()

    def facts(self) -> dict[str, object]:
        """The state's `wyoming`: connections, renders, whether a render waits for an alarm,
        whether Home Assistant's satellite connection is up (None: no announce target)."""
        satellite = self.satellite
        return {
            "clients": self.server.clients,
            "renders": self.desk.rendered,
            "rendering": self.desk.rendering,
            "waiting_for_alarm": self.gate.waiters > 0,
            "announce_connected": None if satellite is None else satellite.connected,
        }


def build(
    config: AgentConfig,
    voices: dict[str, VoiceChoice],
    phrases: PhraseCache,
    new_id: Callable[[], str],
    announce: Callable[[SpeakRequest], object],
    *,
    gate: UrgentGate,
) -> Wyoming:
    """The server, its render worker and its announce target (whose announcements go to
    `announce`), not started (`voices` is the loop's view: a model update's new default is
    named the same). The render worker waits before each inference while `gate` is held
    (the main synthesizer holds it through an alarm or a critical request)."""
    desk: RenderDesk[VoiceChoice] = RenderDesk(4 * config.wyoming.max_clients, lambda c: c.id)
    renderer = Synthesizer(
        dict(voices),
        phrases,
        (config.tts.first_chunk_phonemes, config.tts.max_chunk_phonemes),
        desk.put,
        lambda _event: None,  # the desk knows a request's end from its last chunk
        max_seconds=config.speak.max_audio_seconds,
        after_request=allocator.trim,
        yields_to=gate,
    )
    desk.bind(renderer)
    rate = voices["default"].voice.sample_rate
    satellite = None
    if config.wyoming.satellite_port:
        seconds = min(config.speak.max_audio_seconds, MAX_AUDIO_SECONDS)  # the decoder's caps
        most = min(config.audio.max_queued_media_bytes, MAX_AUDIO_BYTES)
        limits = Limits(seconds, most)
        name = f"voice-agent {config.node_id}"
        satellite = AnnounceTarget(
            config.wyoming, lambda: satellite_info(name, _version()), announce, new_id, limits
        )
    speak = SpeakLimits(config.speak.max_payload_bytes, config.speak.max_text_chars)
    admission = Admission(catalog(voices, frozenset(), frozenset()), Timing())
    server = WyomingServer(
        config.wyoming,
        lambda: info_for(voices, _version()),
        Intake(admission, speak, new_id),
        desk,
        rate,
        None if satellite is None else satellite.serve,
    )
    return Wyoming(server, RenderWorker(renderer, desk), desk, satellite, gate)


def _version() -> str:
    try:
        return version("voice-agent")
    except PackageNotFoundError:
        return "0"


def info_for(voices: Mapping[str, VoiceChoice], release: str) -> Info:
    """The `info` answer: one TTS program whose voices are the node's (id as name, as in the
    select list: `default` first), each with its language and speakers."""
    tts_voices = []
    for vid, choice in sorted(voices.items(), key=lambda item: (item[0] != "default", item[0])):
        voice_info = choice.voice.info
        language = voice_info.language or "en_US"
        tts_voices.append(
            TtsVoice(
                name=vid,
                attribution=ATTRIBUTION,
                installed=True,
                description=voice_info.label(vid),
                version=choice.voice.sha256[:12],
                languages=[language, language.replace("_", "-")],
                speakers=[TtsVoiceSpeaker(name=s) for s in voice_info.speakers] or None,
            )
        )
    program = TtsProgram(
        name="voice-agent",
        attribution=ATTRIBUTION,
        installed=True,
        description="voice-agent: on-device Piper voices, streamed by clause",
        version=release,
        voices=tts_voices,
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


def satellite_info(name: str, release: str) -> Info:
    """The announce target's `info`: a satellite (Home Assistant makes the entry an
    announce target), and nothing else."""
    satellite = Satellite(
        name=name,
        attribution=ATTRIBUTION,
        installed=True,
        description="voice-agent: announcements through the node's scheduler",
        version=release,
    )
    return Info(satellite=satellite)
