"""The updater's files: `state.json` (what is installed, which slot is active, the rollback
target), the model slots and the staged downloads; read and written without following a link.

Everything below the OTA directory is the updater's own. A symbolic link, a FIFO or a device
found there (planted by someone with disk access) is refused, never followed: each directory
below the OTA directory and the file itself are opened with `O_NOFOLLOW`, one after the other
(`dir_fd`), and the file is checked to be a regular one (`nofollow.open_regular`: opened with
`O_NONBLOCK`, so a FIFO never blocks; `UnsafeFileError` otherwise), of at most
MAX_SLOT_FILE_BYTES before a byte of it is hashed. The OTA
directory itself is where the owner put it: its own path may go through links, as the storage
directory's may.

`state.json` is validated field by field as it is read back (`read_state`): types, ranges
(whole numbers up to 2^53 - 1), slot names, plain file names, digests, at most 1 MiB, UTF-8,
JSON of any depth. What cannot be used is set aside and said; nothing in it stops a start.
Each slot's files are recorded with their sha256 when it is installed, and checked against
them (`slot_problem`) at every point that picks a model.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final

from agent.core.refusal import Refused
from agent.core.states import FINAL_PHASES, UpdatePhase, UpdateReason, UpdateReport
from agent.guarded import nofollow
from agent.protocol import manifest as manifests

_LOGGER = logging.getLogger(__name__)

SLOTS: Final = ("a", "b")
STATE_FILE: Final = "state.json"
DAMAGED_STATE_FILE: Final = "state.json.damaged"
"""Where an unusable `state.json` is set aside (the newest one only)."""
MAX_STATE_BYTES: Final = 1 << 20
MAX_REPORTS: Final = 32
"""Results kept for after a start; older ones beyond this are dropped."""
MAX_SLOT_FILES: Final = 16
MAX_SLOT_FILE_BYTES: Final = 1 << 31
"""The largest file of a slot or a staged download read (2 GiB: a Piper voice is 20-120 MB);
a larger one is refused by its size, never hashed (a sparse file of terabytes would hold the
start for hours)."""
RELEASE_ENVELOPE: Final = "_manifest.json"
"""The signed envelope a slot was installed from, kept in the slot: the release's tiers are
checked against it at start (a name no release file can have: they begin with a letter or a
digit)."""
MAX_TEXT: Final = 128
MAX_DETAIL: Final = 300


class UnsafeFileError(OSError):
    """A link, or something other than a directory or a regular file, where the updater keeps
    its own files: refused, never followed."""


@dataclass(slots=True)
class Pending:
    slot: str
    release: int
    version: str
    attempts: int = 0
    offer: str = "start"
    """The offer that installed it: results reached after a restart are reported under it."""


@dataclass(slots=True)
class UpdateState:
    """What `state.json` holds."""

    release: int = 0
    version: str | None = None
    active: str | None = None
    model: str | None = None
    previous: str | None = None
    previous_release: int = 0
    previous_version: str | None = None
    previous_model: str | None = None
    pending: Pending | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    """Results reached before they could be published (delivered after the next start)."""
    model_sha256: str | None = None
    """The active slot's model digest, from its manifest (kept for states that have no
    `files`: written by earlier versions)."""
    previous_model_sha256: str | None = None
    revocation: dict[str, Any] | None = None
    """The newest verified revocation (`issued`, `min_release`, `revoked`), honoured before
    every install, every rollback and at every start."""
    files: dict[str, str] | None = None
    """Every file of the active slot with its sha256, from the verified manifest: checked
    before the slot is picked (start, rollback, revocation)."""
    previous_files: dict[str, str] | None = None
    last: dict[str, Any] | None = None
    """The last result of an update job the updater ran, as `reports` keeps one, with `at` (its
    epoch seconds): the state's `last_update` after a restart of the agent or its engine."""

    def revoked(self, release: int) -> bool:
        """Whether the stored revocation withdraws this release."""
        if self.revocation is None or release <= 0:
            return False
        return release < int(self.revocation["min_release"]) or release in set(
            self.revocation["revoked"]
        )


# ---- files opened without following links ----------------------------------------------------


def _refused(err: OSError, parts: Sequence[str]) -> OSError:
    """The error to raise for a failed open of root/parts: `UnsafeFileError` for a link or a
    wrong kind of file, the error itself otherwise."""
    where = "/".join(parts)
    if err.errno == errno.ELOOP:
        return UnsafeFileError(errno.ELOOP, f"{where} is a symbolic link (refused, not followed)")
    if err.errno == errno.ENOTDIR:
        return UnsafeFileError(errno.ENOTDIR, f"{where} is not a directory")
    if err.errno == errno.ENXIO:  # a FIFO without a reader, a socket
        return UnsafeFileError(errno.ENXIO, f"{where} is not a regular file")
    return err


def _open_directory(root: Path, parts: Sequence[str], *, create: bool = False) -> int:
    """A descriptor of root/parts…, each part opened without following a link (made first with
    `create`)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(parts, 1):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                inner = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as err:
                if err.errno == errno.ENOTDIR and _is_link(fd, name):
                    err = OSError(errno.ELOOP, "a link")  # O_DIRECTORY answers first
                raise _refused(err, parts[:depth]) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def directory(root: Path, *parts: str, create: bool = False) -> Iterator[int]:
    """root/parts… as a directory descriptor, checked link by link (see `_open_directory`)."""
    fd = _open_directory(root, parts, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def make_directory(root: Path, *parts: str) -> None:
    """Make root (with its parents) and root/parts… (each checked: never a link)."""
    root.mkdir(parents=True, exist_ok=True)
    with directory(root, *parts, create=True):
        pass


def open_file(
    root: Path,
    parts: Sequence[str],
    flags: int = os.O_RDONLY,
    mode: int = 0o644,
    max_bytes: int | None = None,
) -> int:
    """A descriptor of the regular file root/parts…: no directory below root and not the file
    itself is followed if it is a link, and a FIFO, a directory, a device or (with `max_bytes`)
    a larger file is refused before a byte is read (`UnsafeFileError`, by `nofollow`); a
    missing one is FileNotFoundError."""
    *folders, name = parts
    with directory(root, *folders) as parent:
        try:
            return nofollow.open_regular(parent, name, flags, mode, max_bytes=max_bytes)
        except nofollow.FileRefusedError as err:
            where = "/".join(parts)
            if isinstance(err, nofollow.SymlinkRefusedError):
                raise UnsafeFileError(
                    errno.ELOOP, f"{where} is {err.found} (refused, not followed)"
                ) from None
            raise UnsafeFileError(
                err.errno or errno.EINVAL, f"{where} is {err.found}, not a regular file"
            ) from None


def open_append(root: Path, parts: Sequence[str]) -> IO[bytes]:
    """The regular file root/parts… opened to append, made if missing (never through a link)."""
    return os.fdopen(open_file(root, parts, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def write_new(parent: int, name: str, data: bytes) -> None:
    """Write a new regular file `name` in the directory `parent` (never over an existing one,
    never through a link)."""
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=parent,
    )
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def file_size(root: Path, parts: Sequence[str]) -> int | None:
    """The size of the regular file root/parts…, None when it is missing."""
    try:
        fd = open_file(root, parts)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def sha256_of(root: Path, parts: Sequence[str], max_bytes: int = MAX_SLOT_FILE_BYTES) -> str:
    """The sha256 of the regular file root/parts… (never of what a link points to; one over
    `max_bytes` is refused by its size, never read)."""
    with os.fdopen(open_file(root, parts, max_bytes=max_bytes), "rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def read_limited(root: Path, parts: Sequence[str], limit: int) -> bytes:
    """The bytes of the regular file root/parts…; UnsafeFileError beyond `limit` (by its size,
    before a byte is read), ValueError when it grew beyond it while read."""
    with os.fdopen(open_file(root, parts, max_bytes=limit), "rb") as data:
        body = data.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"{'/'.join(parts)} is over {limit} bytes")
    return body


remove = nofollow.remove
"""Remove an entry of a directory, whatever it is (a link, never what it points to; a
directory with what it holds): `nofollow.remove`."""
entries = nofollow.entries
"""The names in a directory with what lstat says of each: `nofollow.entries`."""


def kind_of(info: os.stat_result) -> str:
    """What an entry is, for a report ("a file", "a FIFO", "a symbolic link", ...)."""
    return "a file" if stat.S_ISREG(info.st_mode) else nofollow.describe(info.st_mode)


# ---- the slots -------------------------------------------------------------------------------


def slot_files(state: UpdateState) -> dict[str, str] | None:
    """The active slot's files with their recorded digests (the model alone for a state of an
    earlier version), None if nothing was recorded."""
    if state.files:
        return dict(state.files)
    if state.model is not None and state.model_sha256 is not None:
        return {state.model: state.model_sha256}
    return None


def slot_problem(root: Path, state: UpdateState) -> Refused[UpdateReason] | None:
    """Why the active slot of `state` may not be picked (`revoked` or `damaged`, and a detail),
    None if it may (the configured model always may). Every recorded file is read again,
    without following a link, and its sha256 compared with the one it was installed with."""
    if state.active is None or state.model is None:
        return None
    if state.revoked(state.release):
        return Refused(UpdateReason.REVOKED, f"release {state.release} was revoked")
    recorded = slot_files(state)
    if recorded is None:
        return Refused(UpdateReason.DAMAGED, f"slots/{state.active}: no digest was recorded for it")
    if state.model not in recorded:
        detail = f"slots/{state.active}: its model {state.model} has no recorded digest"
        return Refused(UpdateReason.DAMAGED, detail)
    problem = files_problem(root, state.active, recorded)
    return None if problem is None else Refused(UpdateReason.DAMAGED, problem)


def files_problem(root: Path, slot: str, recorded: Mapping[str, str]) -> str | None:
    """What is wrong with a slot's files (missing, a link, not a regular file, unreadable, not
    the digest recorded), None if each is the regular file it was installed as."""
    for name, digest in sorted(recorded.items()):
        where = f"slots/{slot}/{name}"
        try:
            actual = sha256_of(root, ("slots", slot, name))
        except FileNotFoundError:
            return f"{where} is missing"
        except UnsafeFileError as err:
            return str(err.strerror)
        except OSError as err:
            return f"{where} cannot be read ({err.strerror})"
        if actual != digest:
            return f"{where} no longer has the digest it was installed with"
    return None


def rolled_back(state: UpdateState, *, keep_other: bool = True) -> UpdateState:
    """The state with the previous slot active again. With `keep_other` the slot left becomes
    the previous one (a second rollback returns to it); without, it is no rollback target (it
    was never confirmed: failed starts, a refused switch)."""
    back = replace(
        state,
        release=state.previous_release,
        version=state.previous_version,
        active=state.previous,
        model=state.previous_model,
        model_sha256=state.previous_model_sha256,
        files=state.previous_files,
        previous=state.active,
        previous_release=state.release,
        previous_version=state.version,
        previous_model=state.model,
        previous_model_sha256=state.model_sha256,
        previous_files=state.files,
        pending=None,
    )
    return back if keep_other else without_previous(back)


def without_previous(state: UpdateState) -> UpdateState:
    """The state with no rollback target."""
    return replace(
        state,
        previous=None,
        previous_release=0,
        previous_version=None,
        previous_model=None,
        previous_model_sha256=None,
        previous_files=None,
    )


def last_result(state: UpdateState) -> tuple[UpdateReport, float] | None:
    """The last result of an update job (kept in `state.json` across restarts) and its epoch
    seconds, or None."""
    if state.last is None:
        return None
    fields = {key: value for key, value in state.last.items() if key != "at"}
    return UpdateReport(**{**fields, "state": UpdatePhase(fields["state"])}), state.last["at"]


def on_factory(state: UpdateState) -> UpdateState:
    """The state with the configured model active and no rollback target (the revocation and
    the reports kept)."""
    return without_previous(
        replace(
            state,
            release=0,
            version=None,
            active=None,
            model=None,
            model_sha256=None,
            files=None,
            pending=None,
        )
    )


# ---- state.json -----------------------------------------------------------------------------


class StateError(ValueError):
    """`state.json` cannot be used as a whole (its detail says why, never what it holds)."""


@dataclass(frozen=True, slots=True)
class ReadState:
    """What was read back: the state to use, why the file as a whole was not used (None if it
    was), and what of it was set aside."""

    state: UpdateState
    unusable: str | None = None
    set_aside: tuple[str, ...] = ()


def read_state(root: Path) -> ReadState:
    """The persisted state, validated; a fresh one when there is none or it cannot be used
    (a link, not a regular file, over 1 MiB, not UTF-8, not JSON, any field wrong)."""
    try:
        data = read_limited(root, (STATE_FILE,), MAX_STATE_BYTES)
    except FileNotFoundError:
        return ReadState(UpdateState())
    except UnsafeFileError as err:
        return ReadState(UpdateState(), str(err.strerror))
    except (OSError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) else str(err)
        return ReadState(UpdateState(), f"{STATE_FILE} cannot be read: {why}")
    try:
        state, notes = parse_state(data)
    except StateError as err:
        return ReadState(UpdateState(), f"{STATE_FILE}: {err}")
    return ReadState(state, None, tuple(notes))


def load_state(root: Path) -> UpdateState:
    """The persisted state (a fresh one when there is none or it cannot be used; see
    `read_state`)."""
    found = read_state(root)
    if found.unusable is not None:
        _LOGGER.error("%s: starting from the configured model", found.unusable)
    return found.state


def set_aside(root: Path) -> None:
    """Move an unusable `state.json` (whatever it is: a link is moved, never followed) to
    `state.json.damaged`, replacing an older one."""
    try:
        with directory(root) as fd:
            with contextlib.suppress(FileNotFoundError):
                remove(fd, DAMAGED_STATE_FILE)
            os.rename(STATE_FILE, DAMAGED_STATE_FILE, src_dir_fd=fd, dst_dir_fd=fd)
    except FileNotFoundError:
        return
    except OSError as err:
        _LOGGER.error("Could not set %s aside: %s", STATE_FILE, err)


def save_state(root: Path, state: UpdateState) -> None:
    """Write the state atomically and durably: temporary file, fsync, rename, fsync of the dir
    (a link at `state.json` is replaced, never written through)."""
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(state), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, root / STATE_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with directory(root) as directory_fd:
        os.fsync(directory_fd)


def parse_state(data: bytes) -> tuple[UpdateState, list[str]]:
    """The state in these bytes and what was set aside of it: a rollback target that is not
    usable as written (then none), results that are not (dropped). StateError when the active
    choice, the pending switch or the revocation cannot be used: the configured model then."""
    try:
        body = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise StateError("not UTF-8") from None
    except RecursionError:
        raise StateError("nested too deeply") from None
    except ValueError as err:
        raise StateError(f"not JSON ({type(err).__name__})") from None
    if not isinstance(body, dict):
        raise StateError(f"a JSON {type(body).__name__}, not an object")
    notes: list[str] = []
    try:
        state = UpdateState(
            release=_number(body, "release"),
            version=_text(body, "version"),
            active=_slot(body, "active"),
            model=_model(body, "model"),
            model_sha256=_digest(body, "model_sha256"),
            files=_files(body, "files"),
            pending=_pending(body.get("pending")),
            revocation=_revocation(body.get("revocation")),
        )
    except (TypeError, ValueError) as err:
        raise StateError(str(err)) from None
    _consistent(state.active, state.model, state.release, "")
    if state.pending is not None and (
        state.pending.slot != state.active or state.pending.release != state.release
    ):
        raise StateError("pending: not the active slot and release")
    try:
        previous = replace(
            state,
            previous=_slot(body, "previous"),
            previous_release=_number(body, "previous_release"),
            previous_version=_text(body, "previous_version"),
            previous_model=_model(body, "previous_model"),
            previous_model_sha256=_digest(body, "previous_model_sha256"),
            previous_files=_files(body, "previous_files"),
        )
        _consistent(
            previous.previous, previous.previous_model, previous.previous_release, "previous: "
        )
        if previous.previous is not None and previous.previous == state.active:
            raise ValueError("previous: the active slot itself")
        state = previous
    except (TypeError, ValueError) as err:
        notes.append(f"the rollback target ({err})")
    state.reports = _reports(body, notes)
    if body.get("last") is not None:
        try:
            state.last = _last(body["last"])
        except (TypeError, ValueError, KeyError):
            notes.append("the last result (not one)")
    return state, notes


def _reports(body: Mapping[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    """The results kept for after a start (the newest MAX_REPORTS); what is set aside is noted."""
    reports = body.get("reports", [])
    if not isinstance(reports, list):
        notes.append("reports (not a list)")
        reports = []
    kept = []
    for raw in reports[-MAX_REPORTS:]:
        try:
            kept.append(_report(raw))
        except (TypeError, ValueError, KeyError):
            notes.append("a result that is not one")
    if len(reports) > MAX_REPORTS:
        notes.append(f"{len(reports) - MAX_REPORTS} older results")
    return kept


def _consistent(slot: str | None, model: str | None, release: int, prefix: str) -> None:
    if (slot is None) != (model is None):
        raise StateError(f"{prefix}a slot without its model, or a model without its slot")
    if slot is None and release != 0:
        raise StateError(f"{prefix}release {release} without a slot")


def _number(body: Mapping[str, Any], key: str, default: int = 0) -> int:
    raw = body.get(key, default)
    if not manifests.whole_number(raw):
        raise ValueError(f"{key}: expected a whole number 0..{manifests.MAX_NUMBER}")
    return int(raw)


def _printable(raw: object, limit: int) -> bool:
    return isinstance(raw, str) and 0 < len(raw) <= limit and raw.isprintable()


def _text(body: Mapping[str, Any], key: str, limit: int = MAX_TEXT) -> str | None:
    raw = body.get(key)
    if raw is None:
        return None
    if not _printable(raw, limit):
        raise ValueError(f"{key}: expected printable text of 1-{limit} characters")
    return str(raw)


def _slot(body: Mapping[str, Any], key: str) -> str | None:
    raw = body.get(key)
    if raw is not None and raw not in SLOTS:
        raise ValueError(f"{key}: expected a slot name ({', '.join(SLOTS)}) or null")
    return None if raw is None else str(raw)


def _model(body: Mapping[str, Any], key: str) -> str | None:
    raw = body.get(key)
    if raw is None:
        return None
    if not manifests.plain_name(raw) or not str(raw).endswith(".onnx"):
        raise ValueError(f"{key}: expected a plain .onnx file name")
    return str(raw)


def _digest(body: Mapping[str, Any], key: str) -> str | None:
    raw = body.get(key)
    if raw is not None and not manifests.is_sha256(raw):
        raise ValueError(f"{key}: expected a sha256 (64 lowercase hex digits)")
    return None if raw is None else str(raw)


def _files(body: Mapping[str, Any], key: str) -> dict[str, str] | None:
    raw = body.get(key)
    if raw is None:
        return None
    if (
        not isinstance(raw, dict)
        or not 0 < len(raw) <= MAX_SLOT_FILES
        or not all(manifests.plain_name(k) and manifests.is_sha256(v) for k, v in raw.items())
    ):
        raise ValueError(f"{key}: expected plain file names with their sha256")
    return {str(k): str(v) for k, v in raw.items()}


def _pending(raw: object) -> Pending | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError("pending: expected an object")
    slot = _slot(raw, "slot")
    version, offer = _text(raw, "version"), _text(raw, "offer")
    if slot is None or version is None:
        raise ValueError("pending: expected its slot and version")
    return Pending(
        slot, _number(raw, "release"), version, _number(raw, "attempts"), offer or "start"
    )


def _revocation(raw: object) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError("revocation: expected an object")
    issued = raw.get("issued")
    if not _printable(issued, 64):
        raise ValueError("revocation.issued: expected a time")
    moment = datetime.fromisoformat(str(issued))  # ValueError when it is not one
    if moment.tzinfo is None:
        raise ValueError("revocation.issued: expected a time with its zone")
    revoked = raw.get("revoked", [])
    if not isinstance(revoked, list) or len(revoked) > 10_000:
        raise ValueError("revocation.revoked: expected a list of releases")
    listed = [_number({"r": r}, "r") for r in revoked]
    return {
        "issued": moment.isoformat(),
        "min_release": _number(raw, "min_release"),
        "revoked": listed,
    }


_REPORT_TEXTS: Final = ("reason", "version")


def _last(raw: object) -> dict[str, Any]:
    """The last result: a result as `_report` reads it, and `at`, finite epoch seconds."""
    report = _report(raw)
    at = raw.get("at") if isinstance(raw, dict) else None
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise TypeError("at")
    return {**report, "at": float(at)}


def _report(raw: object) -> dict[str, Any]:
    """A result kept for after a start, as `asdict(UpdateReport)` wrote it."""
    if not isinstance(raw, dict):
        raise TypeError("not an object")
    offer = _text(raw, "offer")
    phase = UpdatePhase(raw["state"])  # ValueError for any other
    if offer is None or phase not in FINAL_PHASES:
        raise ValueError("not a final result")
    detail = raw.get("detail", "")
    if not isinstance(detail, str):
        raise TypeError("detail")
    release = raw.get("release")
    if release is not None:
        release = _number(raw, "release")
    report: dict[str, Any] = {
        "offer": offer,
        "state": phase.value,
        "detail": "".join(c if c.isprintable() else "?" for c in detail[:MAX_DETAIL]),
        "release": release,
    }
    report |= {key: _text(raw, key) for key in _REPORT_TEXTS}
    return report
