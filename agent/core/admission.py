"""Whether a request may be accepted, decided on arrival against what the node can play: its
voice (as named, by its language, or the selected one), its speaker, the voices its SSML names,
its chime and sounds (a URL within the egress policy), and its start time. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.core.catalog import Catalog
from agent.core.messages import Rejection, SpeakRequest, is_url
from agent.core.reasons import Reason
from agent.core.segments import named_voices


@dataclass(frozen=True, slots=True)
class Timing:
    """The bounds of timed requests (`at`), in seconds: how far ahead, how late, and how long
    before its start one is made ready."""

    max_lead: float = 3600.0
    max_late: float = 10.0
    prepare: float = 5.0


class Admission:
    """The arrival checks of one node's catalog and timing bounds."""

    def __init__(self, catalog: Catalog, timing: Timing) -> None:
        self._catalog = catalog
        self._timing = timing
        self._voices = frozenset(catalog.voices)

    def voice_of(self, request: SpeakRequest, selected: str) -> SpeakRequest | Rejection:
        """The request with its voice (and speaker) decided: as it names them, else the voice
        of its `lang`, else the `selected` voice and speaker (`id` or `id#speaker`)."""
        if request.voice is not None:
            return request
        if request.lang is not None:
            voice = self._catalog.voice_for(request.lang)
            if voice is None:
                known = sorted({f.language for f in self._catalog.voices.values() if f.language})
                detail = f"no voice speaks {request.lang!r} (languages: {', '.join(known)})"
                return Rejection(
                    request.id, Reason.UNKNOWN_LANGUAGE, detail, "lang", request.priority
                )
            return replace(request, voice=voice)
        voice, _, speaker = selected.partition("#")
        return replace(request, voice=voice, speaker=request.speaker or speaker or None)

    def refusal(self, request: SpeakRequest, wall: float) -> Rejection | None:
        """Why a request (its voice decided) cannot be played, or not at its `at` (`wall`: the
        wall-clock time of its arrival), if it cannot."""
        priority = request.priority
        if request.voice not in self._voices:
            known = ", ".join(sorted(self._voices))
            return Rejection(
                request.id, Reason.UNKNOWN_VOICE, f"known voices: {known}", "voice", priority
            )
        if isinstance(request.chime, str) and request.chime not in self._catalog.chimes:
            known = ", ".join(sorted(self._catalog.chimes))
            return Rejection(
                request.id, Reason.UNKNOWN_CHIME, f"known chimes: {known}", "chime", priority
            )
        return self._unplayable(request) or self._untimely(request, wall)

    def voice_is_known(self, voice: str) -> bool:
        """Whether a remembered voice (`id` or `id#speaker`) is still one of the catalog's."""
        voice_id, hash_sign, speaker = voice.partition("#")
        facts = self._catalog.voices.get(voice_id)
        return facts is not None and (not hash_sign or facts.has_speaker(speaker))

    def _unplayable(self, request: SpeakRequest) -> Rejection | None:
        """Why a request's speaker, SSML voices or sounds cannot be played, if they cannot."""
        priority, facts = request.priority, self._catalog.voices[request.voice or "default"]
        if request.speaker is not None and not facts.has_speaker(request.speaker):
            known = ", ".join(facts.speakers) or f"0 to {facts.speaker_count - 1}"
            detail = f"{request.speaker[:64]!r} is no speaker of {request.voice}: {known}"
            return Rejection(request.id, Reason.UNKNOWN_SPEAKER, detail, "speaker", priority)
        unknown = sorted(named_voices(request.document) - self._voices)
        if unknown:
            detail = f"<voice name={unknown[0][:64]!r}>: known voices: {', '.join(self._voices)}"
            return Rejection(request.id, Reason.UNKNOWN_VOICE, detail, "ssml", priority)
        for name in ("sound", "sound_after"):
            sound = getattr(request, name)
            if sound is not None and is_url(sound):
                problem = self._catalog.media_hosts.url_problem(sound)
                if problem is not None:
                    return Rejection(request.id, Reason.URL_NOT_ALLOWED, problem, name, priority)
            elif sound is not None and sound not in self._catalog.sounds:
                known = ", ".join(sorted(self._catalog.sounds)) or "none configured"
                detail = f"{sound!r} is none of audio.media: {known}"
                return Rejection(request.id, Reason.UNKNOWN_SOUND, detail, name, priority)
        return None

    def _untimely(self, request: SpeakRequest, wall: float) -> Rejection | None:
        """Why a timed request cannot start at its `at`, if it cannot."""
        if request.at is None:
            return None
        ahead = request.at - wall
        if ahead > self._timing.max_lead:
            detail = f"{ahead:.0f} s ahead, at most {self._timing.max_lead:g} s"
            return Rejection(request.id, Reason.AT_TOO_FAR, detail, "at", request.priority)
        if ahead < -self._timing.max_late:
            detail = f"{-ahead:.1f} s ago, at most {self._timing.max_late:g} s late"
            return Rejection(request.id, Reason.AT_PASSED, detail, "at", request.priority)
        return None
