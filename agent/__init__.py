"""voice-agent: MQTT messages in, speech out, on small Linux devices."""

from __future__ import annotations


def version() -> str:
    """The installed package version (looked up only when asked: it costs start-up time)."""
    from importlib.metadata import PackageNotFoundError  # noqa: PLC0415
    from importlib.metadata import version as package_version  # noqa: PLC0415

    try:
        return package_version("voice-agent")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"
