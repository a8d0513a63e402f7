"""Reading a file without trusting it: what a person named (config, golden, diff inputs) and
every file read under ``--root`` (sysfs, procfs, a fixture tree standing in for them).

A path can name ``/dev/zero`` (endless), a FIFO nobody writes (blocks for ever), a directory, or a
multi-gigabyte file. :func:`read_bounded` accepts regular files only, up to a size cap, within a
deadline; the one exception is standard input (``-`` or ``/dev/stdin``), which the daemon uses to
hand its config to the check child: it is read from an already-open pipe, with the same cap and
deadline. :func:`read_small` is the reader for the small files of a ``--root`` tree (a sysfs
attribute, ``/proc/PID/cgroup``): regular files only, opened without blocking, at most
``max_bytes`` (refused beyond, or cut there when the caller only needs the head, as of
``/proc/PID/maps``); sysfs and procfs files are regular files, so a FIFO or a device where one is
expected is refused, never read.
"""

from __future__ import annotations

import os
import select
import stat
import time

#: Largest config / fingerprint file read, bytes (a real one is a few KiB).
MAX_FILE_BYTES = 4 << 20
#: Deadline for reading one such file, seconds.
READ_TIMEOUT_S = 5.0
_STDIN_NAMES = ("-", "/dev/stdin", "/proc/self/fd/0", "/dev/fd/0")


class BoundedReadError(OSError):
    """The file is not a regular file, too large, or did not arrive within the deadline."""


def read_bounded(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES,
                 timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The bytes of ``path``, a regular file (or standard input) of at most ``max_bytes``.

    Raises:
        BoundedReadError: not a regular file, larger than ``max_bytes``, or not read within
            ``timeout_s`` (the message says which, with the numbers).
        OSError: the file cannot be opened (missing, permission...).
    """
    name = os.fspath(path)
    if name in _STDIN_NAMES:
        return _read_fd(0, name, max_bytes=max_bytes, timeout_s=timeout_s)
    fd = _open_regular(name)
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise BoundedReadError(f"{name}: {st.st_size} bytes, more than the {max_bytes} bytes "
                                   "a config or fingerprint file may have")
        os.set_blocking(fd, True)
        return _read_fd(fd, name, max_bytes=max_bytes, timeout_s=timeout_s)
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` names, for messages: ``a directory``, ``a FIFO``, ``a device``..."""
    return ("a regular file" if stat.S_ISREG(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else
            "a symlink" if stat.S_ISLNK(mode) else "not a regular file")


def _open_regular(name: str) -> int:
    """An fd of ``name`` when it is a regular file; BoundedReadError naming what it is otherwise.
    O_NONBLOCK: opening a FIFO with no writer returns at once instead of blocking (and a device
    is never read: the fd is closed before any read)."""
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BoundedReadError(f"{name}: is {file_kind(mode)}; expected a regular file")
    return fd


#: Largest sysfs / procfs attribute read under --root (they are one page; a few lists are more).
SMALL_FILE_BYTES = 64 << 10


def read_small(path: str | os.PathLike[str], *, max_bytes: int = SMALL_FILE_BYTES,
               cut: bool = False) -> bytes:
    """The bytes of ``path``, a regular file, read at most ``max_bytes`` (one read more to tell).

    Args:
        cut: return the first ``max_bytes`` of a larger file instead of refusing it.

    Raises:
        BoundedReadError: not a regular file (FIFO, device, directory), or larger than
            ``max_bytes`` without ``cut``.
        OSError: the file cannot be opened or read.
    """
    name = os.fspath(path)
    fd = _open_regular(name)
    try:
        if not cut and os.fstat(fd).st_size > max_bytes:  # a 3 GB file is refused unread
            raise BoundedReadError(f"{name}: {os.fstat(fd).st_size} bytes, more than the "
                                   f"{max_bytes} bytes such a file has")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        if not cut:
            raise BoundedReadError(f"{name}: more than the {max_bytes} bytes such a file has")
        data = data[:max_bytes]
    return data


def read_small_text(path: str | os.PathLike[str], *, max_bytes: int = SMALL_FILE_BYTES) -> str:
    """:func:`read_small` decoded as UTF-8 (undecodable bytes replaced), stripped."""
    return read_small(path, max_bytes=max_bytes).decode(errors="replace").strip()


def _read_fd(fd: int, name: str, *, max_bytes: int, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    total = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, int(left * 1000))):
            raise BoundedReadError(f"{name}: no end of file within {timeout_s:g} s "
                                   f"({total} bytes read); expected a file, not a stream")
        chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise BoundedReadError(f"{name}: more than the {max_bytes} bytes a config or "
                                   "fingerprint file may have")
