"""The edges of speech at a break (`pcm.LeadTrim`, `pcm.TailTrim`): the near-silence before the
first and after the last loud sample cut to a faded edge, however the speech is chunked, and
nothing inside the speech. And the samples' bytes and arithmetic without numpy
(`formats.samples`): numpy's, value for value."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.formats.pcm import QUIET_LEVEL, LeadTrim, TailTrim, le_bytes
from agent.formats.samples import f32, pcm_of, ramp, rounded, samples_of

EDGE = 110
LOUD = 8000


def speech() -> npt.NDArray[np.int16]:
    """300 quiet samples, a loud burst, 500 quiet ones inside, a burst, then 900 quiet ones."""
    quiet = (np.sin(np.arange(2600) / 3) * (QUIET_LEVEL - 1)).astype(np.int16)
    out = quiet.copy()
    out[300:800] = LOUD
    out[1300:1700] = -LOUD
    return out


def chunked(pcm: npt.NDArray[np.int16], size: int) -> list[npt.NDArray[np.int16]]:
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


@pytest.mark.parametrize("size", [7, 100, 333, 5000])
def test_the_edges_are_cut_however_the_speech_is_chunked(size: int) -> None:
    lead, tail = LeadTrim(EDGE), TailTrim(EDGE)
    out = [tail.feed(lead.feed(chunk)) for chunk in chunked(speech(), size)]
    played = np.concatenate([*out, tail.end()])
    source = speech()
    assert len(played) == EDGE + (1700 - 300) + EDGE
    assert np.array_equal(played[EDGE:-EDGE], source[300:1700])  # the inside as it was
    assert abs(int(played[0])) <= 1  # faded in from nothing
    assert abs(int(played[-1])) <= 2  # and out
    assert np.all(np.abs(played[:EDGE].astype(int)) <= np.abs(source[300 - EDGE : 300]))


def test_too_little_near_silence_is_padded_to_the_edge() -> None:
    pcm = np.full(50, LOUD, np.int16)
    lead, tail = LeadTrim(EDGE), TailTrim(EDGE)
    played = np.concatenate([tail.feed(lead.feed(pcm)), tail.end()])
    assert len(played) == 50 + 2 * EDGE
    assert not played[:EDGE].any()
    assert not played[-EDGE:].any()


def test_quiet_chunks_before_the_speech_keep_only_the_edge() -> None:
    lead = LeadTrim(EDGE)
    quiet = np.full(1000, QUIET_LEVEL, np.int16)
    assert len(lead.feed(quiet)) == 0
    assert len(lead.feed(quiet)) == 0
    played = lead.feed(np.concatenate([quiet[:20], np.full(10, LOUD, np.int16)]))
    assert len(played) == EDGE + 10
    assert np.array_equal(lead.feed(quiet), quiet)  # after the first loud sample: untouched


# ---- the same arithmetic without numpy (`formats.samples`, the lean player's) ---------------


def test_le_bytes_and_samples_agree_on_little_endian_whatever_the_host() -> None:
    pcm = np.array([0, 1, -1, 256, -32768, 32767], dtype=np.int16)
    data = le_bytes(pcm)
    assert data == b"\x00\x00\x01\x00\xff\xff\x00\x01\x00\x80\xff\x7f"
    assert le_bytes(pcm.astype(">i2")) == data  # big-endian samples: swapped
    assert samples_of(data).tolist() == pcm.tolist()
    assert pcm_of(samples_of(data)) == data


@given(
    st.lists(st.integers(-32768, 32767), min_size=1, max_size=400),
    st.floats(0.0, 1.0, allow_nan=False),
)
def test_volume_and_fade_are_numpys_float32_value_for_value(
    values: list[int], volume: float
) -> None:
    """What the writer does to a period (its volume, then a cut's fade), without numpy: the
    same samples as numpy's float32 arithmetic and `np.round`."""
    pcm = np.array(values, dtype=np.int16)
    period = pcm.astype(np.float32)
    period *= volume
    faded = period * np.linspace(1.0, 0.0, len(period), dtype=np.float32)
    (gain,) = f32([volume])
    scaled = f32([v * gain for v in samples_of(le_bytes(pcm))])
    down = f32([v * g for v, g in zip(scaled, f32(ramp(1.0, 0.0, len(values))), strict=True)])
    assert rounded(scaled).tolist() == np.round(period).astype(np.int16).tolist()
    assert rounded(down).tolist() == np.round(faded).astype(np.int16).tolist()


@given(st.integers(-32768, 32767), st.integers(0, 2000))
def test_ramp_is_linspace(start: int, count: int) -> None:
    assert ramp(start, 0, count) == np.linspace(start, 0, count).tolist()
