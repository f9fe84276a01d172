"""The benchmark's outputs: results.json, REPORT.md (one table), latency.png (matplotlib, Agg)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt

from bench.stats import Entry

_COLUMNS = ["metric", "ours", "piper-tts", "ratio", "target", "met?"]


def write_json(path: Path, results: Mapping[str, Any]) -> None:
    """Everything measured, indented for diffs."""
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_markdown(
    path: Path, machine: Mapping[str, Any], run: Mapping[str, Any], entries: Sequence[Entry]
) -> None:
    """A header with machine and versions, then the comparison table."""
    lines = [
        "# voice-agent benchmark against piper-tts",
        "",
        f"- Machine: {machine['cpu_model']}, {machine['cores']} cores, "
        f"Linux {machine['kernel']}; load average (1, 5, 15 min) at start "
        f"{machine['load_average_at_start']}, at end {run['load_average_at_end']}",
        f"- Versions: Python {machine['python']}, onnxruntime {machine['onnxruntime']}, "
        f"piper-tts {machine['piper-tts']}, numpy {machine['numpy']}, "
        f"paho-mqtt {machine['paho-mqtt']}, {machine['mosquitto']}",
        f"- Run: {machine['date']}, {'quick' if run['quick'] else 'full'} mode, "
        f"{run['duration_s']:.0f} s; voice en_US-joe-medium, both sides on this machine in the "
        "same run; agent on ALSA `null` through a local Mosquitto",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
        *("| " + " | ".join(entry.row()) + " |" for entry in entries),
        "",
        "Ratios are ours / piper-tts, measured side by side in one run: compare ratios, not "
        "absolute times. Absolute times vary by about ±20 % between runs on shared machines. "
        "Values are medians unless the metric names a percentile. Each timed run starts 0.1 s "
        "after the one before (ONNX Runtime's threads keep spinning ~40 ms after a run). The "
        "chunked-decoding rows compare the agent's streaming of a text with its decoder chunks "
        "against the same clause groups decoded whole (the voice run unsplit), in process. Raw "
        "samples: `results.json`; distributions: `docs/images/latency.png`.",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


@dataclass(frozen=True)
class Panel:
    """One chart: box plots of named sample series, with optional horizontal reference lines."""

    title: str
    unit: str
    series: Mapping[str, Sequence[float]]
    lines: Mapping[str, float] = field(default_factory=dict)


def write_chart(path: Path, panels: Sequence[Panel]) -> None:
    """Side-by-side box plots (every sample drawn as a dot) with their reference lines."""
    figure, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.8), squeeze=False)
    for axis, panel in zip(axes[0], panels, strict=True):
        names = list(panel.series)
        values = [list(panel.series[name]) for name in names]
        axis.boxplot(values, showfliers=False)
        for position, samples in enumerate(values, start=1):
            jitter = [position + 0.12 * ((i % 7) - 3) / 3 for i in range(len(samples))]
            axis.plot(jitter, samples, ".", alpha=0.35, markersize=4)
        for label, level in panel.lines.items():
            axis.axhline(level, linestyle="--", linewidth=1, color="grey")
            axis.annotate(label, (0.5, level), fontsize=8, color="grey", va="bottom")
        axis.set_xticks(range(1, len(names) + 1), names, fontsize=8)
        axis.set_title(panel.title, fontsize=10)
        axis.set_ylabel(panel.unit)
        axis.set_ylim(bottom=0)
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
