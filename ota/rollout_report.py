"""The end-of-rollout report: Markdown per wave (offered, installed, failed by reason, offline,
durations) and a PNG of progress over time, both from the state file alone.

Node ids, reasons and details come from the nodes (any publisher): each goes into the Markdown as
a code span with its non-printable characters escaped (`ota.safe_text.markdown`), so no node text
becomes emphasis, a link, an image or HTML, and no control character is written to the file."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from agent.core.states import UpdatePhase
from ota.inventory import iso
from ota.rollout_state import Rollout, Step, Wave
from ota.safe_text import markdown as code
from ota.safe_text import terminal


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def _wave_row(rollout: Rollout, wave: Wave) -> list[str]:
    nodes = [rollout.nodes[n] for n in wave.nodes]
    states = Counter(p.state for p in nodes if p.step == Step.ANSWERED)
    failures = Counter(
        p.reason or str(p.state)
        for p in nodes
        if p.step == Step.ANSWERED and p.state in {UpdatePhase.FAILED, UpdatePhase.ROLLED_BACK}
    )
    offline = sum(1 for p in nodes if p.step == Step.OFFLINE)
    silent = sum(1 for p in nodes if p.step == Step.NO_ANSWER)
    offered = len(nodes) - offline
    answer_times = [
        p.answered_at - p.offered_at
        for p in nodes
        if p.answered_at is not None and p.offered_at is not None
    ]
    rolled_back = sum(1 for p in nodes if p.rollback == UpdatePhase.ROLLED_BACK)
    span = None
    if wave.started_at is not None and wave.ended_at is not None:
        span = wave.ended_at - wave.started_at
    return [
        str(wave.index + 1),
        wave.outcome or ("not started" if wave.started_at is None else "running"),
        str(len(nodes)),
        str(offered) if wave.started_at is not None else "-",
        str(states.get(UpdatePhase.INSTALLED, 0)),
        str(states.get(UpdatePhase.ALREADY_INSTALLED, 0)),
        ", ".join(f"{code(r, in_table=True)} {c}" for r, c in sorted(failures.items())) or "0",
        str(states.get(UpdatePhase.BUSY, 0) + states.get(UpdatePhase.CANCELLED, 0)),
        str(offline),
        str(silent),
        str(rolled_back),
        _duration(span),
        _duration(statistics.median(answer_times) if answer_times else None),
        _duration(max(answer_times) if answer_times else None),
    ]


COLUMNS = (
    "wave",
    "outcome",
    "nodes",
    "offered",
    "installed",
    "already installed",
    "failed (by reason)",
    "busy/cancelled",
    "offline (not offered)",
    "no answer",
    "rolled back",
    "wave took",
    "median answer",
    "slowest answer",
)


def markdown(rollout: Rollout, chart: Path | None) -> str:
    """The report as Markdown."""
    lines = [
        f"# Rollout {rollout.id}",
        "",
        f"- release {rollout.release} (version {rollout.version}, model sha256 "
        f"`{rollout.model_sha256[:16]}…`), from {rollout.base_url}",
        f"- target: {rollout.target}; {len(rollout.nodes)} nodes in {len(rollout.waves)} waves "
        f"(`--waves {rollout.waves_spec}`)",
        f"- thresholds: success >= {rollout.success_threshold:.0%}, errors <= "
        f"{rollout.error_threshold:.0%} of the nodes offered per wave; soak "
        f"{_duration(rollout.soak_s)}; node timeout {_duration(rollout.node_timeout_s)}; "
        f"rollback on halt: {'yes' if rollout.rollback_on_halt else 'no'}",
        f"- started {iso(rollout.created_at)}, ended {iso(rollout.finished_at) or '-'}: "
        f"**{rollout.status}**" + (f" ({rollout.halt_reason})" if rollout.halt_reason else ""),
    ]
    if rollout.resumed_at:
        lines.append(f"- resumed at {', '.join(str(iso(t)) for t in rollout.resumed_at)}")
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_wave_row(rollout, w)) + " |" for w in rollout.waves]
    problems = [
        (n, p)
        for n, p in sorted(rollout.nodes.items())
        if p.step == Step.NO_ANSWER or p.state in {UpdatePhase.FAILED, UpdatePhase.ROLLED_BACK}
    ]
    if problems:
        lines += ["", "Nodes that failed or gave no answer:", ""]
        for node, p in problems[:200]:
            what = p.state if p.step == Step.ANSWERED else f"no answer ({p.presence or '?'})"
            detail = ""
            if p.reason:
                detail = f" ({code(p.reason)}" + (f": {code(p.detail)})" if p.detail else ")")
            back = f", rollback {p.rollback}" if p.rollback else ""
            lines.append(f"- {code(node)} (wave {p.wave + 1}): {what}{detail}{back}")
        if len(problems) > 200:
            lines.append(f"- … and {len(problems) - 200} more (see the state file)")
    if chart is not None:
        lines += ["", f"![progress over time]({chart.name})"]
    return terminal("\n".join(lines)) + "\n"


def chart(rollout: Rollout, path: Path) -> Path:
    """Cumulative offered, installed, failed and silent nodes over time, waves marked."""
    import matplotlib  # noqa: PLC0415 - only the report needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    start = rollout.created_at
    series: dict[str, list[float]] = {
        "offered": [],
        "installed": [],
        "failed": [],
        "offline / no answer": [],
        "rolled back": [],
    }
    kinds = {
        "offered": "offered",
        UpdatePhase.INSTALLED: "installed",
        UpdatePhase.ALREADY_INSTALLED: "installed",
        UpdatePhase.FAILED: "failed",
        UpdatePhase.ROLLED_BACK: "failed",
        "offline": "offline / no answer",
        "no_answer": "offline / no answer",
        f"rollback:{UpdatePhase.ROLLED_BACK}": "rolled back",
    }
    span = max((rollout.finished_at or start) - start, 1.0)
    unit, scale = ("seconds", 1.0) if span < 180 else ("minutes", 60.0)
    for at, _node, what in sorted(rollout.timeline):
        name = kinds.get(what)
        if name is not None:
            series[name].append((at - start) / scale)
    figure, axes = plt.subplots(figsize=(9, 4.5))
    end = span / scale
    for name, times in series.items():
        if times:
            axes.step([0, *times, end], [0, *range(1, len(times) + 1), len(times)], where="post")
            axes.lines[-1].set_label(f"{name} ({len(times)})")
    for wave in rollout.waves:
        if wave.started_at is not None:
            x = (wave.started_at - start) / scale
            axes.axvline(x, color="grey", linestyle=":", linewidth=1)
            axes.annotate(f"w{wave.index + 1}", (x, 0), textcoords="offset points", xytext=(2, 2))
    axes.set_xlabel(f"{unit} since the rollout began")
    axes.set_ylabel("nodes")
    axes.set_title(f"Rollout {rollout.id}: release {rollout.release} ({rollout.status})")
    axes.legend(loc="upper left")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write(rollout: Rollout, markdown_path: Path) -> tuple[Path, Path]:
    """Write the Markdown report and its chart (same name, `.png`) beside each other."""
    png = chart(rollout, markdown_path.with_suffix(".png"))
    markdown_path.write_text(markdown(rollout, png), encoding="utf-8")
    return markdown_path, png
