"""Sound files to PCM for the player: decode any common format, mix to mono, resample.

Decoding is libsndfile's, through soundfile (whose wheels bundle libsndfile 1.2 with FLAC, Ogg
Vorbis, Opus, MPEG layer I/II/III (mpg123, LAME)): WAV and WAVE_FORMAT_EXTENSIBLE of 8-bit
unsigned, 16/24/32-bit integer, 32/64-bit float, mu-law, A-law and ADPCM samples; RF64, W64,
AIFF, AU, CAF; FLAC; OGG Vorbis and Opus; MP3 (and MP1/MP2). Resampling is libsoxr's (python-soxr,
"HQ": 20-bit precision). Work is bounded: the input's size, its channels, and its duration,
checked from the header before decoding and again while decoding (a header can lie); blocks are
decoded one at a time, so memory follows the output, never the header. No threads, no network.
Allowed imports: stdlib, numpy, soundfile, soxr.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

PCM16 = npt.NDArray[np.int16]
Float32 = npt.NDArray[np.float32]

MAX_AUDIO_BYTES: Final = 16 * 1024 * 1024
"""Largest encoded sound accepted (bytes)."""
MAX_AUDIO_SECONDS: Final = 60.0
"""Longest sound accepted (seconds of audio)."""
MAX_CHANNELS: Final = 8
"""Most channels accepted (7.1)."""
MIN_SOURCE_RATE: Final = 1_000
"""Lowest sample rate accepted (Hz)."""
MAX_SOURCE_RATE: Final = 768_000
"""Highest sample rate accepted (Hz)."""
RESAMPLE_QUALITY: Final = "HQ"
"""libsoxr's quality recipe. Measured from 44.1, 48, 24 and 8 kHz to 22.05 and 16 kHz: a 1 kHz
sine within 133 dB of the ideal one (91.8 dB once rounded to 16 bits, the 16-bit limit for a
-6 dBFS sine) and tones above the new Nyquist frequency attenuated by more than 135 dB (linear
interpolation: 25 to 56 dB and 0 to 5 dB); a 10 kHz tone into 22.05 kHz keeps its level
(0.00 dB). 60 s of 48 kHz audio resample in ~22 ms here (VHQ: ~27 ms)."""
_BLOCK_FRAMES: Final = 16_384
"""Frames decoded at a time."""


class MediaReason(StrEnum):
    """Why a sound cannot be played."""

    UNSUPPORTED_AUDIO = "unsupported_audio"
    """Not a format libsndfile reads, or damaged (garbage, truncated before its audio)."""
    AUDIO_TOO_LONG = "audio_too_long"
    AUDIO_TOO_LARGE = "audio_too_large"


class MediaError(Exception):
    """A sound that cannot be decoded within the bounds."""

    def __init__(self, reason: MediaReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True, eq=False)
class DecodedAudio:
    """A decoded sound: mono 16-bit PCM at the rate asked for, and what it was."""

    samples: PCM16
    rate: int
    """Sample rate of `samples` (Hz)."""
    source_format: str
    """libsndfile's name of the container: WAV, WAVEX, FLAC, OGG, MP3..."""
    source_subtype: str
    """libsndfile's name of the sample encoding: PCM_16, PCM_24, FLOAT, VORBIS, OPUS..."""
    source_rate: int
    source_channels: int

    @property
    def seconds(self) -> float:
        """Duration (seconds)."""
        return len(self.samples) / self.rate


def decode_audio(
    data: bytes,
    rate: int,
    *,
    max_bytes: int = MAX_AUDIO_BYTES,
    max_seconds: float = MAX_AUDIO_SECONDS,
) -> DecodedAudio:
    """Decode a sound file's bytes to mono 16-bit PCM at `rate` (channels averaged, samples
    rounded, full scale clipped). Raises MediaError."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if len(data) > max_bytes:
        detail = f"{len(data)} bytes, at most {max_bytes} allowed"
        raise MediaError(MediaReason.AUDIO_TOO_LARGE, detail)
    try:
        with sf.SoundFile(io.BytesIO(data)) as sound:
            return _decode(sound, rate, max_seconds)
    except sf.LibsndfileError as err:
        raise MediaError(MediaReason.UNSUPPORTED_AUDIO, _libsndfile_detail(err)) from None
    except (sf.SoundFileError, RuntimeError) as err:
        raise MediaError(MediaReason.UNSUPPORTED_AUDIO, str(err)[:200]) from None


def decode_file(
    path: Path,
    rate: int,
    *,
    max_bytes: int = MAX_AUDIO_BYTES,
    max_seconds: float = MAX_AUDIO_SECONDS,
) -> DecodedAudio:
    """`decode_audio` of a file, refused by its size before it is read. Raises MediaError and
    OSError."""
    size = path.stat().st_size
    if size > max_bytes:
        detail = f"{path.name}: {size} bytes, at most {max_bytes} allowed"
        raise MediaError(MediaReason.AUDIO_TOO_LARGE, detail)
    with path.open("rb") as file:
        data = file.read(max_bytes + 1)  # the file may have grown since
    return decode_audio(data, rate, max_bytes=max_bytes, max_seconds=max_seconds)


def to_pcm16(samples: Float32) -> PCM16:
    """Float samples (full scale is 1) to 16-bit PCM: scaled by 32768, rounded, clipped."""
    scaled = np.rint(samples * np.float32(32768.0))
    pcm: PCM16 = np.clip(scaled, -32768, 32767).astype(np.int16)
    return pcm


def _decode(sound: sf.SoundFile, rate: int, max_seconds: float) -> DecodedAudio:
    channels, source_rate = sound.channels, sound.samplerate
    if not 1 <= channels <= MAX_CHANNELS:
        detail = f"{channels} channels, at most {MAX_CHANNELS} supported"
        raise MediaError(MediaReason.UNSUPPORTED_AUDIO, detail)
    if not MIN_SOURCE_RATE <= source_rate <= MAX_SOURCE_RATE:
        detail = f"sample rate {source_rate} Hz, {MIN_SOURCE_RATE}-{MAX_SOURCE_RATE} supported"
        raise MediaError(MediaReason.UNSUPPORTED_AUDIO, detail)
    max_frames = math.floor(max_seconds * source_rate)
    if sound.frames > max_frames:  # the header says so: refused before decoding anything
        raise MediaError(
            MediaReason.AUDIO_TOO_LONG, _too_long(sound.frames, source_rate, max_seconds)
        )
    if sound.format == "MP3":
        # libsndfile 1.2's MP3 decoder skips audio at some block boundaries when read in blocks
        # (measured: jumps at frames 8,192, 20,480, ... of a 1 s tone, whatever the block
        # size), so an MP3 is read at once: at most one frame more than allowed (a header can
        # lie), so its memory stays within `max_seconds` of audio.
        block = sound.read(max_frames + 1, dtype="float32", always_2d=True)
        if len(block) > max_frames:
            raise MediaError(
                MediaReason.AUDIO_TOO_LONG, _too_long(len(block), source_rate, max_seconds)
            )
        mono: Float32 = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
        if source_rate != rate and len(mono):
            mono = soxr.resample(mono, source_rate, rate, quality=RESAMPLE_QUALITY)
        return DecodedAudio(
            to_pcm16(mono), rate, sound.format, sound.subtype, source_rate, channels
        )
    stream = None
    if source_rate != rate:
        stream = soxr.ResampleStream(
            source_rate, rate, 1, dtype="float32", quality=RESAMPLE_QUALITY
        )
    pieces: list[Float32] = []
    decoded = 0
    while True:
        block = sound.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
        if not len(block):
            break
        decoded += len(block)
        if decoded > max_frames:  # more than the header said
            raise MediaError(
                MediaReason.AUDIO_TOO_LONG, _too_long(decoded, source_rate, max_seconds)
            )
        mono = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
        pieces.append(mono if stream is None else stream.resample_chunk(mono))
    if stream is not None:
        pieces.append(stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    samples = to_pcm16(np.concatenate(pieces)) if pieces else np.zeros(0, dtype=np.int16)
    return DecodedAudio(samples, rate, sound.format, sound.subtype, source_rate, channels)


def _too_long(frames: int, source_rate: int, max_seconds: float) -> str:
    return f"{frames / source_rate:.1f} s or more, at most {max_seconds:g} s allowed"


def _libsndfile_detail(err: sf.LibsndfileError) -> str:
    """libsndfile's own words, without the repr of the in-memory file."""
    return str(err.error_string).strip()[:200] or "libsndfile could not read it"


class Resampler:
    """A stream of float chunks from one rate to another (libsoxr, RESAMPLE_QUALITY): chunks
    join without a seam; `flush` gives the filter's tail at the end."""

    def __init__(self, source_rate: int, rate: int) -> None:
        self._stream = soxr.ResampleStream(
            source_rate, rate, 1, dtype="float32", quality=RESAMPLE_QUALITY
        )

    def __call__(self, chunk: Float32) -> Float32:
        """The next resampled part (may be shorter or longer than in proportion)."""
        out: Float32 = self._stream.resample_chunk(chunk.astype(np.float32, copy=False))
        return out

    def flush(self) -> Float32:
        """What is left once the input ended."""
        out: Float32 = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return out
