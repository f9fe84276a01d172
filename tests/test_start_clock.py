"""The placement of a timed start in a running stream, from noisy observations of the device."""

from __future__ import annotations

import random

import pytest

from agent.core.start_clock import frame_at

RATE = 22050


def steps(start: float, offset: int, step: int, count: int) -> list[tuple[float, int]]:
    """A device that takes `step` frames at a time: seen after each step, a little later each
    time (0-3 ms), as a writer woken by the step sees it."""
    rng = random.Random(5)
    out = []
    for k in range(count):
        taken = offset + k * step
        due = start + k * step / RATE
        out.append((due + rng.uniform(0, 0.003), taken))
    return out


@pytest.mark.parametrize("step", [1, 220, 441, 1024])
def test_the_frame_that_plays_at_an_instant_is_found_to_within_a_step(step: int) -> None:
    # frames taken at time t: RATE * (t - 1000.0) + 500, in steps of `step`
    observed = steps(1000.0, 500, step, 60)
    at = 1001.5
    exact = round(RATE * (at - 1000.0)) + 500
    assert abs(frame_at(observed, RATE, at) - exact) <= 0.003 * RATE  # the wake-up jitter


def test_late_seen_observations_do_not_pull_the_estimate_late() -> None:
    observed = steps(50.0, 0, 220, 40)
    late = [(when + 0.030, taken) for when, taken in observed[::3]]  # a busy writer, 30 ms late
    assert frame_at(observed + late, RATE, 52.0) == frame_at(observed, RATE, 52.0)
