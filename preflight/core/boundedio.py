"""Reading a file a person named (config, golden, diff inputs) without trusting it.

A path can name ``/dev/zero`` (endless), a FIFO nobody writes (blocks for ever), a directory, or a
multi-gigabyte file. :func:`read_bounded` accepts regular files only, up to a size cap, within a
deadline; the one exception is standard input (``-`` or ``/dev/stdin``), which the daemon uses to
hand its config to the check child: it is read from an already-open pipe, with the same cap and
deadline.
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
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of blocking.
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise BoundedReadError(f"{name}: is {kind}; expected a regular file")
        if st.st_size > max_bytes:
            raise BoundedReadError(f"{name}: {st.st_size} bytes, more than the {max_bytes} bytes "
                                   "a config or fingerprint file may have")
        os.set_blocking(fd, True)
        return _read_fd(fd, name, max_bytes=max_bytes, timeout_s=timeout_s)
    finally:
        os.close(fd)


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
