"""Owned, atomic outputs: the one place that writes a result file or takes a writer lock.

- `atomic_write` / `atomic_path`: write beside the target, `fsync`, then `os.replace`, so a
  reader (or a kill mid-write) sees the old file or the new one, never a torn one.
- `output_lock`: an exclusive `flock` on `<target>.lock` (released by the OS when the process
  dies), so two writers of one output fail at once instead of interleaving.
- `check_output`: refuse special files (`/dev/null`, `/dev/full`, fifos), folders and empty
  names before any work starts; `same_file`: the input and the output are one file (resolved
  paths or the same inode).

Every failure is an `OutputError` with one line naming the path and what went wrong (a full
disk is "no space left on device"), never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from pathlib import Path


class OutputError(ValueError):
    """An output that cannot be owned or written (one line naming the path)."""


def describe(err: OSError) -> str:
    """An OS error's reason in words (`ENOSPC` -> "no space left on device")."""
    if err.errno == errno.ENOSPC:
        return "no space left on device"
    if err.errno == errno.EDQUOT:
        return "disk quota exceeded"
    return (err.strerror or str(err)).lower()


def check_output(path: str | os.PathLike, what: str = "output") -> Path:
    """The output path, refused when it is empty, a folder, or not a regular file (a device such
    as `/dev/null` or `/dev/full`, a fifo, a socket): results written there are lost.

    Raises:
        OutputError: naming the path and the reason.
    """
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputError(f"the {what} path is empty; give a file name")
    target = Path(text).expanduser()
    try:
        info = target.stat()
    except FileNotFoundError:
        return target
    except OSError as err:
        raise OutputError(f"cannot use {text!r} as the {what}: {describe(err)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise OutputError(f"the {what} {text!r} is a directory; give a file path")
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"the {what} {text!r} is not a regular file (a device, fifo or socket "
                          f"would lose the results); give a file path")
    return target


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """An output folder's path, refused when empty (`''` would mean the current directory) or
    when it exists and is not a folder."""
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputError(f"the {what} is empty; give a folder name")
    folder = Path(text).expanduser()
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"the {what} {text!r} exists and is not a directory")
    return folder


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same resolved path, or (both existing) the same inode
    (hard links, bind mounts)."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.resolve() == pb.resolve():
        return True
    try:
        return os.path.samefile(pa, pb)
    except OSError:
        return False


def check_not_input(path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None],
                    what: str = "output") -> None:
    """Refuse an output that is one of the run's inputs or lies inside one (a model or adapter
    folder, an input file): writing it would destroy what the run reads.

    Raises:
        OutputError: naming the output and the input.
    """
    target = Path(path).expanduser().resolve()
    for item in inputs:
        if item is None:
            continue
        source = Path(item).expanduser().resolve()
        if target == source or source in target.parents or same_file(path, item):
            raise OutputError(f"the {what} {os.fspath(path)!r} is inside this run's input {os.fspath(item)!r} "
                              f"(writing it would overwrite what the run reads); write it elsewhere")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "output") -> Iterator[Path]:
    """Yields a temporary path beside `path`; a writer fills it (e.g. `safetensors.save_file`,
    `torch.save`), and on a clean exit it is fsynced and renamed onto `path`. On an error the
    temporary file is removed and `path` is untouched.

    Raises:
        OutputError: `path` is not a regular file, or the write failed (full disk, no permission).
    """
    target = check_output(path, what)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as err:
        raise OutputError(f"cannot write the {what} {os.fspath(path)!r}: {describe(err)}") from None
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        if target.exists():
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as err:
        raise OutputError(f"cannot write the {what} {os.fspath(path)!r}: {describe(err)}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: str | bytes, what: str = "output") -> Path:
    """Write `data` (text as UTF-8) to `path` atomically (see `atomic_path`). Returns the path."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, what) as tmp:
        try:
            tmp.write_bytes(payload)
        except OSError as err:
            raise OutputError(f"cannot write the {what} {os.fspath(path)!r}: {describe(err)}") from None
    return Path(path).expanduser()


def write_with(path: str | os.PathLike, writer: Callable[[str], object], what: str = "output") -> Path:
    """`writer(temporary path)` then rename onto `path` (libraries that take a file name)."""
    with atomic_path(path, what) as tmp:
        try:
            writer(str(tmp))
        except OSError as err:
            raise OutputError(f"cannot write the {what} {os.fspath(path)!r}: {describe(err)}") from None
        except Exception as err:
            code = os_error_code(err)            # a library's own error around the OS's (safetensors)
            if code is None:
                raise
            raise OutputError(f"cannot write the {what} {os.fspath(path)!r}: "
                              f"{describe(OSError(code, os.strerror(code)))}") from None
    return Path(path).expanduser()


def os_error_code(err: BaseException) -> int | None:
    """The OS error number a library's exception carries in its text (`(os error 28)`, Rust's
    `Os { code: 28, ... }`), or None."""
    import re

    found = re.search(r"os error (\d+)|Os \{ code: (\d+)", str(err))
    return int(found.group(1) or found.group(2)) if found else None


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of an output file (`<name>.lock` beside it) or folder (`<folder>/.lock`)."""
    target = Path(path).expanduser()
    return target / ".lock" if target.is_dir() else target.with_name(target.name + ".lock")


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, what: str = "output", lock: str | os.PathLike | None = None,
                hint: str = "wait for it to finish or choose another output",
                holder: str = "process") -> Iterator[None]:
    """Hold an exclusive writer lock on `path` (its `lock_path`, or `lock`) while the body runs.

    The lock is an `flock`, so the OS releases it when the process dies: a killed run never
    leaves a stale lock. The lock file holds the holder's pid, for the error message.

    Raises:
        OutputError: another process holds the lock (names its pid), or the lock file cannot be
            created.
    """
    import fcntl

    kind = holder
    where = Path(lock) if lock is not None else lock_path(path)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        handle = _open_lock(where)
    except OSError as err:
        raise OutputError(f"cannot lock the {what} {os.fspath(path)!r}: {describe(err)}") from None
    except OutputError as err:
        raise OutputError(f"cannot lock the {what} {os.fspath(path)!r}: {err}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise OutputError(f"another {kind} (pid {holder}) is writing the {what} "
                              f"{os.fspath(path)!r}; {hint}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


MAX_LOCK_BYTES = 32
"""A lock file this package wrote holds one pid: anything longer is someone else's file."""


def _open_lock(where: Path) -> Any:
    """The lock file, opened read-write without following a symbolic link. An existing one is reused only when it is what a lock writes (a regular file of
    one link holding a pid), so a lock never truncates a file it did not create.

    Raises:
        OutputError: the lock path is a link, a special file, a hard link or another file.
        OSError: the file system refused.
    """
    flags = os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    created = True
    try:
        fd = os.open(where, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        created = False
        try:
            fd = os.open(where, flags | getattr(os, "O_NONBLOCK", 0))
        except OSError as err:
            if err.errno == errno.ELOOP or where.is_symlink():
                raise OutputError(f"the lock file {str(where)!r} is a symbolic link; remove it") from None
            raise
    info = os.fstat(fd)
    if not created:
        content = os.pread(fd, MAX_LOCK_BYTES + 1, 0)
        if (not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or len(content) > MAX_LOCK_BYTES
                or not content.strip().isdigit() and content.strip()):
            os.close(fd)
            raise OutputError(f"{str(where)!r} is not a lock file this tool wrote (a link, a special "
                              f"file or other data); move it away")
    return os.fdopen(fd, "r+", encoding="ascii")


WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EPIPE, errno.EIO}
"""OS errors of writing a result that a command reports in one line (full disk, quota, file too
big, read-only file system, closed pipe, I/O error)."""


@contextlib.contextmanager
def write_errors() -> Iterator[None]:
    """Turn an `OutputError` or a failed write (`WRITE_ERRNOS`) anywhere in a command into click's
    one-line error (exit status 1): a command that could not write its result never exits 0 and
    never ends in a traceback."""
    import click

    try:
        yield
    except OutputError as err:
        raise click.ClickException(str(err)) from None
    except OSError as err:
        if err.errno not in WRITE_ERRNOS:
            raise
        where = f" {err.filename!r}" if getattr(err, "filename", None) else ""
        raise click.ClickException(f"cannot write{where or ' the output'}: {describe(err)}") from None
