"""A short soak (a minute): the same measurements and bounds as `make soak`'s 30 minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import HEALTH, Interval, Soak, _judge, run, write_report

pytestmark = [pytest.mark.broker, pytest.mark.voice, pytest.mark.slow]  # ~1-2 min: `make test-slow`


def test_a_short_soak_keeps_memory_descriptors_and_threads_bounded(tmp_path: Path) -> None:
    """Behaviour only: latency under load is `make soak`'s and `make bench`'s to report."""
    soak = run(minutes=1.0, interval_s=12.0, voice=None, workdir=tmp_path)
    write_report(soak, tmp_path / "report")
    print((tmp_path / "report" / "SOAK.md").read_text())
    assert len(soak.intervals) >= 4
    assert all(i.announcements > 0 for i in soak.intervals)
    failed = [goal for goal in HEALTH if not soak.verdicts[goal]]
    assert not failed, soak.notes


def test_growth_is_measured_once_the_phrase_cache_is_full() -> None:
    """Growth while the bounded cache fills is by design; a leak after it is not."""

    def soak_of(rss: list[float], cache: list[float]) -> Soak:
        soak = Soak(
            1.0,
            [
                Interval(60.0 * n, r, 13, 9, 10, cache_mb=c)
                for n, (r, c) in enumerate(zip(rss, cache, strict=True), 1)
            ],
        )
        _judge(soak, cache_bound_mb=32.0)
        return soak

    filling = soak_of([500, 516, 532, 533, 534], [0, 16, 31, 32, 32])
    assert filling.notes["warm_until_s"] == 180.0
    assert filling.verdicts["rss_growth_under_5_percent"]
    leaking = soak_of([500, 516, 532, 560, 590], [0, 16, 31, 32, 32])
    assert not leaking.verdicts["rss_growth_under_5_percent"]
    never_full = soak_of([500, 510, 540], [0, 5, 10])
    assert never_full.notes["warm_until_s"] == 120.0
    assert not never_full.verdicts["rss_growth_under_5_percent"]
