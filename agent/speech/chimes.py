"""Pre-announce chimes: the bank of every chime by name, the built-in tones
(`formats.chimes`) and sound files named in the config.

Every chime is made once at start, at the voice's sample rate, as 16-bit little-endian mono
bytes. Chime files are decoded by the decoder the composition root passes (the decoder child),
never in the agent's own process; one that cannot be decoded is left out, logged, and the
classes that named it keep their built-in chime. Importing this module loads no numpy: a
process that only plays built-in chimes starts without it.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.formats.chimes import BUILTIN, ChimePlan, render_notes
from agent.guarded import nofollow

if TYPE_CHECKING:
    from agent.formats.pcm import PCM16

__all__ = ["ChimePlan", "Decode", "chime_bank", "load_sound"]  # ChimePlan: where the root looks

_LOGGER = logging.getLogger(__name__)

Decode = Callable[[bytes, int], "PCM16"]
"""A sound file's bytes to mono 16-bit PCM at a rate; raises MediaError."""


def load_sound(path: Path, rate: int, decode: Decode | None = None) -> bytes:
    """A sound file (WAV of any sample format, FLAC, Ogg, MP3) as 16-bit little-endian mono
    bytes at `rate` (decoded by `decode`; here, without one): the operator's file, a link
    followed, refused when no regular file or over MAX_AUDIO_BYTES before a byte is read.
    Raises MediaError and OSError."""
    # numpy and the decoders load with the first file, not with the module
    from agent.core.reasons import Reason  # noqa: PLC0415
    from agent.formats.media import MAX_AUDIO_BYTES, MediaError, decode_audio  # noqa: PLC0415
    from agent.formats.pcm import le_bytes  # noqa: PLC0415

    try:  # a FIFO or a device: refused, as an OSError
        data = nofollow.read_regular(path, MAX_AUDIO_BYTES)
    except nofollow.FileRefusedError as err:
        if err.errno != errno.EFBIG:
            raise
        raise MediaError(Reason.TOO_LARGE, str(err.strerror)) from None
    if decode is None:
        return le_bytes(decode_audio(data, rate).samples)
    return le_bytes(decode(data, rate))


def chime_bank(
    files: Mapping[str, Path], rate: int, decode: Decode | None = None
) -> dict[str, bytes]:
    """Every chime by name: the built-ins, then the configured files (which may replace them;
    one that cannot be read or decoded is left out, with an error logged)."""
    bank = {name: render_notes(notes, rate) for name, notes in BUILTIN.items()}
    if not files:
        return bank
    from agent.formats.media import MediaError  # noqa: PLC0415 - with the first file

    for name, path in files.items():
        try:
            bank[name] = load_sound(path, rate, decode)
        except (MediaError, OSError) as err:
            _LOGGER.error("Chime %r (%s) left out: %s", name, path, err)
    return bank
