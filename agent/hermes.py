"""The Hermes protocol (Rhasspy, Node-RED): its messages to requests and its replies. Pure.

JSON keys are camelCase as in rhasspy-hermes. A message for another site id is ignored (None).
Allowed imports: stdlib, `messages`, `payloads`, `states`.
"""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .messages import AudioClip, Reason, Rejection, SpeakRequest
from .payloads import SpeakLimits, finish_request, parse_json_object
from .states import HermesKind

SAY: Final = "hermes/tts/say"
SAY_FINISHED: Final = "hermes/tts/sayFinished"
TTS_ERROR: Final = "hermes/error/tts"
PLAY_ERROR: Final = "hermes/error/audioServer/play"
TOGGLE_ON: Final = "hermes/audioServer/toggleOn"
TOGGLE_OFF: Final = "hermes/audioServer/toggleOff"
GET_VOICES: Final = "rhasspy/tts/getVoices"
VOICES: Final = "rhasspy/tts/voices"

Reply = tuple[str, bytes]
"""A topic and its JSON payload."""


def play_bytes_topic(site_id: str) -> str:
    """The subscription for WAV playback requests to this site (request id last)."""
    return f"hermes/audioServer/{site_id}/playBytes/+"


@dataclass(frozen=True, slots=True)
class HermesContext:
    """What a Hermes reply must echo."""

    kind: HermesKind
    id: str | None
    """The request's `id` (say) or request id from the topic (play)."""
    site_id: str
    session_id: str | None


def parse_say(
    payload: bytes, site_id: str, limits: SpeakLimits, new_id: Callable[[], str]
) -> tuple[SpeakRequest, HermesContext] | Rejection | None:
    """`hermes/tts/say`: text, siteId, lang, id, sessionId, volume."""
    obj = parse_json_object(payload, limits.max_bytes, new_id)
    if isinstance(obj, Rejection):
        return obj
    if obj.get("siteId", "default") != site_id:
        return None
    raw_id = obj.get("id")
    hermes_id = raw_id if isinstance(raw_id, str) and raw_id else None
    session = obj.get("sessionId") if isinstance(obj.get("sessionId"), str) else None
    context = HermesContext(HermesKind.SAY, hermes_id, site_id, session)
    request_id = f"hermes-{hermes_id}" if hermes_id else f"hermes-{new_id()}"
    text = obj.get("text")
    if not isinstance(text, str):
        return Rejection(request_id, Reason.INVALID_FIELD, "expected a string", "text")
    volume = obj.get("volume", 1.0)
    if isinstance(volume, bool) or not isinstance(volume, int | float) or not 0 <= volume <= 1:
        return Rejection(
            request_id, Reason.INVALID_FIELD, "expected a number from 0 to 1", "volume"
        )
    request = finish_request(SpeakRequest(request_id, text, volume=float(volume)), limits)
    return request if isinstance(request, Rejection) else (request, context)


def parse_play_bytes(
    topic: str, payload: bytes, site_id: str, new_id: Callable[[], str]
) -> tuple[SpeakRequest, HermesContext] | Rejection | None:
    """`hermes/audioServer/<siteId>/playBytes/<requestId>`: a WAV file as the payload."""
    parts = topic.split("/")
    if len(parts) != 5 or parts[2] != site_id:
        return None
    request_id = parts[4] or new_id()
    context = HermesContext(HermesKind.PLAY, request_id, site_id, None)
    try:
        with wave.open(io.BytesIO(payload), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError, ValueError) as err:
        return Rejection(
            f"play-{request_id}", Reason.INVALID_FIELD, f"not a WAV file: {err}", "wav"
        )
    if width != 2 or not 1 <= channels <= 8 or not 4000 <= rate <= 192000 or not frames:
        detail = f"expected 16-bit PCM with audio, got {8 * width}-bit, {channels} ch, {rate} Hz"
        return Rejection(f"play-{request_id}", Reason.INVALID_FIELD, detail, "wav")
    clip = AudioClip(rate, channels, frames)
    return SpeakRequest(f"play-{request_id}", "(Hermes audio)", audio=clip), context


def parse_site(payload: bytes, site_id: str) -> bool:
    """Whether a toggleOn/toggleOff message is for this site."""
    obj = parse_json_object(payload, 4096, lambda: "")
    return not isinstance(obj, Rejection) and obj.get("siteId", "default") == site_id


def finished(context: HermesContext) -> Reply:
    """sayFinished or playFinished for a request that ended."""
    if context.kind == HermesKind.SAY:
        body = {"siteId": context.site_id, "id": context.id, "sessionId": context.session_id}
        return SAY_FINISHED, _json(body)
    body = {"id": context.id, "sessionId": context.session_id}
    return f"hermes/audioServer/{context.site_id}/playFinished", _json(body)


def error(context: HermesContext, message: str) -> Reply:
    """hermes/error/tts or hermes/error/audioServer/play."""
    body = {
        "error": message,
        "context": context.id,
        "siteId": context.site_id,
        "sessionId": context.session_id,
    }
    return (TTS_ERROR if context.kind == HermesKind.SAY else PLAY_ERROR), _json(body)


def parse_get_voices(payload: bytes, site_id: str) -> dict[str, Any] | None:
    """A getVoices request for this site (its JSON object), or None."""
    obj = parse_json_object(payload, 4096, lambda: "")
    if isinstance(obj, Rejection) or obj.get("siteId", "default") != site_id:
        return None
    return obj


def voices_reply(request_id: object, site_id: str, voices: Mapping[str, str]) -> Reply:
    """rhasspy/tts/voices: the voices by id with a description, echoing the request's id."""
    listed = [{"voiceId": vid, "description": text} for vid, text in voices.items()]
    return VOICES, _json({"voices": listed, "id": request_id, "siteId": site_id})


def _json(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")
