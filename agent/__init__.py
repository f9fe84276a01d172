"""voice-agent: MQTT messages in, speech out, on small Linux devices."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("voice-agent")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"
