"""What a node can play, for deciding on arrival: its voices (language, speakers), chimes,
named sounds, and the hosts its sound URLs may come from. Pure: built once by the composition
root from the loaded voices and the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.core.egress import EgressPolicy


@dataclass(frozen=True, slots=True)
class VoiceFacts:
    """What a voice's JSON says that matters for choosing it."""

    language: str = ""
    """Its language code, e.g. `en_US` (empty: unknown)."""
    speakers: tuple[str, ...] = ()
    """Speaker names of a multi-speaker voice, by id order."""
    speaker_count: int = 1

    def has_speaker(self, speaker: str) -> bool:
        """Whether `speaker` (a name, or a number as text) is one of its speakers."""
        if speaker in self.speakers:
            return True
        return speaker.isdecimal() and int(speaker) < self.speaker_count


def facts_from_json(raw: object) -> VoiceFacts:
    """What a Piper voice's JSON (`<model>.onnx.json`) says about choosing it; anything missing
    or of the wrong kind is left at its default."""
    if not isinstance(raw, dict):
        return VoiceFacts()
    language = raw.get("language")
    code = language.get("code") if isinstance(language, dict) else None
    speakers = raw.get("speaker_id_map")
    names: tuple[str, ...] = ()
    if isinstance(speakers, dict) and all(isinstance(v, int) for v in speakers.values()):
        names = tuple(sorted((str(k) for k in speakers), key=lambda k: speakers[k]))
    count = raw.get("num_speakers")
    return VoiceFacts(
        code if isinstance(code, str) else "",
        names,
        count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1,
    )


def language_key(code: str) -> tuple[str, str]:
    """(language, region) of a code written `de`, `de_DE`, `de-de`: lower case."""
    language, _, region = code.replace("-", "_").partition("_")
    return language.lower(), region.split("_")[0].lower()


@dataclass(frozen=True, slots=True)
class Catalog:
    """The voices by id, the chime names, the media names and the media hosts of one node."""

    voices: Mapping[str, VoiceFacts] = field(default_factory=lambda: {"default": VoiceFacts()})
    chimes: frozenset[str] = frozenset()
    sounds: frozenset[str] = frozenset()
    media_hosts: EgressPolicy = field(default_factory=EgressPolicy)
    """Where sound URLs may be fetched from (`audio.media_hosts`; empty: URL sounds are off)."""

    def voice_for(self, lang: str) -> str | None:
        """The voice that speaks `lang`: one of the same language and region first, then one of
        the same language; `default` first among equals; None if none does."""
        language, region = language_key(lang)
        ranked: list[tuple[int, int, str]] = []
        for voice_id, facts in self.voices.items():
            has_language, has_region = language_key(facts.language) if facts.language else ("", "")
            if has_language != language:
                continue
            exact = 0 if (region and has_region == region) or not region else 1
            ranked.append((exact, 0 if voice_id == "default" else 1, voice_id))
        return min(ranked)[2] if ranked else None

    def pairs(self) -> list[tuple[str, str | None]]:
        """Every voice, and every speaker of a multi-speaker voice: (voice id, speaker name or
        None), in a stable order (default first)."""
        out: list[tuple[str, str | None]] = []
        for voice_id in sorted(self.voices, key=lambda v: (v != "default", v)):
            facts = self.voices[voice_id]
            if facts.speakers:
                out += [(voice_id, name) for name in facts.speakers]
            else:
                out.append((voice_id, None))
        return out
