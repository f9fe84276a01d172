"""Files and directories of the agent's own (the journal, the phrase cache, optimized models,
the update slots) opened without following symbolic links, and only when they are regular files
of a sane size.

Whoever can write in a directory the agent owns could plant a symbolic link there, so that the
agent, with its rights, reads, overwrites or deletes a file elsewhere (another program's state,
a device). So each directory the agent keeps files in is opened with O_NOFOLLOW (a link is
refused, with an error that says so), and the files in it are reached through that open
directory (`dir_fd`), each with O_NOFOLLOW. The parents of a configured directory are the
operator's, and followed.

They could as well plant a FIFO (whose plain open blocks until a writer comes: a start that
never ends), a directory, a device or a sparse file of terabytes. So every file is opened with
O_NONBLOCK (a FIFO opens at once), checked to be a regular file by `fstat` on the descriptor
(not on the name, which could be swapped in between) and, where the caller gives a bound, no
larger than it, before a byte is read. Each refusal is a `FileRefusedError` (an OSError) that
says what was found in the file's place. The operator's own files named in the config (the
config itself, chime and media files) may be links, but are read the same way
(`read_regular`).

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
_SAFE_FLAGS: Final = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRefusedError(OSError):
    """Something that is no regular file (or no directory, or too large) where the agent keeps
    one of its own: refused, never followed, read or written. `found` says what it is."""

    def __init__(self, path: object, found: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, f"{path} is {found}: refused, not followed")
        self.found = found


class SymlinkRefusedError(FileRefusedError):
    """A path the agent keeps files under is a symbolic link (or no directory): refused."""

    def __init__(self, path: object, what: str = "a symbolic link") -> None:
        super().__init__(path, what, errno.ELOOP)


def describe(mode: int) -> str:
    """What a file of this `st_mode` is, for a refusal ("a FIFO", "a directory", ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "no regular file"


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


def open_inner_directory(path: Path, *, create: bool = True) -> int:
    """An open descriptor of `path`, a directory inside one of the agent's own (the cache
    root's `phrases`, `sounder`): neither it nor its parent may be a symbolic link
    (SymlinkRefusedError), so nothing is made or read through a link planted as either; the
    parent's own parents are the operator's, and followed."""
    root = open_directory(path.parent, create=create)
    try:
        return open_subdirectory(root, path.name, create=create)
    finally:
        os.close(root)


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


def entries(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    """The names in a directory with what lstat says of each (links not followed)."""
    seen = []
    for name in os.listdir(dir_fd):
        with contextlib.suppress(FileNotFoundError):
            seen.append((name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)))
    return seen


def remove(dir_fd: int, name: str) -> None:
    """Remove the entry `name` of the directory `dir_fd`, whatever it is: a link (never what
    it points to), a file, a FIFO, a device node, or a directory with what it holds (each level
    opened without following a link); gone already is fine."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        inner = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            for entry in os.listdir(inner):
                remove(inner, entry)
        finally:
            os.close(inner)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=dir_fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


def read_file(dir_fd: int, name: str, max_bytes: int | None = None) -> bytes:
    """The bytes of regular file `name` in `dir_fd`. With `max_bytes`, one larger than that is
    refused by its size before a byte is read (FileRefusedError), and at most `max_bytes + 1`
    bytes are read (a file that grew meanwhile is seen too long). FileRefusedError for a link,
    a FIFO, a directory, a device; FileNotFoundError when there is nothing."""
    fd = open_regular(dir_fd, name, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as handle:
        return handle.read() if max_bytes is None else handle.read(max_bytes + 1)


def open_regular(
    dir_fd: int | None,
    name: str | Path,
    flags: int = os.O_RDONLY,
    mode: int = 0o600,
    *,
    max_bytes: int | None = None,
    follow: bool = False,
) -> int:
    """A descriptor of the regular file `name` (in `dir_fd`, or a path when None), opened
    with O_NONBLOCK (a FIFO never blocks the open) and checked by `fstat`: FileRefusedError
    when it is a link (unless `follow`), a FIFO, a directory, a device or a socket, or over
    `max_bytes`; other OSErrors (FileNotFoundError) as they come."""
    safe = (_SAFE_FLAGS & ~os.O_NOFOLLOW) if follow else _SAFE_FLAGS
    try:
        fd = os.open(name, flags | safe, mode, dir_fd=dir_fd)
    except OSError as err:
        raise _refusal(err, dir_fd, name) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefusedError(name, describe(info.st_mode))
        if max_bytes is not None and info.st_size > max_bytes:
            raise FileRefusedError(name, f"{info.st_size} bytes, over {max_bytes}", errno.EFBIG)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(err: OSError, dir_fd: int | None, name: str | Path) -> OSError:
    """The error to raise for a failed open: a refusal naming what is there when the open
    failed because of what it is (a link, a FIFO without a reader, a directory opened to
    write), the error itself otherwise."""
    if err.errno == errno.ELOOP:
        return SymlinkRefusedError(name)
    if err.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.ETXTBSY):
        try:
            found = describe(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            found = "no regular file"
        return FileRefusedError(name, found)
    return err


def read_regular(path: Path, max_bytes: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path` (the operator's: a link is followed unless
    `follow` is False), refused by its size beyond `max_bytes` before a byte is read, at most
    `max_bytes + 1` read; FileRefusedError for a FIFO, a directory or a device in its place."""
    fd = open_regular(None, path, max_bytes=max_bytes, follow=follow)
    with os.fdopen(fd, "rb") as handle:
        return handle.read(max_bytes + 1)


def write_file_atomic(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write `name` in `dir_fd` whole or not at all: a new temporary file (never an existing
    one, never through a link), then renamed over `name` (a link of that name is replaced, its
    target untouched; a directory, which a rename cannot replace, is removed first with what it
    holds)."""
    temporary = f".{name}.{uuid.uuid4().hex[:12]}.partial"
    fd = os.open(temporary, _NEW_FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if kind(dir_fd, name) == "directory":  # planted where a file goes
            remove(dir_fd, name)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def unlink(dir_fd: int, name: str) -> None:
    """Remove `name` from `dir_fd` if it is there, whatever it is (a link is removed, never its
    target; a directory planted where a file goes, with what it holds: `remove`)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        remove(dir_fd, name)


def open_file(path: Path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """os.open of the regular file `path` refusing a symbolic link as its last component, or
    anything else that is no regular file (FileRefusedError; a FIFO never blocks the open)."""
    return open_regular(None, path, flags, mode)


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
