"""Sound files for the media tests: one known tone written in every format the agent decodes,
and the same files decoded independently of the agent (soundfile, a channel mean, libsoxr)."""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

Samples = npt.NDArray[np.float64]

TONE_HZ: Final = 440.0
"""Frequency of the test tone (Hz)."""
TONE_PEAK: Final = 0.5
"""Peak of the tone on each channel (full scale is 1): -6 dBFS."""
OVERTONE_HZ: Final = 15_000.0
"""An inaudible-to-the-device partial (Hz), above the device's Nyquist frequency (11,025 Hz):
in every source that can hold it (rates over 30 kHz), so a resampler that lets it alias
(linear interpolation folds it to 7,050 Hz from 44.1 kHz) is caught."""
OVERTONE_PEAK: Final = 0.1
"""Peak of the overtone (full scale is 1): -20 dBFS."""
TONE_SECONDS: Final = 0.4
"""Length of every test file (seconds)."""
FADE_SECONDS: Final = 0.01
"""Raised-cosine fade at each end (seconds): no click, and an envelope that pins alignment."""
RESAMPLE_QUALITY: Final = "HQ"
"""libsoxr's recipe for the independent decode (the agent's documented one)."""
_SUFFIXES: Final = {"WAV": ".wav", "WAVEX": ".wav", "FLAC": ".flac", "OGG": ".ogg", "MP3": ".mp3"}
_ENCODER_OPTIONS: Final[dict[str, dict[str, object]]] = {
    "FLAC": {"compression_level": 0.5},
    "OGG": {"compression_level": 0.0},  # best quality: the level and pitch checks are tight
    "MP3": {"compression_level": 0.0, "bitrate_mode": "CONSTANT"},
}


@dataclass(frozen=True, slots=True)
class MediaSpec:
    """One test file: its name in `audio.media` and how it is encoded."""

    name: str
    format: str
    """libsndfile's container name: WAV, WAVEX, FLAC, OGG, MP3."""
    subtype: str
    """libsndfile's sample encoding: PCM_16, FLOAT, VORBIS, OPUS, MPEG_LAYER_III..."""
    rate: int
    """Source sample rate (Hz)."""
    channels: int = 1
    lossy: bool = False
    """Decoded samples differ from the source by more than rounding (Vorbis, Opus, MP3)."""
    hz: float = TONE_HZ
    """Frequency of its tone (Hz)."""

    @property
    def filename(self) -> str:
        """The file's name, with the suffix its format usually has."""
        return self.name + _SUFFIXES[self.format]


SPECS: Final = (
    MediaSpec("wav_u8", "WAV", "PCM_U8", 8000),
    MediaSpec("wav_16", "WAV", "PCM_16", 44100),
    MediaSpec("wav_24", "WAV", "PCM_24", 48000),
    MediaSpec("wav_32", "WAV", "PCM_32", 22050),  # the device's rate: no resampling
    MediaSpec("wav_float", "WAV", "FLOAT", 16000),
    MediaSpec("wav_double", "WAV", "DOUBLE", 96000),
    MediaSpec("wav_ulaw", "WAV", "ULAW", 8000),
    MediaSpec("wav_alaw", "WAV", "ALAW", 8000),
    MediaSpec("wav_stereo", "WAV", "PCM_16", 48000, channels=2),
    MediaSpec("wavex_5_1", "WAVEX", "PCM_24", 44100, channels=6),
    MediaSpec("flac_16", "FLAC", "PCM_16", 44100),
    MediaSpec("flac_24_stereo", "FLAC", "PCM_24", 96000, channels=2),
    MediaSpec("ogg_vorbis", "OGG", "VORBIS", 44100, lossy=True),
    MediaSpec("ogg_vorbis_stereo", "OGG", "VORBIS", 48000, channels=2, lossy=True),
    MediaSpec("ogg_opus", "OGG", "OPUS", 48000, lossy=True),
    MediaSpec("mp3", "MP3", "MPEG_LAYER_III", 44100, lossy=True),
    MediaSpec("mp3_stereo", "MP3", "MPEG_LAYER_III", 22050, channels=2, lossy=True),
)
"""Every format and sample encoding the agent documents, at several source rates."""
OTHER_TONE: Final = MediaSpec("other_tone", "MP3", "MPEG_LAYER_III", 44100, lossy=True, hz=660.0)
"""A second sound, told apart from the others by its pitch (not in SPECS)."""
BY_NAME: Final = {spec.name: spec for spec in (*SPECS, OTHER_TONE)}


def tone(
    rate: int, channels: int = 1, seconds: float = TONE_SECONDS, hz: float = TONE_HZ
) -> Samples:
    """The test tone, shape (frames, channels): a sine (440 Hz) at -6 dBFS with faded ends,
    plus the overtone where `rate` holds it; channel c shifted by c/(channels - 1) of a quarter
    period, so a mix that is not the channels' mean (one channel, or their sum) changes the
    level or the phase."""
    t = np.arange(round(rate * seconds)) / rate
    fade = min(round(rate * FADE_SECONDS), len(t) // 2)
    envelope = np.ones(len(t))
    ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(fade) / fade)
    envelope[:fade], envelope[len(t) - fade :] = ramp, ramp[::-1]
    shift = np.pi / 2 / max(channels - 1, 1)
    phases = shift * np.arange(channels)
    waves = TONE_PEAK * np.sin(2 * np.pi * hz * t[:, None] + phases[None, :])
    if rate > 2 * OVERTONE_HZ:
        waves += OVERTONE_PEAK * np.sin(2 * np.pi * OVERTONE_HZ * t[:, None] + phases[None, :])
    result: Samples = envelope[:, None] * waves
    return result


def ideal_mono(spec: MediaSpec, rate: int) -> Samples:
    """What the file should sound like at `rate`: its tone generated there (so without the
    overtone at the device's rate), channels averaged (no codec, no resampler)."""
    result: Samples = tone(rate, spec.channels, hz=spec.hz).mean(axis=1)
    return result


def check_supported(spec: MediaSpec) -> None:
    """Fail loudly (never skip) when this soundfile/libsndfile cannot write the format."""
    formats = sf.available_formats()
    if spec.format not in formats:
        raise RuntimeError(
            f"libsndfile {sf.__libsndfile_version__} has no {spec.format} format "
            f"(has {sorted(formats)}): install a soundfile wheel that bundles it"
        )
    subtypes = sf.available_subtypes(spec.format)
    if spec.subtype not in subtypes:
        raise RuntimeError(
            f"libsndfile {sf.__libsndfile_version__} cannot write {spec.format}/{spec.subtype} "
            f"(has {sorted(subtypes)}): install a soundfile wheel that bundles it"
        )


def write_media(directory: Path, spec: MediaSpec) -> Path:
    """Write one test file into `directory`; returns its path."""
    check_supported(spec)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / spec.filename
    options = _ENCODER_OPTIONS.get(spec.format, {})
    data = tone(spec.rate, spec.channels, hz=spec.hz)
    sf.write(path, data, spec.rate, format=spec.format, subtype=spec.subtype, **options)
    with sf.SoundFile(path) as written:  # what was asked for, not a fallback
        assert (written.format, written.subtype) == (spec.format, spec.subtype), path
        assert (written.samplerate, written.channels) == (spec.rate, spec.channels), path
    return path


def write_all(directory: Path) -> dict[str, Path]:
    """Write every file of SPECS and OTHER_TONE; returns name -> path (the shape of
    `audio.media`)."""
    return {spec.name: write_media(directory, spec) for spec in BY_NAME.values()}


def write_garbage(path: Path, size: int = 20_000) -> Path:
    """Bytes that no decoder reads as sound (a fixed pseudo-random pattern)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes())
    return path


def decode_reference(data: Path | bytes, rate: int) -> Samples:
    """The file decoded without the agent's code: soundfile reads it whole as float, the
    channels are averaged, libsoxr resamples it to `rate` in one call. Full scale is 1."""
    source = data if isinstance(data, Path) else io.BytesIO(data)
    frames, source_rate = sf.read(source, dtype="float32", always_2d=True)
    mono = frames.mean(axis=1, dtype=np.float32)
    if source_rate != rate:
        mono = soxr.resample(mono, source_rate, rate, quality=RESAMPLE_QUALITY)
    result: Samples = np.asarray(mono, dtype=np.float64)
    return result


# ---- hostile files ------------------------------------------------------------------------

BOMB_RATE: Final = 655_350
"""FLAC's highest sample rate (Hz): the issue's decode bomb."""
BOMB_CHANNELS: Final = 8
BOMB_SECONDS: Final = 60.0


def flac_silence(rate: int, channels: int, seconds: float) -> bytes:
    """A FLAC file of silence: a few hundred bytes per second whatever its rate and channels
    (written in blocks: libsndfile 1.2 crashes encoding millions of 8-channel frames at once)."""
    out = io.BytesIO()
    block = np.zeros((65_536, channels), dtype=np.int16)
    with sf.SoundFile(out, "w", rate, channels, format="FLAC", subtype="PCM_16") as sound:
        left = round(rate * seconds)
        while left > 0:
            sound.write(block[: min(left, len(block))])
            left -= len(block)
    return out.getvalue()


def decode_bomb() -> bytes:
    """The issue's file: 340 KB of FLAC, 60 s of 8 channels at 655,350 Hz (314 M samples: ~5 s
    of CPU to decode, 1.3 GB as float samples)."""
    return flac_silence(BOMB_RATE, BOMB_CHANNELS, BOMB_SECONDS)


def work_bomb() -> bytes:
    """60 s of 8 channels at 192 kHz, the highest rate decoded: 92 M samples, over the work
    bound (24 M) though every field is within its own."""
    return flac_silence(192_000, 8, 60.0)


@functools.cache
def long_work() -> bytes:
    """6 minutes of 8 channels at 192 kHz (550 KB): seconds of CPU to decode once the bounds are
    opened (2.9 s here with soundfile 0.14, whose FLAC decoding takes 0.45 s for `work_bomb`),
    long enough to be cut, killed or over a CPU limit of whole seconds while it decodes."""
    return flac_silence(192_000, 8, 360.0)


def flac_with_total_samples(data: bytes, total: int) -> bytes:
    """The FLAC file with the 36-bit total-samples field of its STREAMINFO rewritten (0 means
    "unknown" to a decoder)."""
    patched = bytearray(data)
    start = 4 + 4 + 10  # "fLaC", the block header, block sizes and frame sizes
    packed = int.from_bytes(patched[start : start + 8], "big")
    packed = (packed & ~((1 << 36) - 1)) | total
    patched[start : start + 8] = packed.to_bytes(8, "big")
    return bytes(patched)


def lying_bomb(declared_frames: int) -> bytes:
    """`work_bomb` whose header declares `declared_frames` (0: an unknown length)."""
    return flac_with_total_samples(work_bomb(), declared_frames)


def mp3_tone(seconds: float, rate: int = 44_100, channels: int = 2) -> bytes:
    """An MP3 of the test tone (constant bit rate), `seconds` long."""
    out = io.BytesIO()
    data = tone(rate, channels, seconds)
    sf.write(out, data, rate, format="MP3", bitrate_mode="CONSTANT", compression_level=0.0)
    return out.getvalue()


def wav_tone(seconds: float, rate: int, channels: int = 1, subtype: str = "PCM_16") -> bytes:
    """A WAV of the test tone."""
    out = io.BytesIO()
    sf.write(out, tone(rate, channels, seconds), rate, format="WAV", subtype=subtype)
    return out.getvalue()
