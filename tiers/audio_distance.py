"""Audio distance for judging voice variants: log-mel spectrograms and a DTW-aligned dB distance.

Definitions (all numpy):
- log-mel: STFT with a periodic Hann window (n_fft 1024, hop 256, frames centred by zero padding
  of n_fft/2 on both sides), magnitude scaled by the window sum (a full-scale sine peaks at
  -6 dB), power summed through 80 triangular HTK mel bands between 0 and 8 kHz, then
  10*log10(power) with a floor at -80 dB (silence is -80 dB, not -inf).
- distance: dynamic time warping over the two log-mel sequences with the frame-wise Euclidean
  distance as cost (steps: diagonal, down, right); along the optimal path, the mean absolute
  difference in dB over the mel bands, averaged over the path steps. Identical audio gives 0;
  it stays small when one signal is only shifted or stretched in time.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

N_FFT: Final = 1024
HOP: Final = 256
N_MELS: Final = 80
F_MIN: Final = 0.0
F_MAX: Final = 8000.0
FLOOR_DB: Final = -80.0


def hz_to_mel(hz: FloatArray) -> FloatArray:
    """HTK mel scale."""
    mel: FloatArray = 2595.0 * np.log10(1.0 + hz / 700.0)
    return mel


def mel_to_hz(mel: FloatArray) -> FloatArray:
    """Inverse of the HTK mel scale."""
    hz: FloatArray = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    return hz


def mel_filterbank(
    sample_rate: int, n_fft: int = N_FFT, n_mels: int = N_MELS, f_max: float = F_MAX
) -> FloatArray:
    """Triangular mel filters [n_mels, n_fft // 2 + 1] with peak 1, from F_MIN to f_max."""
    top = min(f_max, sample_rate / 2.0)
    edges = mel_to_hz(np.linspace(hz_to_mel(np.array(F_MIN)), hz_to_mel(np.array(top)), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    bank: FloatArray = np.maximum(0.0, np.minimum(rising, falling))
    return bank


def log_mel_db(audio: npt.NDArray[np.floating], sample_rate: int) -> FloatArray:
    """Log-mel spectrogram in dB, shape [frames, N_MELS] (see the module docstring)."""
    samples = np.asarray(audio, dtype=np.float64).reshape(-1)
    padded = np.pad(samples, (N_FFT // 2, N_FFT // 2))
    if len(padded) < N_FFT:
        padded = np.pad(padded, (0, N_FFT - len(padded)))
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    window = np.hanning(N_FFT + 1)[:-1]
    spectrum = np.fft.rfft(frames * window, axis=1) / window.sum()
    power = spectrum.real**2 + spectrum.imag**2
    mel = power @ mel_filterbank(sample_rate).T
    db: FloatArray = 10.0 * np.log10(np.maximum(mel, 10.0 ** (FLOOR_DB / 10.0)))
    return db


def euclidean_cost(a: FloatArray, b: FloatArray) -> FloatArray:
    """Pairwise Euclidean distance between the rows of a [n, d] and b [m, d]: [n, m]."""
    squared = (a * a).sum(axis=1)[:, None] + (b * b).sum(axis=1)[None, :] - 2.0 * (a @ b.T)
    cost: FloatArray = np.sqrt(np.maximum(squared, 0.0))
    return cost


def dtw_accumulate(cost: FloatArray) -> FloatArray:
    """Accumulated DTW cost; each row is solved at once with a cumulative-minimum identity.

    Within row i, D[j] = min(t[j], c[j] + D[j-1]) with t[j] = c[j] + min(P[j-1], P[j]) (P the
    previous row) unrolls to D[j] = C[j] + min over k <= j of (t[k] - C[k]), C = cumsum(c).
    """
    n, m = cost.shape
    acc = np.empty((n, m))
    acc[0] = np.cumsum(cost[0])
    for i in range(1, n):
        row = cost[i]
        previous = acc[i - 1]
        best = previous.copy()
        best[1:] = np.minimum(previous[1:], previous[:-1])
        through = row + best
        running = np.cumsum(row)
        acc[i] = running + np.minimum.accumulate(through - running)
    return acc


def dtw_path(a: FloatArray, b: FloatArray) -> tuple[IntArray, IntArray]:
    """The optimal DTW path between frame sequences a [n, d] and b [m, d], from (0,0) to end."""
    acc = dtw_accumulate(euclidean_cost(a, b))
    i, j = acc.shape[0] - 1, acc.shape[1] - 1
    steps = [(i, j)]
    while i > 0 or j > 0:
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:
            moves = ((i - 1, j - 1), (i - 1, j), (i, j - 1))  # diagonal first on ties
            i, j = min(moves, key=lambda move: acc[move])
        steps.append((i, j))
    steps.reverse()
    path = np.array(steps, dtype=np.int64)
    return path[:, 0], path[:, 1]


def aligned_distance_db(a: FloatArray, b: FloatArray) -> float:
    """Mean absolute dB difference along the DTW path between two log-mel sequences."""
    rows, cols = dtw_path(a, b)
    return float(np.abs(a[rows] - b[cols]).mean())


def log_mel_distance_db(
    reference: npt.NDArray[np.floating], test: npt.NDArray[np.floating], sample_rate: int
) -> float:
    """DTW-aligned log-mel distance in dB between two signals (0 when identical)."""
    return aligned_distance_db(log_mel_db(reference, sample_rate), log_mel_db(test, sample_rate))


def frame_distance_db(
    reference: npt.NDArray[np.floating], test: npt.NDArray[np.floating], sample_rate: int
) -> float:
    """Unaligned comparison: mean absolute dB difference frame by frame (shorter length)."""
    a = log_mel_db(reference, sample_rate)
    b = log_mel_db(test, sample_rate)
    frames = min(len(a), len(b))
    return float(np.abs(a[:frames] - b[:frames]).mean())
