"""The default voice's INT8 tier on this node (`tts.tier`): the speed measured at start, and the
variant built and judged by a child process (`python -m tiers.auto`), kept in the model cache.

The child writes its figures (`result.json`) beside the variant in a directory named like the
voice's optimized copies (model digest, ONNX Runtime version, CPU): a later start with the same
model, runtime and CPU reads them instead of building again, after checking the variant's
sha256 and the source model's. The gate itself is the core's (`agent.core.tiers`). The build's
memory leaves with the child; the agent only loads the variant that passed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.guarded import nofollow
from agent.speech.sessions import cache_stem
from agent.speech.voice import SynthesisParams, Voice

_LOGGER = logging.getLogger(__name__)

SPEED_TEXT: Final = "The parcel for the second floor has been left at the front desk."
"""What the speed is measured on at start (~3 s of speech)."""
RESULT: Final = "result.json"
RESULT_MAX_BYTES: Final = 64 * 1024
BUILD_MEMORY_MB: Final = 700
"""Memory the child needs (MB of MemAvailable): its peak was 620 MB on the bundled medium voice
(ONNX Runtime's calibration session; docs/quantization.md). Below it the variant is not built:
a 512 MB board gets its INT8 tier from the operator (`python -m tiers.quantize`, then OTA)."""
BUILD_TIMEOUT_S: Final = 3600.0
"""Longest the child may take (seconds): ~80 s here, many minutes on a Pi 3."""


@dataclass(frozen=True, slots=True)
class Built:
    """The child's figures for one variant (None where it could not say)."""

    path: Path | None
    speedup: float | None
    distance_db: float | None
    error: str | None = None


def measure_speed(voice: Voice, params: SynthesisParams) -> float:
    """Seconds of speech per second of synthesis on this node, now: the faster of two runs of
    SPEED_TEXT (the voice prewarmed), decoded as phrases are (the largest chunks)."""
    ids = voice.sentence_ids(SPEED_TEXT)[0]
    best = float("inf")
    samples = 0
    for _ in range(2):
        started = time.perf_counter()
        samples = len(voice.render(ids, params))
        best = min(best, time.perf_counter() - started)
    return samples / voice.sample_rate / max(best, 1e-6)


def tier_dir(cache_dir: Path, digest: str) -> Path:
    """Where the INT8 variant of the model with this digest is built and kept."""
    return Path(f"{cache_stem(cache_dir, digest)}.int8")


def known(folder: Path, digest: str) -> Built | None:
    """The figures of a variant built earlier for this model, if its files are whole."""
    try:
        handle = nofollow.open_directory(folder, create=False)
    except OSError:
        return None
    try:
        raw = json.loads(nofollow.read_file(handle, RESULT, RESULT_MAX_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(handle)
    if not isinstance(raw, dict) or raw.get("source_sha256") != digest:
        return None
    error = raw.get("error")
    if error is not None:
        return Built(None, None, None, str(error)[:200])
    path = Path(str(raw.get("file", "")))
    if path.parent != folder or not _whole(path, raw.get("sha256")):
        return None
    return Built(path, _number(raw.get("speedup")), _number(raw.get("distance_db")))


def build(model: Path, folder: Path, digest: str, timeout: float = BUILD_TIMEOUT_S) -> Built:
    """Build and measure the variant in a child process (its output to the agent's log)."""
    free = available_mb()
    if free is not None and free < BUILD_MEMORY_MB:
        return Built(None, None, None, f"{free:.0f} MB free, the build needs {BUILD_MEMORY_MB}")
    with contextlib.suppress(FileNotFoundError):
        (folder / RESULT).unlink()
    command = [sys.executable, "-m", "tiers.auto", str(model), "--out", str(folder)]
    _LOGGER.info("INT8 tier: building it from %s in a child process", model.name)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Built(None, None, None, f"the build took more than {timeout:.0f} s")
    except OSError as err:
        return Built(None, None, None, f"the build did not start: {err}")
    found = known(folder, digest)
    if found is None:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no result"]
        return Built(
            None, None, None, f"the build failed (exit {done.returncode}): {tail[0][:200]}"
        )
    return found


def available_mb() -> float | None:
    """MemAvailable in MB (None where the kernel does not say)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return None


def _whole(path: Path, sha256: object) -> bool:
    if not isinstance(sha256, str):
        return False
    try:
        fd = nofollow.open_file(path)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest() == sha256


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
