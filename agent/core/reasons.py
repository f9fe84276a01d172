"""Why a request was refused or failed: the `reason` of its `rejected` or `failed` event. One
enum for every edge's refusal of an announcement (`refusal.Refused`)."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """The `reason` field of `rejected` and `failed` events."""

    PAYLOAD_TOO_LARGE = "payload_too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    INVALID_FIELD = "invalid_field"
    EMPTY_TEXT = "empty_text"
    TEXT_TOO_LONG = "text_too_long"
    UNKNOWN_VOICE = "unknown_voice"
    UNKNOWN_CHIME = "unknown_chime"
    UNKNOWN_ID = "unknown_id"
    DUPLICATE_ID = "duplicate_id"
    QUEUE_FULL = "queue_full"
    SYNTHESIS_ERROR = "synthesis_error"
    NO_SPEECH = "no_speech"
    AUDIO_ERROR = "audio_error"
    UNSUPPORTED_AUDIO = "unsupported_audio"
    """A sound file that is no audio the agent can decode (damaged, or a format, channel count
    or sample rate it does not read), or whose decoder died on it."""
    AT_TOO_FAR = "at_too_far"
    """Its `at` is further ahead than `speak.max_lead_seconds`."""
    AT_PASSED = "at_passed"
    """Its `at` passed more than `speak.max_late_seconds` ago."""
    UNKNOWN_SOUND = "unknown_sound"
    """A `sound` that is no name of `audio.media`."""
    SOUND_UNAVAILABLE = "sound_unavailable"
    """A sound that could not be had: its URL failed (the detail starts with a coarse code:
    refused_by_policy, unreachable, http_error, too_large, timeout, incomplete) or its file is
    gone."""
    URL_NOT_ALLOWED = "url_not_allowed"
    """A sound URL that `audio.media_hosts` does not allow (its host or port), or that carries
    credentials: refused on arrival, nothing is fetched."""
    UNKNOWN_SPEAKER = "unknown_speaker"
    """A `speaker` the voice does not have."""
    UNKNOWN_LANGUAGE = "unknown_language"
    """A `lang` no configured voice speaks."""
    INVALID_SSML = "invalid_ssml"
    """SSML that is malformed, hostile or too big (the detail gives line and column)."""
    TOO_LONG = "too_long"
    """Its speech would last longer than `speak.max_audio_seconds`, or a sound longer than a
    minute (from its header, or as it decodes)."""
    TOO_LARGE = "too_large"
    """A sound with more to decode than the agent does for one (over `audio.max_media_bytes`,
    a sample rate over 192 kHz, over 24 M samples of all its channels, or beyond the decoder's
    time or memory)."""
    CRASH_LOOP = "crash_loop"
    """The agent died twice in the same step of this announcement's work (see `ledger`)."""
    DAMAGED_JOURNAL = "damaged_journal"
    """Its journal row, read back after a restart, cannot be used (a damaged card, an edit)."""
    UNSUPPORTED = "unsupported"
    """A kind of request this edge does not take (Wyoming: `text_format: ssml`)."""
    BUSY = "busy"
    """Every connection slot is taken (Wyoming: of its port, or of the peer's address), or
    another peer holds the announce target."""
    INTERNAL = "internal"
    """The agent failed while handling the message (a bug: logged with its traceback)."""
