"""The Hermes protocol (Rhasspy, Node-RED): its messages to requests and its replies. Pure.

JSON keys are camelCase as in rhasspy-hermes. A message for another site id is ignored (None).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agent.core.messages import AudioClip, Rejection, SpeakRequest
from agent.core.reasons import Reason
from agent.core.states import HermesKind
from agent.protocol.payloads import LANGUAGE as _LANGUAGE
from agent.protocol.payloads import (
    SpeakLimits,
    finish_request,
    got,
    number_in,
    parse_json_object,
    too_deep,
)

SAY: Final = "hermes/tts/say"
SAY_FINISHED: Final = "hermes/tts/sayFinished"
TTS_ERROR: Final = "hermes/error/tts"
PLAY_ERROR: Final = "hermes/error/audioServer/play"
TOGGLE_ON: Final = "hermes/audioServer/toggleOn"
TOGGLE_OFF: Final = "hermes/audioServer/toggleOff"
SET_VOLUME: Final = "rhasspy/audioServer/setVolume"
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
    id: object
    """The say's `id` as it came (any JSON value), or the request id from the topic (play)."""
    site_id: str
    session_id: object
    """The `sessionId` as it came (any JSON value; None when absent)."""


def parse_say(
    payload: bytes, site_id: str, limits: SpeakLimits, new_id: Callable[[], str]
) -> tuple[SpeakRequest | Rejection, HermesContext] | None:
    """`hermes/tts/say` (text, siteId, lang, id, sessionId, volume) for this site: the request,
    or why it cannot be served, with what the replies must echo; None for another site.

    `id` and `sessionId` are echoed as they came (a string, a number, null): they correlate the
    replies, they are not dedupe keys, so the request's own id is a fresh one. `volume` null is
    1 (rhasspy-hermes sends null when unset). A payload that is no valid JSON object is answered
    too, as well as it can be read (its site, its id): a dialogue must never wait for a reply
    that never comes.
    """
    obj = parse_json_object(payload, limits.max_bytes, new_id)
    loose = obj if not isinstance(obj, Rejection) else _loose_object(payload)
    if loose.get("siteId", "default") != site_id:
        return None
    context = HermesContext(
        HermesKind.SAY, echoed(loose.get("id")), site_id, echoed(loose.get("sessionId"))
    )
    request_id = f"hermes-{new_id()[:16]}"
    if isinstance(obj, Rejection):
        return Rejection(request_id, obj.reason, obj.detail, obj.field), context
    text = obj.get("text")
    if not isinstance(text, str):
        return Rejection(request_id, Reason.INVALID_FIELD, "expected a string", "text"), context
    raw = obj.get("volume")
    volume = 1.0 if raw is None else number_in(raw, 0.0, 1.0)
    if volume is None:
        detail = f"expected a number from 0 to 1, got {got(raw)}"
        return Rejection(request_id, Reason.INVALID_FIELD, detail, "volume"), context
    lang = obj.get("lang")
    lang = lang if isinstance(lang, str) and _LANGUAGE.fullmatch(lang) else None
    request = SpeakRequest(request_id, text, volume=volume, lang=lang)
    return finish_request(request, limits), context


MAX_LOOSE_BYTES: Final = 1 << 20
"""A say too big to be served is still read for its site and ids up to this size."""


def _loose_object(payload: bytes) -> dict[str, Any]:
    """The payload as a JSON object, however bad its content (for its site and ids only);
    nothing of it when it nests too deep, whether or not the decoder got through."""
    if len(payload) > MAX_LOOSE_BYTES:
        return {}
    with contextlib.suppress(ValueError, RecursionError):
        obj = json.loads(payload.decode("utf-8", "replace").removeprefix("\ufeff"))
        if isinstance(obj, dict) and not too_deep(obj):
            return obj
    return {}


def parse_play_bytes(
    topic: str, payload: bytes, site_id: str, new_id: Callable[[], str]
) -> tuple[SpeakRequest | Rejection, HermesContext] | None:
    """`hermes/audioServer/<siteId>/playBytes/<requestId>`: a sound file as the payload (any
    format Rhasspy plays: decoded when its turn comes, a failure answered then). The request id
    is echoed (as `id`, and as `sessionId`, as Rhasspy's audio server does); the request's own
    id is a fresh one: Node-RED sends `playBytes/doorbell` every time."""
    parts = topic.split("/")
    if len(parts) != 5 or parts[2] != site_id:
        return None
    context = HermesContext(HermesKind.PLAY, parts[4], site_id, parts[4])
    request_id = f"play-{new_id()[:16]}"
    if not payload:
        return Rejection(request_id, Reason.INVALID_FIELD, "no audio", "audio"), context
    return SpeakRequest(request_id, "(Hermes audio)", audio=AudioClip(payload)), context


def parse_set_volume(payload: bytes, site_id: str) -> float | Rejection | None:
    """`rhasspy/audioServer/setVolume` for this site: the volume, 0 to 1 (None: another site)."""
    obj = parse_json_object(payload, 4096, lambda: "setVolume")
    if isinstance(obj, Rejection):
        return None
    if obj.get("siteId", "default") != site_id:
        return None
    raw = obj.get("volume")
    volume = number_in(raw, 0.0, 1.0)
    if volume is None:
        detail = f"expected a number from 0 to 1, got {got(raw)}"
        return Rejection("setVolume", Reason.INVALID_FIELD, detail, "volume")
    return volume


def parse_site(payload: bytes, site_id: str) -> bool:
    """Whether a toggleOn/toggleOff message is for this site."""
    obj = parse_json_object(payload, 4096, lambda: "")
    return not isinstance(obj, Rejection) and obj.get("siteId", "default") == site_id


def finished(context: HermesContext) -> Reply:
    """sayFinished or playFinished for a request that ended."""
    if context.kind == HermesKind.SAY:
        body = {"siteId": context.site_id, "id": context.id, "sessionId": context.session_id}
        return SAY_FINISHED, _json(body)
    body = {"id": context.id, "sessionId": context.session_id, "siteId": context.site_id}
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
    """A getVoices request for this site (its JSON object, its `id` as `echoed` makes it), or
    None."""
    obj = parse_json_object(payload, 4096, lambda: "")
    if isinstance(obj, Rejection) or obj.get("siteId", "default") != site_id:
        return None
    return {**obj, "id": echoed(obj.get("id"))}


def echoed(value: object) -> object:
    """A correlation value (`id`, `sessionId`) as a reply echoes it: a JSON scalar as it came
    (a string, a finite number, a boolean, null); anything else (an object, an array, NaN, an
    infinity, which strict JSON cannot carry) as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, str | int | float | bool) else None


def voices_reply(request_id: object, site_id: str, voices: Mapping[str, str]) -> Reply:
    """rhasspy/tts/voices: the voices by id with a description, echoing the request's id."""
    listed = [{"voiceId": vid, "description": text} for vid, text in voices.items()]
    return VOICES, _json({"voices": listed, "id": request_id, "siteId": site_id})


def _json(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")
