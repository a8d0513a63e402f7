"""What preflight remembers between runs, in small JSON files under ``state_dir``.

The Slurm hooks need a memory: ``--resume`` counts consecutive passing runs, ``preflight xid
--ack`` records since when an Xid is acknowledged. Each fact is one JSON object in one file of
``state_dir`` (config key; ``PREFLIGHT_STATE_DIR``; default ``/var/lib/preflight``).

Two runs may overlap (a prolog and the HealthCheckProgram on the same node, two prologs of two
jobs): every read-modify-write holds an exclusive ``flock`` on ``<name>.lock`` (bounded: a lock
not obtained in time is a :class:`StateError`, never a hang), and every write goes to a temporary
file in the same directory, is flushed to disk and renamed over the old one, so a reader without
the lock sees the old object or the new one, never half of one. The directory must belong to this
user or root and be writable by nobody else: the hooks run as root, and a state file someone else
could plant would decide whether a node is resumed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from preflight.core.atomicio import replace_file
from preflight.core.boundedio import read_bounded

#: Largest state file read (a real one is a few hundred bytes).
MAX_STATE_BYTES = 256 << 10
#: How long an update waits for another run's lock, seconds.
LOCK_TIMEOUT_S = 2.0
_LOCK_POLL_S = 0.01


class StateError(OSError):
    """The state cannot be read or written (the message says why); the caller decides what a
    missing memory means (no resume, no acknowledgement)."""


def check_dir(directory: Path, *, create: bool) -> Path:
    """``directory`` when it is a real directory of this user (or root) that nobody else can
    write; created (mode 0755) when ``create`` and missing.

    Raises:
        StateError: missing (and not created), not a directory, a symlink, owned by another
            user, or group/world-writable.
    """
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if not create:
            raise StateError(f"state_dir {directory} does not exist") from None
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            st = os.lstat(directory)
        except OSError as exc:
            raise StateError(f"cannot create state_dir {directory}: "
                             f"{exc.strerror or exc}") from None
    except OSError as exc:
        raise StateError(f"state_dir {directory}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StateError(f"state_dir {directory} is not a directory (a symlink is refused)")
    if st.st_uid not in (os.geteuid(), 0):
        raise StateError(f"state_dir {directory} belongs to uid {st.st_uid}, neither this user "
                         f"(uid {os.geteuid()}) nor root: refusing state another user could "
                         "write")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateError(f"state_dir {directory} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); chmod 755 it")
    return directory


class StateFile:
    """One JSON object in ``<directory>/<name>.json``.

    Args:
        directory: ``state_dir``.
        name: the file's name without ``.json`` (``health``, ``xid-acks``).
    """

    def __init__(self, directory: str | Path, name: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / f"{name}.json"
        self._lock_path = self.directory / f"{name}.lock"

    def read(self) -> dict[str, Any]:
        """The object, ``{}`` when there is none yet.

        Raises:
            StateError: the directory is unsafe, or the file is unreadable, too big or not a
                JSON object (a corrupt file is never taken for an empty one silently).
        """
        check_dir(self.directory, create=False)
        return self._load()

    def _load(self) -> dict[str, Any]:
        try:
            raw = read_bounded(self.path, max_bytes=MAX_STATE_BYTES, timeout_s=1.0)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise StateError(f"{self.path} is not JSON ({exc}); remove it to start "
                             "afresh") from None
        if not isinstance(data, dict):
            raise StateError(f"{self.path} is not a JSON object; remove it to start afresh")
        return data

    @contextlib.contextmanager
    def update(self, *, timeout_s: float = LOCK_TIMEOUT_S,
               reset_corrupt: bool = True) -> Iterator[dict[str, Any]]:
        """Lock, read, let the caller change the object, write it back atomically.

        ``reset_corrupt``: a corrupt file counts as ``{}`` (and is replaced), so one bad write
        does not stop every later run; the caller's fresh object is the conservative start.

        Raises:
            StateError: the directory is unsafe, the lock was not obtained within
                ``timeout_s``, or the write failed (the old file is then left as it was).
        """
        check_dir(self.directory, create=True)
        fd = _open_lock(self._lock_path)
        try:
            _lock(fd, self._lock_path, timeout_s)
            try:
                data = self._load()
            except StateError:
                if not reset_corrupt:
                    raise
                data = {}
            yield data
            self._write(data)
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _write(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        if len(text) > MAX_STATE_BYTES:
            raise StateError(f"{self.path}: {len(text)} bytes of state, more than "
                             f"{MAX_STATE_BYTES}")
        try:
            replace_file(self.path, text)
        except OSError as exc:
            raise StateError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        _fsync_dir(self.directory)


def _open_lock(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StateError(f"cannot open the lock {path}: {exc.strerror or exc}") from None


def _lock(fd: int, path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise StateError(f"cannot lock {path}: {exc.strerror or exc}") from None
        if time.monotonic() >= deadline:
            raise StateError(f"{path} is held by another preflight run for more than "
                             f"{timeout_s:g} s")
        time.sleep(_LOCK_POLL_S)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (a crash right after it keeps the new file)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def boot_id(root: Path = Path("/")) -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id`` under ``root``), None when unknown."""
    try:
        text = read_bounded(root / "proc/sys/kernel/random/boot_id", max_bytes=128,
                            timeout_s=1.0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if 0 < len(text) <= 64 and text.replace("-", "").isalnum() else None


__all__ = ["StateError", "StateFile", "boot_id", "check_dir"]
