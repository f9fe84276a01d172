"""Sound file bytes to PCM for the player: decode any common format, mix to mono, resample.

Decoding is libsndfile's, through soundfile (whose wheels bundle libsndfile 1.2 with FLAC, Ogg
Vorbis, Opus, MPEG layer I/II/III (mpg123, LAME)): WAV and WAVE_FORMAT_EXTENSIBLE of 8-bit
unsigned, 16/24/32-bit integer, 32/64-bit float, mu-law, A-law and ADPCM samples; RF64, W64,
AIFF, AU, CAF; FLAC; OGG Vorbis and Opus; MP3 (and MP1/MP2). Resampling is libsoxr's (python-soxr,
"HQ": 20-bit precision). Work is bounded before anything is decoded, from the header: the
input's size, its channels and sample rate, its duration (the output's size) and the samples
to decode (frames x channels: the work); and again while decoding (a header can lie). Blocks
are decoded one at a time, so memory follows the output, never the header. The agent runs this
in a child process of its own (`media_child`), never in its own. No threads, no network, no
files: it is given bytes (the chimes' loader reads a configured file). soundfile (and libsndfile
with it) is imported by the first decode, so the engine, which imports this module for its
resampler and its bounds, does not hold it (~1.7 MB; docs/memory.md).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import soxr

if TYPE_CHECKING:
    import soundfile as sf

from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.formats.pcm import PCM16

Float32 = npt.NDArray[np.float32]

MAX_AUDIO_BYTES: Final = 16 * 1024 * 1024
"""Largest encoded sound accepted (bytes)."""
MAX_AUDIO_SECONDS: Final = 60.0
"""Longest sound accepted (seconds of audio)."""
MAX_CHANNELS: Final = 8
"""Most channels accepted (7.1)."""
MIN_SOURCE_RATE: Final = 1_000
"""Lowest sample rate accepted (Hz)."""
MAX_SOURCE_RATE: Final = 192_000
"""Highest sample rate accepted (Hz): studio masters' highest; FLAC allows 655,350 Hz, where a
340 KB file of silence is 60 s of 8 channels to decode (5 s of CPU)."""
MAX_DECODE_SAMPLES: Final = 24_000_000
"""Most samples decoded for one sound (frames x channels, the decoder's work): 60 s of 7.1 at
48 kHz (23.04 M), or of stereo at 192 kHz, 4 times a 60 s stereo announcement at 48 kHz; about
0.3 s of CPU here (libsndfile and libsoxr)."""
RESAMPLE_QUALITY: Final = "HQ"
"""libsoxr's quality recipe. Measured from 44.1, 48, 24 and 8 kHz to 22.05 and 16 kHz: a 1 kHz
sine within 133 dB of the ideal one (91.8 dB once rounded to 16 bits, the 16-bit limit for a
-6 dBFS sine) and tones above the new Nyquist frequency attenuated by more than 135 dB (linear
interpolation: 25 to 56 dB and 0 to 5 dB); a 10 kHz tone into 22.05 kHz keeps its level
(0.00 dB). 60 s of 48 kHz audio resample in ~22 ms here (VHQ: ~27 ms)."""
_BLOCK_FRAMES: Final = 16_384
"""Frames decoded at a time."""
_UNKNOWN_FRAMES: Final = 2**62
"""libsndfile's frame count of a stream that does not say its length (SF_COUNT_MAX)."""


MEDIA_REASONS: Final = frozenset({Reason.UNSUPPORTED_AUDIO, Reason.TOO_LONG, Reason.TOO_LARGE})
"""Why a sound cannot be played: not a format libsndfile reads, or damaged (garbage, truncated
before its audio), or beyond the channels and sample rates supported; longer than `max_seconds`
(the output's size); more bytes than `max_bytes`, or more samples to decode than
`max_samples`."""


class MediaError(Refused[Reason]):
    """A sound that cannot be decoded within the bounds (a reason of `MEDIA_REASONS`)."""


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
    max_samples: int = MAX_DECODE_SAMPLES,
) -> DecodedAudio:
    """Decode a sound file's bytes to mono 16-bit PCM at `rate` (channels averaged, samples
    rounded, full scale clipped). Raises MediaError."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if len(data) > max_bytes:
        detail = f"{len(data)} bytes, at most {max_bytes} allowed"
        raise MediaError(Reason.TOO_LARGE, detail)
    import soundfile as sf  # noqa: PLC0415 - only where sounds are decoded (module docstring)

    try:
        with sf.SoundFile(io.BytesIO(data)) as sound:
            return _decode(sound, rate, max_seconds, max_samples)
    except sf.LibsndfileError as err:
        raise MediaError(Reason.UNSUPPORTED_AUDIO, _libsndfile_detail(err)) from None
    except (sf.SoundFileError, RuntimeError) as err:
        raise MediaError(Reason.UNSUPPORTED_AUDIO, str(err)[:200]) from None


def to_pcm16(samples: Float32) -> PCM16:
    """Float samples (full scale is 1) to 16-bit PCM: scaled by 32768, rounded, clipped."""
    scaled = np.rint(samples * np.float32(32768.0))
    pcm: PCM16 = np.clip(scaled, -32768, 32767).astype(np.int16)
    return pcm


def _decode(sound: sf.SoundFile, rate: int, max_seconds: float, max_samples: int) -> DecodedAudio:
    channels, source_rate = sound.channels, sound.samplerate
    max_frames = _checked_header(sound, max_seconds, max_samples)
    if sound.format == "MP3":
        # libsndfile 1.2's MP3 decoder skips audio at some block boundaries when read in blocks
        # (measured: jumps at frames 8,192, 20,480, ... of a 1 s tone, whatever the block
        # size), so an MP3 is read at once: at most one frame more than allowed (a header can
        # lie), so its memory stays within the bounds (MP3 has at most 2 channels at 48 kHz:
        # 60 s are 23 MB of float samples).
        block = sound.read(max_frames + 1, dtype="float32", always_2d=True)
        _check_decoded(len(block), channels, source_rate, max_seconds, max_samples)
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
        _check_decoded(decoded, channels, source_rate, max_seconds, max_samples)  # a lying header
        mono = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
        pieces.append(mono if stream is None else stream.resample_chunk(mono))
    if stream is not None:
        pieces.append(stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    samples = to_pcm16(np.concatenate(pieces)) if pieces else np.zeros(0, dtype=np.int16)
    return DecodedAudio(samples, rate, sound.format, sound.subtype, source_rate, channels)


def _checked_header(sound: sf.SoundFile, max_seconds: float, max_samples: int) -> int:
    """The most frames this sound may decode to; raises MediaError when its header already says
    it is beyond a bound (its channels, rate, duration or work), before anything is decoded."""
    channels, source_rate = int(sound.channels), int(sound.samplerate)
    if not 1 <= channels <= MAX_CHANNELS:
        detail = f"{channels} channels, at most {MAX_CHANNELS} supported"
        raise MediaError(Reason.UNSUPPORTED_AUDIO, detail)
    if source_rate < MIN_SOURCE_RATE:
        detail = f"sample rate {source_rate} Hz, at least {MIN_SOURCE_RATE} Hz supported"
        raise MediaError(Reason.UNSUPPORTED_AUDIO, detail)
    if source_rate > MAX_SOURCE_RATE:  # work per second of sound: too large to decode
        detail = f"sample rate {source_rate} Hz, at most {MAX_SOURCE_RATE} Hz decoded"
        raise MediaError(Reason.TOO_LARGE, detail)
    max_frames = min(math.floor(max_seconds * source_rate), max_samples // channels)
    if sound.frames < _UNKNOWN_FRAMES:  # the header says how long: refused before decoding
        _check_decoded(sound.frames, channels, source_rate, max_seconds, max_samples)
    return max_frames


def _check_decoded(
    frames: int, channels: int, source_rate: int, max_seconds: float, max_samples: int
) -> None:
    """Raise MediaError if `frames` of this sound (declared or decoded so far) are beyond the
    duration (too long) or the work (too large)."""
    if frames > math.floor(max_seconds * source_rate):
        raise MediaError(Reason.TOO_LONG, _too_long(frames, source_rate, max_seconds))
    if frames * channels > max_samples:
        detail = (
            f"{channels} channels of {frames / source_rate:.1f} s at {source_rate} Hz: "
            f"{frames * channels} samples or more to decode, at most {max_samples}"
        )
        raise MediaError(Reason.TOO_LARGE, detail)


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
