"""The steps the harnesses share to build a client's own venv in the cache (Home Assistant, the
SCADA stand-in): each build step logged, and the finished venv put in place whole."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_step(command: Sequence[str], log: Path) -> str:
    """Run a build step, its output appended to `log`; its stdout, or an error with the tail."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{command[:4]} failed ({result.returncode}):\n{tail}")
    return result.stdout


def put_in_place(work: Path, final: Path, record: dict[str, Any]) -> None:
    """The venv built in `work`, with its `installed.json`, renamed to `final` (the caller holds
    the build lock)."""
    (work / "installed.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    if final.exists():  # an unfinished venv left by an interrupted build before the lock
        shutil.rmtree(final)
    work.rename(final)
