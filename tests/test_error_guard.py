"""The error-log guard of every test (`tests/conftest.py`): an ERROR fails a test unless its
`allow_error_logs` marker names it."""

from __future__ import annotations

import pytest

from tests.conftest import unexpected_errors


def test_without_the_marker_every_error_is_unexpected(request: pytest.FixtureRequest) -> None:
    assert unexpected_errors(request, ["disk full"]) == ["disk full"]
    assert unexpected_errors(request, []) == []


@pytest.mark.allow_error_logs(r"^Release \d+ cannot be used", "device unavailable")
def test_the_marker_allows_only_what_it_names(request: pytest.FixtureRequest) -> None:
    errors = ["Release 3 cannot be used (damaged)", "Audio device unavailable: busy", "boom"]
    assert unexpected_errors(request, errors) == ["boom"]
