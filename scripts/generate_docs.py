"""The generated parts of the documentation, from their one source each:

- `config/agent.yaml` (the example configuration, every key at its default with its text as a
  comment) and `docs/configuration.md` (the reference table), both from the keys' declarations
  in `agent/settings/declarations.py`: one text per key, edited there;
- the measured figures in the Markdown files (README.md, docs/*.md), each between
  `<!-- fig NAME -->` and `<!-- /fig -->`, from the benches' JSON (bench/*.json) as `FIGURES`
  says which value and how it is written.

    python -m scripts.generate_docs           # write what changed (`make docs` runs it)
    python -m scripts.generate_docs --check   # exit 1 naming each file that is not current

tests/test_docs.py runs the check, so a text or a bench result changed without the pages fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.settings.declarations import ENV_OVERRIDES, AgentConfig  # noqa: E402

YAML: Final = REPO / "config" / "agent.yaml"
REFERENCE: Final = REPO / "docs" / "configuration.md"
WIDTH: Final = 100
"""Longest line of config/agent.yaml."""

SHOWN_DEFAULTS: Final[Mapping[str, object]] = {"node_id": None}
"""Keys whose default is written otherwise than the declaration holds it (node_id's "" and
null both mean the host name; null says so)."""

EXAMPLES: Final[Mapping[str, str]] = {
    "mqtt.hosts": """hosts:
  - host: broker-a.plant.lan
  - host: broker-b.plant.lan
    tls: {enabled: true, ca_file: /etc/voice-agent/plant-ca.pem}""",
    "audio.chimes": "chimes:\n  info: ding",
    "audio.chime_files": "chime_files:\n  doorbell: /etc/voice-agent/doorbell.wav",
    "audio.media": "media:\n  evacuation: /etc/voice-agent/evacuation.flac",
    "audio.media_hosts": """media_hosts:
  - homeassistant.local:8123
  - 192.168.1.0/24
  - "[fd00::/8]:8123\"""",
    "tts.voices": "voices:\n  lessac: /opt/voices/en_US-lessac-medium.onnx",
    "cache.phrases": "phrases:\n  - Fire alarm. Leave the building by the nearest exit.",
}
"""An example value, shown in config/agent.yaml's comment (the key's own line stays its
default)."""

YAML_HEADER: Final = """\
# voice-agent configuration. Every key is optional; the values shown are the defaults.
# Generated from agent/settings/declarations.py (`make docs`): edit the texts there. A copy of
# this file is /etc/voice-agent/agent.yaml after `sudo make install`.
# Check a file with:  voice-agent check-config FILE
# Environment overrides (deployment values): {env}. VOICE_AGENT_CONFIG names the file itself.
"""

REFERENCE_HEADER: Final = """\
# Configuration reference

<!-- Generated from agent/settings/declarations.py by `python -m scripts.generate_docs` (make
docs): edit the texts there, never here. -->

Every key is optional: a node runs with no file at all. The file read is the one named by
`--config` or `$VOICE_AGENT_CONFIG`, else the checkout's `config/agent.yaml` (`make run`), else
`/etc/voice-agent/agent.yaml` (the installed service's, from `sudo make install`). A bad file
stops the agent at start with one message listing every problem with its key path (and
`voice-agent check-config FILE` prints the same and exits 1). Unknown keys are errors.
`config/agent.yaml` holds every key at its default with the text below as its comment.

| key | default | meaning |
|---|---|---|
"""

REFERENCE_FOOTER: Final = """
Environment overrides, for deployment values: {env}. `VOICE_AGENT_CONFIG` names the config
file.
"""


# ---------------------------------------------------------------------------------------------
# The configuration: config/agent.yaml and docs/configuration.md
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One configuration key as the pages show it."""

    path: str
    doc: str
    default: object
    allowed: str | None


def _default(field: Field[Any]) -> object:
    if field.default_factory is not MISSING:
        return field.default_factory()
    return field.default


def allowed(check: object) -> str | None:
    """What a key's check lets through, when the check is a range or a choice."""
    if not isinstance(check, types.FunctionType) or check.__closure__ is None:
        return None
    cells = dict(
        zip(check.__code__.co_freevars, (c.cell_contents for c in check.__closure__), strict=True)
    )
    qualified = getattr(check, "__qualname__", "")
    if qualified.startswith("_between.") and {"low", "high"} <= set(cells):
        return f"{number(cells['low'])} to {number(cells['high'])}"
    if qualified.startswith("_one_of.") and "choices" in cells:
        return "one of " + ", ".join(f"`{c}`" for c in cells["choices"])
    return None


def number(value: float) -> str:
    """A bound as people write it (thousands separated)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def config_keys(cls: type = AgentConfig, prefix: str = "") -> list[Key]:
    """Every leaf key, in declaration order."""
    found: list[Key] = []
    for field in fields(cls):
        path = f"{prefix}{field.name}"
        default = _default(field)
        if is_dataclass(default):
            found += config_keys(type(default), f"{path}.")
            continue
        shown = SHOWN_DEFAULTS.get(path, default)
        found.append(Key(path, field.metadata["doc"], shown, allowed(field.metadata["check"])))
    return found


def sections(cls: type = AgentConfig, prefix: str = "") -> dict[str, str]:
    """Each section's path and its class's first docstring line."""
    found: dict[str, str] = {}
    for field in fields(cls):
        default = _default(field)
        if is_dataclass(default):
            path = f"{prefix}{field.name}"
            found[path] = " ".join((type(default).__doc__ or "").split("\n\n")[0].split())
            found |= sections(type(default), f"{path}.")
    return found


def yaml_scalar(value: object) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z0-9_./:@-]+", text) and not re.fullmatch(
        r"(?i)null|true|false|yes|no|on|off|~|[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text
    )
    return text if plain and not text.startswith(("-", ":")) else json.dumps(text)


def plain_text(doc: str) -> str:
    """A key's text as a YAML comment says it: documentation links as paths."""
    return doc


def yaml_lines(key: Key, indent: str) -> list[str]:
    """A key's comment, example and line in config/agent.yaml."""
    text = plain_text(key.doc) + (f" Allowed: {key.allowed}." if key.allowed else "")
    wrapped = textwrap.wrap(
        text, WIDTH - len(indent) - 2, break_long_words=False, break_on_hyphens=False
    )
    lines = [f"{indent}# {line}" for line in wrapped]
    example = EXAMPLES.get(key.path)
    if example:
        lines.append(f"{indent}# Example:")
        lines += [f"{indent}#   {line}" for line in example.splitlines()]
    name = key.path.rsplit(".", 1)[-1]
    value = key.default
    if isinstance(value, tuple | list) and value:
        lines.append(f"{indent}{name}:")
        lines += [f"{indent}  - {yaml_scalar(item)}" for item in value]
    elif isinstance(value, tuple | list):
        lines.append(f"{indent}{name}: []")
    elif isinstance(value, Mapping):
        if value:
            raise ValueError(f"{key.path}: a default map with entries is not written")
        lines.append(f"{indent}{name}: {{}}")
    else:
        lines.append(f"{indent}{name}: {yaml_scalar(value)}")
    return lines


def env_list(wrap: Callable[[str], str]) -> str:
    """The environment overrides, each as `wrap` writes a name."""
    return ", ".join(wrap(name) for name in ENV_OVERRIDES)


def render_yaml() -> str:
    """config/agent.yaml."""
    titles = sections()
    out = YAML_HEADER.format(env=env_list(str)).splitlines()
    out = [
        line
        for raw in out
        for line in textwrap.wrap(raw, WIDTH, subsequent_indent="# ", break_on_hyphens=False)
    ]
    opened: list[str] = []
    for key in config_keys():
        parts = key.path.split(".")
        parents = parts[:-1]
        common = 0
        while common < min(len(opened), len(parents)) and opened[common] == parents[common]:
            common += 1
        if common == 0 and (parents or opened):
            out.append("")
        for depth in range(common, len(parents)):
            indent = "  " * depth
            title = titles[".".join(parents[: depth + 1])]
            if depth == 0:
                out += textwrap.wrap(title, WIDTH, initial_indent="# ", subsequent_indent="# ")
            out.append(f"{indent}{parents[depth]}:")
        opened = parents
        if not parents:
            out.append("")
        out += yaml_lines(key, "  " * len(parents))
    return "\n".join(out).lstrip("\n") + "\n"


def page_title(page: str) -> str:
    """A docs page's first heading (what a link to it is called)."""
    first = (REPO / "docs" / page).read_text(encoding="utf-8").splitlines()[0]
    return first.lstrip("# ").strip()


def markdown_text(doc: str) -> str:
    """A key's text in a Markdown table cell: documentation paths as links, `<` `>` and `|`
    outside code escaped."""
    pieces = re.split(r"(`[^`]*`)", doc)
    out = []
    for piece in pieces:
        if piece.startswith("`"):
            out.append(piece.replace("|", "\\|"))
            continue
        escaped = piece.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
        linked = re.sub(
            r"docs/([\w-]+\.md)(#[\w-]+)?",
            lambda m: f"[{page_title(m[1])}]({m[1]}{m[2] or ''})",
            escaped,
        )
        out.append(linked)
    return "".join(out)


def markdown_default(value: object) -> str:
    """A default in the table."""
    if isinstance(value, tuple | list):
        return f"`[{', '.join(str(v) for v in value)}]`" if value else "`[]`"
    if isinstance(value, Mapping):
        return "`{}`"
    return f"`{yaml_scalar(value)}`"


def render_reference() -> str:
    """docs/configuration.md."""
    rows = []
    for key in config_keys():
        meaning = markdown_text(key.doc)
        if key.allowed:
            meaning += f" Allowed: {key.allowed}."
        rows.append(f"| `{key.path}` | {markdown_default(key.default)} | {meaning} |")
    footer = REFERENCE_FOOTER.format(env=env_list(lambda name: f"`{name}`"))
    wrapped = "\n".join(textwrap.wrap(footer.strip(), WIDTH, break_on_hyphens=False))
    return REFERENCE_HEADER + "\n".join(rows) + "\n\n" + wrapped + "\n"


# ---------------------------------------------------------------------------------------------
# Figures from the benches' JSON
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A measured value: where it is in which JSON file, and how it is written."""

    source: str
    """The file under the repository (bench/wyoming.json)."""
    path: str
    """The keys down to the value, dot-separated (a key holding a dot is not supported)."""
    form: str
    """How it is written: a format for `str.format` with the value as `{}`."""
    scale: float = 1.0
    """A factor applied first (0.001 for ms to s)."""

    def value(self) -> Any:
        """The value in its JSON file."""
        data: Any = json.loads((REPO / self.source).read_text(encoding="utf-8"))
        for part in self.path.split("."):
            data = data[int(part)] if isinstance(data, list) else data[part]
        return data

    def text(self) -> str:
        """The figure as the pages write it."""
        value = self.value()
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = value * self.scale
        return self.form.format(value)


_METRIC = "bench/results.json"
_WYOMING = "bench/wyoming.json"
_TRUST = "bench/trust.json"
_FRESH_RUN = "bench/fresh-run.json"
_FRESH_INSTALL = "bench/fresh-install.json"
_FRESH_TEST = "bench/fresh-test.json"
_TIERS = "bench/tiers.json"
_ALARMS = "bench/alarms.json"
_ROOMS = "bench/rooms.json"
_MS = "{:.0f} ms"
_MS1 = "{:.1f} ms"
_MS3 = "{:.2f} ms"
_MB = "{:.0f} MB"
_MIB = "{:.1f} MiB"
_MINUTES = "{:.1f} minutes"
_TIMES = "\u00d7"  # the multiplication sign
_RATIO = "{:.2f}" + _TIMES
_SPEED = "{:.1f}" + _TIMES
_PERCENT = "{:+.1f} %"
_PERCENT_SHARE = "{:.0%}"
_DATE = "{:.10}"
_WHEN = "{:.16}"
_LOAD = "{:.0f}"
_COUNT = "{:.0f}"
_ALARM_MS = "{} ms"
"""An alarm figure as bench/alarms.json holds it (rounded to 0.1 ms there; null when lost)."""


def _metric(
    prefix: str, source: str, metric: str, ours: str = "", piper: str = ""
) -> dict[str, Figure]:
    """A bench metric's ratio, and its ours / piper values where `ours` / `piper` give forms."""
    found = {f"{prefix}_ratio": Figure(source, f"metrics.{metric}.ratio", _RATIO)}
    if ours:
        found[f"{prefix}_ours"] = Figure(source, f"metrics.{metric}.ours_value", ours)
    if piper:
        found[f"{prefix}_piper"] = Figure(source, f"metrics.{metric}.piper_value", piper)
    return found


def _value(name: str, source: str, metric: str, form: str) -> dict[str, Figure]:
    """A bench metric's own value (a metric with no piper side)."""
    return {name: Figure(source, f"metrics.{metric}.ours_value", form)}


def _alarm(name: str, scenario: str) -> dict[str, Figure]:
    """Publish -> first alarm sample under one of bench/alarms.py's scenarios: p50 and max."""
    path = f"latest.scenarios.{scenario}.summary_ms"
    return {
        f"{name}_n": Figure(_ALARMS, f"{path}.n", _COUNT),
        f"{name}_p50": Figure(_ALARMS, f"{path}.p50", _ALARM_MS),
        f"{name}_max": Figure(_ALARMS, f"{path}.max", _ALARM_MS),
    }


def _trust(name: str, row: str) -> dict[str, Figure]:
    """A `critical` beside a hostile sound (bench/trust.py): publish -> started, p50 and max."""
    return {
        f"{name}_p50": Figure(_TRUST, f"alarm_start_ms.{row}.median", _MS1),
        f"{name}_max": Figure(_TRUST, f"alarm_start_ms.{row}.max", _MS1),
    }


def _sync(name: str, run: str) -> dict[str, Figure]:
    """Two nodes, one `at` (bench/rooms.py): |offset| p95 and max, uncached and cached, and
    how many announcements had no pair of marks (nodes more than 50 ms apart)."""
    return {
        **{
            f"{name}_{kind}_{stat}": Figure(
                _ROOMS, f"results.{run}.{kind}.abs_offset_ms.{stat}", _MS3
            )
            for kind in ("uncached", "cached")
            for stat in ("p95", "max")
        },
        **{
            f"{name}_{kind}_unpaired": Figure(_ROOMS, f"results.{run}.{kind}.unpaired", "{:.0f}")
            for kind in ("uncached", "cached")
        },
    }


FIGURES: Final[Mapping[str, Figure]] = {
    # make bench: bench/run.py against piper-tts (bench/REPORT.md)
    "bench_cpu": Figure(_METRIC, "machine.cpu_model", "{}"),
    "ttfa_ms": Figure(_METRIC, "metrics.ttfa_vs_piper_whole_text.ours_value", _MS),
    "ttfa_piper_whole_ms": Figure(_METRIC, "metrics.ttfa_vs_piper_whole_text.piper_value", _MS),
    "peak_rss_mb": Figure(_METRIC, "metrics.peak_rss.ours_value", "{:.0f} MB"),
    "peak_rss_piper_mb": Figure(_METRIC, "metrics.peak_rss.piper_value", "{:.0f} MB"),
    "steady_rss_mb": Figure(_METRIC, "metrics.steady_rss.ours_value", "{:.0f} MB"),
    # make bench: bench/wyoming.py against wyoming-piper (bench/WYOMING.md)
    "wyoming_cpu": Figure(_WYOMING, "machine.cpu_model", "{}"),
    "wyoming_first_ms": Figure(_WYOMING, "metrics.first_audio_three_sentences.ours_value", _MS),
    "wyoming_piper_first_ms": Figure(
        _WYOMING, "metrics.first_audio_three_sentences.piper_value", _MS
    ),
    "wyoming_piper_whole_ms": Figure(_WYOMING, "metrics.anchor_three_sentences.piper_value", _MS),
    "wyoming_three_ratio": Figure(
        _WYOMING, "metrics.anchor_three_sentences.ratio", "{:.2f}" + _TIMES
    ),
    "wyoming_stream_first_ms": Figure(_WYOMING, "metrics.stream_first_audio.ours_value", _MS),
    "wyoming_piper_stream_first_ms": Figure(
        _WYOMING, "metrics.stream_first_audio.piper_value", _MS
    ),
    # scripts/fresh_machine.sh --scenario run | install on a new Debian 12 root (its report.json)
    "fresh_run_setup_min": Figure(
        _FRESH_RUN, "times.make setup-run (make run's set-up)", _MINUTES, 1 / 60
    ),
    "fresh_run_cpu": Figure(_FRESH_RUN, "machine.cpu_model", "{}"),
    "fresh_run_load": Figure(_FRESH_RUN, "machine.load_average_at_start.0", "{:.1f}"),
    "fresh_install_min": Figure(_FRESH_INSTALL, "times.make install", _MINUTES, 1 / 60),
    "fresh_install_cpu": Figure(_FRESH_INSTALL, "machine.cpu_model", "{}"),
    "fresh_install_again_s": Figure(
        _FRESH_INSTALL, "times.make install again (an upgrade)", "{:.0f} s"
    ),
    "fresh_uninstall_s": Figure(_FRESH_INSTALL, "times.make uninstall", "{:.0f} s"),
    # scripts/fresh_machine.sh --scenario test: make setup, then make test on a new root
    "fresh_test_setup_min": Figure(_FRESH_TEST, "times.make setup", _MINUTES, 1 / 60),
    "fresh_test_min": Figure(_FRESH_TEST, "times.make test", _MINUTES, 1 / 60),
    "fresh_test_summary": Figure(_FRESH_TEST, "summary", "{}"),
    "fresh_test_commit": Figure(_FRESH_TEST, "commit", "{:.7}"),
    "fresh_test_date": Figure(_FRESH_TEST, "machine.date", "{:.10}"),
    "fresh_test_load_start": Figure(_FRESH_TEST, "machine.load_average_at_start.0", "{:.0f}"),
    "fresh_test_load_end": Figure(_FRESH_TEST, "machine.load_average_at_end.0", "{:.0f}"),
    # make bench: bench/trust.py (bench/TRUST.md)
    "trust_cpu": Figure(_TRUST, "machine.cpu_model", "{}"),
    "alarm_beside_stalled_fetch_max_ms": Figure(
        _TRUST, "alarm_start_ms.bomb being fetched (server stalls).max", _MS
    ),
    # make bench: bench/tiers.py, two builds of the INT8 tier and the node's children (TIERS.md)
    "tier_load_end": Figure(_TIERS, "load_end.0", "{:.0f}"),
    "tier_build1_speedup": Figure(_TIERS, "builds.0.result.speedup", "{:.2f}" + _TIMES),
    "tier_build2_speedup": Figure(_TIERS, "builds.1.result.speedup", "{:.2f}" + _TIMES),
    "tier_build1_db": Figure(_TIERS, "builds.0.result.distance_db", "{:.2f} dB"),
    "tier_build2_db": Figure(_TIERS, "builds.1.result.distance_db", "{:.2f} dB"),
    "tier_build1_noiseless_db": Figure(
        _TIERS, "builds.0.result.noiseless_distance_db", "{:.2f} dB"
    ),
    "tier_build1_sha": Figure(_TIERS, "builds.0.result.sha256", "{:.8}"),
    "tier_build1_share": Figure(_TIERS, "builds.0.selection.quantized_cost_share", "{:.0%}"),
    "tier_build2_sha": Figure(_TIERS, "builds.1.result.sha256", "{:.8}"),
    "tier_build1_peak_mb": Figure(_TIERS, "builds.0.result.peak_rss_mb", "{:.0f} MB"),
    "tier_build2_peak_mb": Figure(_TIERS, "builds.1.result.peak_rss_mb", "{:.0f} MB"),
    "tier_build1_min": Figure(_TIERS, "builds.0.wall_seconds", _MINUTES, 1 / 60),
    "tier_build2_min": Figure(_TIERS, "builds.1.wall_seconds", _MINUTES, 1 / 60),
    "tier_node_fp32_mb": Figure(_TIERS, "children.speed_only.result.peak_rss_mb", "{:.0f} MB"),
    "tier_node_judge_speedup": Figure(
        _TIERS, "children.judge_release_variant.result.speedup", "{:.2f}" + _TIMES
    ),
    "tier_node_judge_mb": Figure(
        _TIERS, "children.judge_release_variant.result.peak_rss_mb", "{:.0f} MB"
    ),
    "tier_device_speedup": Figure(
        _TIERS, "children.build_on_device.result.speedup", "{:.2f}" + _TIMES
    ),
    "tier_device_db": Figure(_TIERS, "children.build_on_device.result.distance_db", "{:.2f} dB"),
    "tier_node_judge_busy": Figure(
        _TIERS, "children.judge_release_variant.result.busy_share", _PERCENT_SHARE
    ),
    "tier_device_mb": Figure(_TIERS, "children.build_on_device.result.peak_rss_mb", "{:.0f} MB"),
    "tier_device_calibration_mb": Figure(
        _TIERS, "children.build_on_device.result.calibration_peak_rss_mb", "{:.0f} MB"
    ),
    # make bench: bench/run.py against piper-tts, every row of docs/performance.md (REPORT.md)
    "bench_date": Figure(_METRIC, "machine.date", _WHEN),
    "bench_seconds": Figure(_METRIC, "run.duration_s", "{:.0f} s"),
    "bench_load_start": Figure(_METRIC, "machine.load_average_at_start.0", _LOAD),
    "bench_load_end": Figure(_METRIC, "run.load_average_at_end.0", _LOAD),
    "bench_piper_version": Figure(_METRIC, "machine.piper-tts", "{}"),
    **{
        name: figure
        for text in ("short", "medium", "long")
        for name, figure in (
            _metric(f"cpu_{text}", _METRIC, f"cpu_speed_{text}", _SPEED, _SPEED)
            | _metric(f"warm_{text}", _METRIC, f"warm_speed_{text}", _SPEED, _SPEED)
            | _metric(f"int8_{text}", _METRIC, f"int8_speed_{text}", _SPEED, _SPEED)
        ).items()
    },
    **_metric("ttfa", _METRIC, "ttfa_vs_piper_whole_text"),
    **_metric("ttfa_first", _METRIC, "ttfa_vs_piper_first_sentence", piper=_MS),
    **_metric("ttfa_short", _METRIC, "ttfa_short", _MS, _MS),
    **_metric("ttfa_unpunctuated", _METRIC, "ttfa_unpunctuated", _MS, _MS),
    **_value("cached_p50_ms", _METRIC, "cached_latency_p50", _MS1),
    **_value("cached_p99_ms", _METRIC, "cached_latency_p99", _MS),
    **_value("media_p50_ms", _METRIC, "cached_media_latency_p50", _MS1),
    **_value("media_p99_ms", _METRIC, "cached_media_latency_p99", _MS),
    **_value("chunking_three", _METRIC, "chunking_overhead_three_sentences", _PERCENT),
    **_value("chunking_long", _METRIC, "chunking_overhead_long", _PERCENT),
    **_value("chunking_unpunctuated", _METRIC, "chunking_overhead_unpunctuated", _PERCENT),
    **_value("underruns", _METRIC, "paced_underruns", _COUNT),
    **_metric("peak_together", _METRIC, "peak_together", _MB, _MB),
    **_metric("steady_together", _METRIC, "steady_together", _MB, _MB),
    **_metric("peak_rss", _METRIC, "peak_rss"),
    **_metric("peak_sampled", _METRIC, "peak_rss_sampled", _MB),
    **_value("peak_pss_mb", _METRIC, "peak_pss_sampled", _MB),
    **_metric("steady_rss", _METRIC, "steady_rss", piper=_MB),
    **_metric("steady_pss", _METRIC, "pss", _MB, _MB),
    **_metric("cold_start", _METRIC, "cold_start", "{:.2f} s", "{:.2f} s"),
    **_value("power_on_alarm_ms", _METRIC, "power_on_alarm", _MS),
    **_metric("power_on_online", _METRIC, "power_on_online", "{:.2f} s", "{:.2f} s"),
    **_metric("power_on_loaded", _METRIC, "power_on_loaded", "{:.2f} s"),
    # make bench: bench/wyoming.py, the rest of docs/performance.md's Wyoming rows
    "wyoming_date": Figure(_WYOMING, "machine.date", _WHEN),
    "wyoming_seconds": Figure(_WYOMING, "run.duration_s", "{:.0f} s"),
    "wyoming_load_start": Figure(_WYOMING, "machine.load_average_at_start.0", _LOAD),
    "wyoming_load_end": Figure(_WYOMING, "run.load_average_at_end.0", _LOAD),
    "wyoming_piper_version": Figure(_WYOMING, "machine.versions.wyoming-piper", "{}"),
    "wyoming_three_paired": Figure(
        _WYOMING, "summary.paired_median_ratios.three_sentences.first_over_whole", _RATIO
    ),
    **_metric("wyoming_first_short", _WYOMING, "first_audio_short"),
    **_metric("wyoming_first_three", _WYOMING, "first_audio_three_sentences"),
    **_metric("wyoming_first_paragraph", _WYOMING, "first_audio_paragraph"),
    **_metric("wyoming_whole_short", _WYOMING, "whole_short"),
    **_metric("wyoming_whole_three", _WYOMING, "whole_three_sentences"),
    **_metric("wyoming_whole_paragraph", _WYOMING, "whole_paragraph"),
    "wyoming_stream_p90_ms": Figure(_WYOMING, "summary.stream_vs_mqtt.stream_first_p90_ms", _MS),
    "wyoming_stream_bound_ms": Figure(_WYOMING, "summary.stream_vs_mqtt.bound_ms", _MS),
    "wyoming_mqtt_first_ms": Figure(_WYOMING, "summary.stream_vs_mqtt.mqtt_first_ms", _MS),
    # make bench: bench/alarms.py (bench/ALARMS.md), its latest run
    "alarms_date": Figure(_ALARMS, "latest.machine.date", _WHEN),
    "alarms_load_start": Figure(_ALARMS, "latest.machine.load_average_at_start.0", _LOAD),
    **_alarm("alarms_quiet", "quiet"),
    **_alarm("alarms_all", "all at once"),
    "alarms_power_on_ms": Figure(_ALARMS, "latest.power_on.median_ms", _ALARM_MS),
    "alarms_power_on_piper_ms": Figure(_ALARMS, "latest.power_on.piper_tts_median_ms", _ALARM_MS),
    # make bench: bench/trust.py (bench/TRUST.md), an earlier run
    "trust_date": Figure(_TRUST, "machine.date", _DATE),
    "trust_trials": Figure(_TRUST, "trials", _COUNT),
    **_trust("trust_bomb_url", "bomb as sound (URL)"),
    **_trust("trust_bomb_playbytes", "bomb as Hermes playBytes"),
    **_trust("trust_bomb_stalled", "bomb being fetched (server stalls)"),
    "trust_refused_p50_ms": Figure(_TRUST, "bomb_refused_ms.median", _MS1),
    "trust_refused_max_ms": Figure(_TRUST, "bomb_refused_ms.max", _MS),
    "trust_baseline_mib": Figure(_TRUST, "memory.default_budget.baseline_mib", _MIB),
    "trust_budget_over_mib": Figure(_TRUST, "memory.default_budget.over_baseline_mib", "+" + _MIB),
    "trust_budget_settled_mib": Figure(_TRUST, "memory.default_budget.settled_mib", _MIB),
    "trust_budget_refused": Figure(_TRUST, "memory.default_budget.refused_queue_full", _COUNT),
    "trust_budget_waiting": Figure(_TRUST, "memory.default_budget.waiting", _COUNT),
    "trust_gib_over_mib": Figure(_TRUST, "memory.budget_1_gib.over_baseline_mib", "+" + _MIB),
    "trust_gib_settled_mib": Figure(_TRUST, "memory.budget_1_gib.settled_mib", _MIB),
    "trust_gib_refused": Figure(_TRUST, "memory.budget_1_gib.refused_queue_full", _COUNT),
    "trust_allowed_mib": Figure(_TRUST, "allowed_over_baseline_mib", "+{:.0f} MiB"),
    # make bench: bench/rooms.py (bench/ROOMS.md), an earlier run
    "rooms_date": Figure(_ROOMS, "machine.date", _DATE),
    "rooms_block_ms": Figure(_ROOMS, "results.sync_default.sink_latency_ms", _MS3),
    "rooms_small_block_ms": Figure(_ROOMS, "results.sync_default_2ms_blocks.sink_latency_ms", _MS3),
    **_sync("rooms_sync", "sync_default"),
    **_sync("rooms_sync_small", "sync_default_2ms_blocks"),
    **{
        f"rooms_lead_{text}_max": Figure(_ROOMS, f"results.lead.{text}.max", _MS)
        for text in ("short", "medium", "long")
    },
    **{
        f"rooms_idle_{kind}": Figure(_ROOMS, f"results.idle.{kind}.p50", _MS1)
        for kind in ("defaults", "lead_in_300ms", "release_when_idle")
    },
}
"""Every figure the pages may show, by the name its marker gives."""

MARKER: Final = re.compile(
    r"<!-- fig (?P<name>[a-z0-9_]+) -->(?P<text>.*?)<!-- /fig -->", re.DOTALL
)


def markdown_files() -> list[Path]:
    """The pages that may hold figures."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def with_figures(text: str, where: str) -> str:
    """`text` with every figure marker's content made from its JSON."""

    def figure(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in FIGURES:
            raise KeyError(f"{where}: no figure named {name!r} (scripts/generate_docs.py)")
        return f"<!-- fig {name} -->{FIGURES[name].text()}<!-- /fig -->"

    return MARKER.sub(figure, text)


# ---------------------------------------------------------------------------------------------


def generated() -> dict[Path, str]:
    """Every generated file with what it should hold."""
    files = {YAML: render_yaml(), REFERENCE: render_reference()}
    for page in markdown_files():
        current = files.get(page) or page.read_text(encoding="utf-8")
        files[page] = with_figures(current, page.relative_to(REPO).as_posix())
    return files


def stale() -> list[Path]:
    """The generated files that do not hold what they should."""
    return [
        path
        for path, text in generated().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, name) the files that are not current."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"{path.relative_to(REPO)}: not current (python -m scripts.generate_docs)")
        return 1 if old else 0
    for path, text in generated().items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
