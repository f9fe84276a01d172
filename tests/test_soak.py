"""A short soak (a minute): the same measurements and bounds as `make soak`'s 30 minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import run, write_report

pytestmark = [pytest.mark.broker, pytest.mark.voice]


def test_a_short_soak_keeps_memory_descriptors_threads_and_latency_bounded(tmp_path: Path) -> None:
    soak = run(minutes=1.0, interval_s=12.0, voice=None, workdir=tmp_path)
    write_report(soak, tmp_path / "report")
    print((tmp_path / "report" / "SOAK.md").read_text())
    assert len(soak.intervals) >= 4
    assert all(i.announcements > 5 for i in soak.intervals)
    failed = [goal for goal, met in soak.verdicts.items() if not met]
    assert not failed, soak.notes
