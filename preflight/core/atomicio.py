"""Replacing a small file so that a reader at any moment sees the old content or the new, never
half of either: a temporary file in the same directory (same filesystem, so the rename is
atomic), flushed to disk, given its mode, renamed over the target."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring).

    ``path`` itself is not inspected: a caller that must not replace a device, a FIFO or a
    symlink checks first (:mod:`preflight.outputs.textfile` does).

    Raises:
        OSError: the directory does not take a new file or the write failed (the old file is
            then left as it was, and no temporary file is left behind; nor after an interrupt).
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


__all__ = ["replace_file"]
