"""What one request plays, in order, after its chime: a sound, its text or SSML, a sound.

Pure: the request's fields become `ssml` segments (speech, pauses, sounds), with the request's
voice, speaker, rate and volume applied to every piece of speech that does not name its own.
An SSML document is not parsed here: it was, once, on arrival (`SpeakRequest.document`); what
the voice chosen for it changes is said here, plainly: its voice and speaker where the document
names none, and every `say-as` said in that voice's language.
"""

from __future__ import annotations

from dataclasses import replace

from agent.core.messages import SpeakRequest
from agent.core.segments import Segment, Sound, Speech


def program(request: SpeakRequest, voice: str, lang: str) -> tuple[Segment, ...]:
    """The segments of a request whose voice is `voice` (its language `lang`, for `say-as`)."""
    parts: list[Segment] = []
    if request.sound:
        parts.append(Sound(request.sound))
    if request.ssml:
        from agent.formats.ssml import in_language  # noqa: PLC0415 - the SSML parser, when needed

        parts += (_voiced(s, request, voice) for s in in_language(request.document, lang))
    elif request.text:
        parts.append(Speech(request.text, voice=voice, speaker=request.speaker))
    if request.sound_after:
        parts.append(Sound(request.sound_after))
    return tuple(parts)


def _voiced(segment: Segment, request: SpeakRequest, voice: str) -> Segment:
    """A segment with the request's voice and speaker where SSML named none."""
    if isinstance(segment, Speech):
        if segment.voice is None:
            speaker = segment.speaker if segment.speaker is not None else request.speaker
            return replace(segment, voice=voice, speaker=speaker)
        return segment
    if isinstance(segment, Sound):
        fallback = tuple(_voiced(s, request, voice) for s in segment.fallback)
        return replace(segment, fallback=fallback)
    return segment
