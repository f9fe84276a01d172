"""Real parts for integration tests and benchmarks: a Mosquitto broker, MQTT watchers and
publishers, the agent as a subprocess with its config, a paced PulseAudio sink, and numbers about
captured audio. No mocks. `tests/` and `bench/` both import it."""

from __future__ import annotations

from .agent import AgentProcess, agent_config, write_config
from .audio import (
    FaultyPcm,
    PulseNullSink,
    TimedRecording,
    correlation_track,
    first_match,
    heard_in_order,
    located,
    onsets,
    read_pcm,
    same_speech,
    speech_stats,
)
from .broker import Broker, Pki, free_port, make_pki
from .cgroup import CgroupError, MemoryCgroup, MemoryReading, drop_page_cache
from .mqtt import Received, Watcher, publish
from .processes import process_tree, process_tree_peak_rss, process_tree_rss, reset_peak_rss
from .wait import ROOT, TIMEOUT, wait_until

__all__ = [
    "ROOT",
    "TIMEOUT",
    "AgentProcess",
    "Broker",
    "CgroupError",
    "FaultyPcm",
    "MemoryCgroup",
    "MemoryReading",
    "Pki",
    "PulseNullSink",
    "Received",
    "TimedRecording",
    "Watcher",
    "agent_config",
    "correlation_track",
    "drop_page_cache",
    "first_match",
    "free_port",
    "heard_in_order",
    "located",
    "make_pki",
    "onsets",
    "process_tree",
    "process_tree_peak_rss",
    "process_tree_rss",
    "publish",
    "read_pcm",
    "reset_peak_rss",
    "same_speech",
    "speech_stats",
    "wait_until",
    "write_config",
]
