"""The kernel log as text: ``/dev/kmsg`` under ``--root``, else ``journalctl -k``; bounded.

``/dev/kmsg`` (Documentation/ABI/testing/dev-kmsg) is read non-blocking from the start of the ring
buffer: each ``read()`` returns one record, ``EAGAIN`` means "no more now" (we stop there instead
of waiting for new ones), ``EPIPE`` means records were overwritten while we read (we go on with the
next one). It needs root or CAP_SYSLOG when ``kernel.dmesg_restrict=1``, and systemd's
``ProtectKernelLogs=yes`` hides it: then ``journalctl -k -b 0`` (the journal's copy of the kernel
log since boot) is tried, with a deadline. Under ``--root`` other than ``/`` journalctl reads
``<root>/var/log/journal``. A regular file at ``<root>/dev/kmsg`` (a test fixture, a saved log)
is read whole.

Pure parsing of what is read: :mod:`preflight.probes.kernlog`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from preflight.core.boundedio import BoundedReadError, file_kind, read_small_text

#: Most bytes read from either source (the default ring buffer is 128 KiB to a few MiB).
MAX_LOG_BYTES = 32 << 20
#: One kmsg record is at most ~8 KiB (CONSOLE_EXT_LOG_MAX); a smaller buffer gives EINVAL.
_RECORD_BYTES = 16384


class KernelLogError(RuntimeError):
    """Neither /dev/kmsg nor journalctl could be read; the message says what each answered."""


@dataclass(frozen=True)
class KernelLog:
    """What was read.

    Attributes:
        source: ``/dev/kmsg`` path or ``journalctl -k``.
        form: ``kmsg`` or ``journal`` (which parser applies).
        text: the log text.
        truncated: stopped at the size bound or the deadline before the end.
        tried: why earlier sources were not used (``/dev/kmsg: Permission denied``).
    """

    source: str
    form: str
    text: str
    truncated: bool = False
    tried: tuple[str, ...] = ()


def read_kmsg(path: Path, *, deadline_s: float, max_bytes: int = MAX_LOG_BYTES) -> tuple[str, bool]:
    """All records now in the ring buffer at ``path`` (or a regular file's text).

    Returns:
        (text, truncated): ``truncated`` when the size bound or the deadline stopped the read.

    Raises:
        OSError: ``path`` cannot be opened (missing, EPERM under dmesg_restrict).
    """
    stop_at = time.monotonic() + deadline_s
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    chunks: list[bytes] = []
    size = 0
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode)):
            raise BoundedReadError(f"is {file_kind(mode)}; expected the kernel's /dev/kmsg "
                                   "device or a saved log file")
        if not stat.S_ISREG(mode):
            # SEEK_SET 0 = the first record still in the buffer (the default, said explicitly).
            with contextlib.suppress(OSError):
                os.lseek(fd, 0, os.SEEK_SET)
        while True:
            if time.monotonic() > stop_at or size >= max_bytes:
                return b"".join(chunks).decode(errors="replace"), True
            try:
                data = os.read(fd, _RECORD_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                raise
            if not data:
                break
            chunks.append(data)
            size += len(data)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace"), False


def journal_argv(root: Path, journalctl: str = "journalctl") -> list[str]:
    """``journalctl`` reading the kernel messages of the current boot, one short-monotonic line
    each (the time since boot in brackets, as /dev/kmsg gives it)."""
    argv = [journalctl, "-k", "-b", "0", "-o", "short-monotonic", "--no-pager", "-q"]
    if root != Path("/"):
        argv += ["-D", str(root / "var" / "log" / "journal")]
    return argv


def read_journal(root: Path, *, deadline_s: float, max_bytes: int = MAX_LOG_BYTES,
                 journalctl: str = "journalctl") -> str:
    """The kernel log from the journal; raises OSError / subprocess errors with the reason."""
    argv = journal_argv(root, journalctl)
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=deadline_s, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{' '.join(argv)} did not answer within {deadline_s:g} s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(f"{' '.join(argv[:4])} exited {proc.returncode}"
                      f"{': ' + err[-1] if err else ''}")
    if not proc.stdout.strip():
        # A boot always logs kernel messages ("Linux version ..."); none means journald keeps no
        # kernel log here (no journal, or ForwardToKernel-only setups), not a clean log.
        raise OSError(f"{' '.join(argv[:4])} returned no kernel message for this boot")
    return proc.stdout[-max_bytes:].decode(errors="replace")


def read_kernel_log(root: Path, *, deadline_s: float = 5.0, max_bytes: int = MAX_LOG_BYTES,
                    journalctl: str = "journalctl") -> KernelLog:
    """The kernel log since boot (as far back as the ring buffer or journal holds it).

    ``journalctl`` is the program asked when /dev/kmsg cannot be read (looked up in PATH unless
    it is a path).

    Raises:
        KernelLogError: neither source answered; the message names both failures.
    """
    kmsg = root / "dev" / "kmsg"
    started = time.monotonic()
    tried: list[str] = []
    try:
        text, truncated = read_kmsg(kmsg, deadline_s=deadline_s, max_bytes=max_bytes)
        return KernelLog(str(kmsg), "kmsg", text, truncated)
    except OSError as exc:
        tried.append(f"{kmsg}: {exc.strerror or exc}")
    left = max(0.5, deadline_s - (time.monotonic() - started))
    try:
        text = read_journal(root, deadline_s=left, max_bytes=max_bytes, journalctl=journalctl)
        return KernelLog("journalctl -k", "journal", text, False, tuple(tried))
    except (OSError, TimeoutError) as exc:
        what = str(exc) if not isinstance(exc, FileNotFoundError) else "journalctl not installed"
        tried.append(f"journalctl -k: {what}")
    raise KernelLogError("; ".join(tried))


def uptime_s(root: Path) -> float | None:
    """Seconds since boot from ``<root>/proc/uptime``; None when unreadable."""
    try:
        return float(read_small_text(root / "proc" / "uptime").split()[0])
    except (OSError, ValueError, IndexError):
        return None


__all__ = ["KernelLog", "KernelLogError", "journal_argv", "read_journal", "read_kernel_log",
           "read_kmsg", "uptime_s"]
