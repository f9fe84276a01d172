"""What the node says about itself, read from its parts when asked: the facts behind its state
message and Home Assistant's device and entities. Part of the composition root.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from agent import version as package_version
from agent.assembly import Parts
from agent.core.tiers import TierState
from agent.protocol.status import NodeFacts
from agent.speech.synthesizer import VoiceChoice
from agent.speech.voice import Voice
from agent.system.board import board
from agent.system.clock import clock_sync


class FactSheet:
    """The facts of one running agent (its start, its board, and its parts' figures)."""

    def __init__(self, parts: Parts, voices: Mapping[str, VoiceChoice]) -> None:
        self._parts = parts
        self._voices = voices  # the loop's own: a switched model shows at once
        self._started_at = time.monotonic()
        self._started_wall = time.time()
        self._board = board()
        self.tier: TierState | None = None
        """The default voice's tier (the loop's)."""
        self.alarm_lane: tuple[bool, tuple[str, ...]] = (False, ())
        """The sounder's alarm lane as it last told: speaking, the ids that repeat."""
        self.tier_source: tuple[str, str, str] | None = None
        """With the INT8 variant in use: the FP32 model's name and sha256, and the variant's
        sha256. The node still names the FP32 model (what was installed, what the fleet
        tracks); the state's `tier` says which precision of it speaks."""

    def source_sha256(self, voice: Voice) -> str:
        """The sha256 of the model a voice stands for (the FP32 one for its INT8 variant)."""
        if self.tier_source is not None and voice.sha256 == self.tier_source[2]:
            return self.tier_source[1]
        return voice.sha256

    def facts(self, now: float, audio_available: bool, notes: list[str]) -> NodeFacts:
        """The node's facts now (`audio_available` and the files' `notes` are the loop's)."""
        parts = self._parts
        voice = self._voices["default"].voice
        stats = parts.cache.stats()
        updater = parts.updater
        return NodeFacts(
            audio_available=audio_available,
            volume=parts.player.volume,
            selected_voice=parts.core.selected_voice,
            queue_depth=parts.core.queue_depth,
            repeating=(*self.alarm_lane[1], *parts.core.repeating),
            underruns=parts.player.underruns,
            model=self._model_name(voice),
            model_sha256=self.source_sha256(voice),
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
            link_error=parts.link.last_error,
            storage_error=parts.ledger.problem or _joined(notes),
            hermes_muted=parts.hermes.muted,
            uptime_s=now - self._started_at,
            agent_version=package_version(),
            speaking=parts.core.speaking or self.alarm_lane[0],
            voice_loading=not all(choice.voice.loaded for choice in self._voices.values()),
            started_at=self._started_wall,
            voice_names=parts.voice_names,
            board=self._board,
            clock=None if (sync := clock_sync()) is None else sync.as_json(),
            tier=None if self.tier is None else self.tier.as_json(),
            link={"server": parts.link.server, "protocol": parts.link.protocol},
            sparkplug=None if parts.sparkplug is None else {"server": parts.sparkplug.link.server},
            wyoming=None if parts.wyoming is None else parts.wyoming.facts(),
        )

    def _model_name(self, voice: Voice) -> str:
        source = self.tier_source
        return source[0] if source is not None and voice.sha256 == source[2] else voice.path.stem


def _joined(notes: list[str]) -> str | None:
    """The state's word on the files: the first problems, and how many more."""
    if not notes:
        return None
    shown = "; ".join(notes[:3])
    return shown if len(notes) <= 3 else f"{shown}; and {len(notes) - 3} more"
