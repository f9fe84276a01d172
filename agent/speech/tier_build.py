"""The default voice's INT8 tier on this node (`tts.tier`): its measurements and variants, each
made by a child process (`python -m tiers.auto`), kept in the model cache and sealed.

Three kinds of work, each in a child of its own (its memory leaves with it):
- the FP32 speed (`speed`): seconds of speech per CPU second of the child, one thread,
  repeated rounds; other processes' load is measured alongside (`busy_share`);
- judging a variant the installed release carries (`judge`): its speed by CPU time against
  FP32 and its distance at the default noise on held-out sentences, on this CPU;
- building the variant here (`build`), only with `BUILD_MEMORY_MB` available, then judging it.

Each result is written by the child as `result.json` (or `speed.json`) in a directory named
like the voice's optimized copies (model digest, ONNX Runtime version, CPU), and **sealed** by
the agent as soon as the child has finished: `seal.json` beside it records the sha256 of every
file the result stands for (the result itself, the variant and the variant's `.onnx.json`) and
an HMAC-SHA256 over that list with the node's key (`tier-seal.key` in the storage directory,
mode 0600, never in the cache). A later start uses a result only when its seal checks and every
file still has its recorded digest: a byte changed in any of them (the figures, the variant, its
JSON) means the work is done again (or, for a release's variant whose signed digest no longer
matches, refused), never `passed`. Every file here is read without following a link and with
a size bound (`agent.guarded.nofollow`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from agent.guarded import nofollow
from agent.speech.sessions import cache_stem

_LOGGER = logging.getLogger(__name__)

RESULT: Final = "result.json"
SPEED: Final = "speed.json"
SEAL: Final = "seal.json"
KEY_FILE: Final = "tier-seal.key"
KEY_BYTES: Final = 32
RESULT_MAX_BYTES: Final = 64 * 1024
JSON_MAX_BYTES: Final = 1024 * 1024
"""A voice's `.onnx.json` (the phoneme map: ~5 KB) read at most this large."""
VARIANT_MAX_BYTES: Final = 512 * 1024 * 1024
SPEED_MEMORY_MB: Final = 300
"""Memory the speed measurement needs (MB, as `BUILD_MEMORY_MB`): its child loads the FP32 voice
beside the node's (bench/TIERS.md: 278 MB peak). Below it (a 256 MB board), the node keeps FP32
and says why in the state, rather than have the child or the node OOM-killed."""
BUILD_MEMORY_MB: Final = 640
"""Memory the on-device build needs (MB of MemAvailable, or of the memory cgroup's room): its
calibration child's measured peak on the bundled medium voice (507 MB, percentile ranges one
sentence at a time) beside the waiting builder (~90 MB), and a margin (docs/quantization.md).
Below it the variant is not built here: the node uses what its release carries
(`python -m tiers build`, then OTA)."""
BUILD_TIMEOUT_S: Final = 3600.0
"""Longest a child may take (seconds): ~1 min here, many minutes on a Pi 3."""
BUSY_SHARE: Final = 0.5
"""A measurement during which other processes used more than this share of the CPUs is
re-checked when the node is idle (its CPU time is still the figure: the re-check is for the
caches and the clock a busy machine shares)."""


@dataclass(frozen=True, slots=True)
class Built:
    """The figures of one variant on this CPU (None where they could not be had)."""

    path: Path | None
    speedup: float | None
    distance_db: float | None
    error: str | None = None
    fp32_speed: float | None = None
    busy_share: float | None = None
    source: str = "built"
    """`built` here or carried by the `release`."""


@dataclass(frozen=True, slots=True)
class Speed:
    """FP32's speed on this CPU: seconds of speech per CPU second (one thread)."""

    fp32_speed: float
    busy_share: float | None = None


@dataclass(frozen=True, slots=True)
class Carried:
    """A variant the installed release carries, its files checked against the signed
    manifest."""

    name: str
    path: Path
    sha256: str
    json_sha256: str
    extra: Mapping[str, Any] = field(default_factory=dict)


def tier_dir(cache_dir: Path, digest: str, variant: str | None = None) -> Path:
    """Where the tier work for the model with this digest is kept: its own build (`.int8`),
    or the judgement of a release's variant with this sha256 (`.tier-<sha256 prefix>`)."""
    stem = cache_stem(cache_dir, digest)
    return Path(f"{stem}.int8" if variant is None else f"{stem}.tier-{variant[:16]}")


# ---- the node's key and the seals ----------------------------------------------------------


def seal_key(storage_dir: Path) -> bytes:
    """The node's sealing key (made on first use: 32 random bytes, mode 0600), read without
    following a link."""
    folder = nofollow.open_directory(storage_dir)
    try:
        with contextlib.suppress(FileNotFoundError):
            key = nofollow.read_file(folder, KEY_FILE, KEY_BYTES)
            if len(key) == KEY_BYTES:
                return key
            _LOGGER.warning("%s has %d bytes: made anew", KEY_FILE, len(key))
        key = secrets.token_bytes(KEY_BYTES)
        nofollow.write_file_atomic(folder, KEY_FILE, key, mode=0o600)
        return key
    finally:
        os.close(folder)


def _mac(key: bytes, files: Mapping[str, str]) -> str:
    canonical = json.dumps(dict(sorted(files.items())), separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def write_seal(folder: Path, key: bytes, files: Mapping[str, str]) -> None:
    """Seal what a result stands for: each file's sha256 (by label) under the node's HMAC."""
    handle = nofollow.open_directory(folder, create=False)
    try:
        body = {"files": dict(files), "mac": _mac(key, files)}
        nofollow.write_file_atomic(handle, SEAL, json.dumps(body, indent=1).encode())
    finally:
        os.close(handle)


def read_seal(handle: int, key: bytes) -> dict[str, str] | None:
    """The sealed digests of a folder (opened), or None when there is no seal, it is not a
    regular file, too large, unreadable, or its HMAC is not the node's."""
    try:
        raw = json.loads(nofollow.read_file(handle, SEAL, RESULT_MAX_BYTES))
        files = raw["files"]
        mac = raw["mac"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if not (isinstance(files, dict) and isinstance(mac, str)):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None
    if not hmac.compare_digest(_mac(key, files), mac):
        _LOGGER.warning("A tier seal does not check (not this node's key): its result is redone")
        return None
    return dict(files)


def digest_of(path: Path, limit: int = VARIANT_MAX_BYTES) -> str | None:
    """The sha256 of a regular file (a link, a FIFO or a device refused, never followed; a
    file over `limit` refused), None when it cannot be had."""
    try:
        fd = nofollow.open_file(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as data:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return hashlib.file_digest(data, "sha256").hexdigest()


def _sealed_result(folder: Path, key: bytes, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A result file and the seal over it; ValueError when either is missing or does not
    check (the result's own digest is compared with the sealed one on the bytes parsed)."""
    try:
        handle = nofollow.open_directory(folder, create=False)
    except OSError as err:
        raise ValueError(f"no folder: {err}") from None
    try:
        files = read_seal(handle, key)
        if files is None:
            raise ValueError("no seal of this node")
        try:
            data = nofollow.read_file(handle, name, RESULT_MAX_BYTES)
        except OSError as err:
            raise ValueError(f"{name}: {err}") from None
    finally:
        os.close(handle)
    if len(data) > RESULT_MAX_BYTES or hashlib.sha256(data).hexdigest() != files.get(name):
        raise ValueError(f"{name} is not the sealed one")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError(f"{name} is no JSON") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{name} is no object")
    return raw, files


# ---- what was done before -----------------------------------------------------------------


def known(folder: Path, digest: str, key: bytes, carried: Carried | None = None) -> Built | None:
    """The figures of a variant judged earlier for this model, when the seal checks and the
    result, the variant and its JSON are each still the file sealed (a release's variant also
    still the one its signed manifest names); None: do the work again."""
    try:
        raw, files = _sealed_result(folder, key, RESULT)
    except ValueError as err:
        _LOGGER.debug("Tier result in %s not used: %s", folder, err)
        return None
    if raw.get("source_sha256") != digest:
        return None
    error = raw.get("error")
    if error is not None:
        return Built(None, None, None, str(error)[:200], source=_source(carried))
    path = Path(str(raw.get("file", "")))
    if not _where_expected(path, files, folder, carried):
        return None
    if not _whole(path, files):
        _LOGGER.warning("INT8 tier: %s or its JSON changed since it was sealed", path.name)
        return None
    return Built(
        path,
        number(raw.get("speedup")),
        number(raw.get("distance_db")),
        fp32_speed=number(raw.get("fp32_speed")),
        busy_share=number(raw.get("busy_share")),
        source=_source(carried),
    )


def _where_expected(
    path: Path, files: Mapping[str, str], folder: Path, carried: Carried | None
) -> bool:
    """A variant built here lies in its own folder; a release's is the one its signed
    manifest names (path and digests)."""
    if carried is None:
        return path.parent == folder
    return (
        path == carried.path
        and files.get("variant") == carried.sha256
        and files.get("variant.json") == carried.json_sha256
    )


def _source(carried: Carried | None) -> str:
    return "built" if carried is None else "release"


def _whole(variant: Path, files: Mapping[str, str]) -> bool:
    """Whether the variant and its JSON are the files sealed."""
    return (
        digest_of(variant) == files.get("variant")
        and digest_of(Path(f"{variant}.json"), JSON_MAX_BYTES) == files.get("variant.json")
        and files.get("variant") is not None
    )


def known_speed(folder: Path, digest: str, key: bytes) -> Speed | None:
    """FP32's speed measured earlier for this model on this CPU, when sealed and whole."""
    try:
        raw, _ = _sealed_result(folder, key, SPEED)
    except ValueError:
        return None
    speed = number(raw.get("fp32_speed"))
    if raw.get("source_sha256") != digest or speed is None or speed <= 0:
        return None
    return Speed(speed, number(raw.get("busy_share")))


# ---- the children ---------------------------------------------------------------------------


def measure_speed(
    model: Path, folder: Path, digest: str, key: bytes, available: float | None = None
) -> Speed | str:
    """FP32's speed on this CPU, measured by the child (only with `SPEED_MEMORY_MB` available:
    the child loads the voice beside the node's own) and sealed; why not, as text."""
    free = available_mb() if available is None else available
    if free is not None and free < SPEED_MEMORY_MB:
        return f"{free:.0f} MB free, the measurement needs {SPEED_MEMORY_MB}"
    done = _child(model, folder, ["--speed-only"], SPEED)
    if done is not None:
        return done
    files = {SPEED: digest_of(folder / SPEED, RESULT_MAX_BYTES) or ""}
    write_seal(folder, key, files)
    found = known_speed(folder, digest, key)
    return found if found is not None else "the speed could not be read back"


def judge(
    model: Path, carried: Carried, folder: Path, digest: str, *, key: bytes, timeout: float = 0
) -> Built:
    """Judge a variant the release carries, on this CPU (the child), and seal the result."""
    done = _child(
        model, folder, ["--variant", str(carried.path)], RESULT, timeout or BUILD_TIMEOUT_S
    )
    if done is not None:
        return Built(None, None, None, done, source="release")
    return _sealed_now(folder, digest, key, carried)


def build(
    model: Path,
    folder: Path,
    digest: str,
    key: bytes,
    *,
    timeout: float = BUILD_TIMEOUT_S,
    available: float | None = None,
) -> Built:
    """Build the variant here (only with `BUILD_MEMORY_MB` available), judge it, seal it."""
    free = available_mb() if available is None else available
    if free is not None and free < BUILD_MEMORY_MB:
        return Built(None, None, None, f"{free:.0f} MB free, the build needs {BUILD_MEMORY_MB}")
    _LOGGER.info("INT8 tier: building it from %s in a child process", model.name)
    done = _child(model, folder, ["--build"], RESULT, timeout)
    if done is not None:
        return Built(None, None, None, done)
    return _sealed_now(folder, digest, key, None)


def _sealed_now(folder: Path, digest: str, key: bytes, carried: Carried | None) -> Built:
    """Seal what the child has just written (read back once, without following links) and
    return its figures through the same check a later start makes."""
    try:
        handle = nofollow.open_directory(folder, create=False)
        try:
            data = nofollow.read_file(handle, RESULT, RESULT_MAX_BYTES)
        finally:
            os.close(handle)
        raw = json.loads(data)
    except (OSError, ValueError, RecursionError) as err:
        return Built(None, None, None, f"no result: {err}"[:200], source=_source(carried))
    if not isinstance(raw, dict):
        return Built(None, None, None, "no result", source=_source(carried))
    files = {RESULT: hashlib.sha256(data).hexdigest()}
    if "file" in raw and raw.get("error") is None:
        variant = Path(str(raw["file"]))
        files["variant"] = digest_of(variant) or ""
        files["variant.json"] = digest_of(Path(f"{variant}.json"), JSON_MAX_BYTES) or ""
    write_seal(folder, key, files)
    found = known(folder, digest, key, carried)
    if found is None:
        return Built(None, None, None, "the result does not check", source=_source(carried))
    return found


def _child(
    model: Path, folder: Path, arguments: Sequence[str], written: str, timeout: float = 0
) -> str | None:
    """Run `python -m tiers.auto MODEL --out FOLDER ARGUMENTS`; None when it wrote its
    result, else why not."""
    try:
        nofollow.check_directory(folder)
        handle = nofollow.open_directory(folder, create=False)
    except OSError as err:
        return f"the folder {folder.name} cannot be used: {err}"[:200]
    try:
        for name in (written, SEAL):
            nofollow.unlink(handle, name)
    finally:
        os.close(handle)
    command = [sys.executable, "-m", "tiers.auto", str(model), "--out", str(folder), *arguments]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout or BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"the child took more than {timeout or BUILD_TIMEOUT_S:.0f} s"
    except OSError as err:
        return f"the child did not start: {err}"
    if digest_of(folder / written, RESULT_MAX_BYTES) is None:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no result"]
        return f"the child failed (exit {done.returncode}): {tail[0][:200]}"
    return None


# ---- the machine -----------------------------------------------------------------------------


def available_mb() -> float | None:
    """MemAvailable in MB, or the cgroup's room when it is smaller (None where neither is
    said)."""
    found: list[float] = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) / 1024)
    room = cgroup_room_mb()
    if room is not None:
        found.append(room)
    return min(found) if found else None


def cgroup_room_mb() -> float | None:
    """What this process's memory cgroup (v2 or v1) still allows, in MB (None: no limit)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            base = None
            if hierarchy == "0" and controllers == "":
                base = Path("/sys/fs/cgroup") / path.lstrip("/")
                limit_file, usage_file = base / "memory.max", base / "memory.current"
            elif "memory" in controllers.split(","):
                base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
                limit_file = base / "memory.limit_in_bytes"
                usage_file = base / "memory.usage_in_bytes"
            if base is None or not limit_file.exists():
                continue
            limit = limit_file.read_text(encoding="ascii").strip()
            if limit == "max" or int(limit) >= 1 << 60:
                return None
            return (int(limit) - int(usage_file.read_text(encoding="ascii"))) / 2**20
    return None


def other_load() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine so far (`/proc/stat`), for the share
    other processes take (`busy_share`)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()[1:]
        values = [int(v) for v in fields[:8]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)
    return 0, 0


def number(value: object) -> float | None:
    """A JSON number as a float (not a bool, not NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    result = float(value)
    return result if math.isfinite(result) else None
