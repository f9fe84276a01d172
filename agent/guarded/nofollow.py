"""Files and directories of the agent's own (the journal, the phrase cache, optimized models)
opened without following symbolic links.

Whoever can write in a directory the agent owns could plant a symbolic link there, so that the
agent, with its rights, reads, overwrites or deletes a file elsewhere (another program's state,
a device). So each directory the agent keeps files in is opened with O_NOFOLLOW (a link is
refused, with an error that says so), and the files in it are reached through that open
directory (`dir_fd`), each with O_NOFOLLOW. The parents of a configured directory are the
operator's, and followed.

No state, no thread: any edge may use it (like the standard library).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SymlinkRefusedError(OSError):
    """A path the agent keeps files under is a symbolic link (or no directory): refused."""

    def __init__(self, path: object, what: str = "a symbolic link") -> None:
        super().__init__(errno.ELOOP, f"{path} is {what}: refused, not followed")


def open_directory(path: Path, *, create: bool = True) -> int:
    """An open descriptor of directory `path` (made with mode 0700, and its parents, when
    `create`); raises SymlinkRefusedError when `path` itself is a symbolic link or no directory,
    OSError when it cannot be made or opened."""
    if create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    return _opened_directory(path, lambda: os.open(path, _DIR_FLAGS), lambda: os.lstat(path))


def open_subdirectory(dir_fd: int, name: str, *, create: bool = True) -> int:
    """An open descriptor of the directory `name` inside `dir_fd` (made, mode 0700, when
    `create`); raises SymlinkRefusedError for a symbolic link or a file of another kind."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=dir_fd)
    return _opened_directory(
        name,
        lambda: os.open(name, _DIR_FLAGS, dir_fd=dir_fd),
        lambda: os.stat(name, dir_fd=dir_fd, follow_symlinks=False),
    )


def _opened_directory(
    path: object, opener: Callable[[], int], lstat: Callable[[], os.stat_result]
) -> int:
    try:
        return opener()
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            link = stat.S_ISLNK(lstat().st_mode)
        except OSError:
            link = False
        raise SymlinkRefusedError(path, "a symbolic link" if link else "no directory") from None


def kind(dir_fd: int, name: str) -> str | None:
    """What `name` in `dir_fd` is without following it: "file", "directory", "symlink",
    "other", or None when there is nothing of that name."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    return "directory" if stat.S_ISDIR(mode) else "other"


def read_file(dir_fd: int, name: str, max_bytes: int | None = None) -> bytes:
    """The bytes of regular file `name` in `dir_fd` (at most `max_bytes + 1` are read, so a
    caller sees one too long); SymlinkRefusedError for a link, OSError for anything else that
    is no regular file."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise SymlinkRefusedError(name) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{name} is no regular file")
        return handle.read() if max_bytes is None else handle.read(max_bytes + 1)


def write_file_atomic(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write `name` in `dir_fd` whole or not at all: a new temporary file (never an existing
    one, never through a link), then renamed over `name` (a link of that name is replaced, its
    target untouched)."""
    temporary = f".{name}.{uuid.uuid4().hex[:12]}.partial"
    fd = os.open(temporary, _NEW_FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def unlink(dir_fd: int, name: str) -> None:
    """Remove `name` from `dir_fd` if it is there (a link is removed, never its target)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def open_file(path: Path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """os.open of `path` refusing a symbolic link as its last component (SymlinkRefusedError)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise SymlinkRefusedError(path) from None
        raise


def check_directory(path: Path, *, create: bool = True) -> None:
    """Raise SymlinkRefusedError unless `path` is a directory (made when `create`) that is no
    symbolic link."""
    os.close(open_directory(path, create=create))


def regular_or_absent(path: Path) -> bool:
    """Whether `path` is a regular file or nothing (not a link, a directory or a device)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    return stat.S_ISREG(mode)
