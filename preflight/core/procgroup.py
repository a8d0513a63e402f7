"""Run a helper process so that nothing it starts can outlive its deadline.

``subprocess.run(timeout=...)`` kills only the direct child, then waits for its pipes to close: a
wrapper script (``#!/bin/sh`` around the training venv's python, a site's ``scontrol`` shim) whose
own child keeps the pipe open makes that wait endless, and the grandchild keeps running. Here the
child leads its own session and process group, its exit (not the end of its pipes) says when it
is done, and on the deadline or after its exit the whole group is killed.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from preflight.core import aborting

#: Seconds to collect what a killed group wrote before giving up on its pipes.
_DRAIN_S = 2.0
#: Seconds to collect what is left in the pipes once the helper itself has exited.
_AFTER_EXIT_S = 0.2
#: How often the helper's exit is looked at while its pipes are quiet.
_POLL_S = 0.02
#: Most bytes kept of each of stdout and stderr (the rest is read and dropped).
MAX_OUTPUT_BYTES = 16 << 20


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes


class GroupTimeout(Exception):
    """The process did not finish in time; its whole process group was killed."""

    def __init__(self, argv: Sequence[str], timeout_s: float, pgid: int) -> None:
        super().__init__(f"{argv[0]} did not finish within {timeout_s:g} s; killed its process "
                         f"group {pgid}")
        self.timeout_s = timeout_s
        self.pgid = pgid


def run_in_group(argv: Sequence[str], *, timeout_s: float,
                 env: Mapping[str, str] | None = None) -> Finished:
    """Run ``argv`` in a new process group; kill the group on ``timeout_s`` and after it ends.

    The helper is judged by its own exit: once it has exited, what its pipes already hold is
    collected (for at most :data:`_AFTER_EXIT_S`) and a backgrounded grandchild that keeps a pipe
    open is not waited for (an ``scontrol`` wrapper that starts a logger in the background).

    Raises:
        GroupTimeout: the deadline passed (the group is dead when this is raised).
        OSError: the program cannot be started (FileNotFoundError, PermissionError...).
    """
    if aborting.aborted():
        raise aborting.Aborted(f"not starting {argv[0]}: preflight is being stopped by a signal")
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(env) if env is not None else None,
                            start_new_session=True)
    # Its own session is out of reach of a signal to preflight: a SIGTERM kills the group here.
    try:
        undo = aborting.register(lambda: _kill_group(proc.pid))
    except aborting.Aborted:
        _kill_group(proc.pid)
        proc.wait()
        raise
    pipes = _Pipes(proc)
    try:
        if not pipes.until_exit(time.monotonic() + timeout_s):
            _kill_group(proc.pid)
            pipes.drain(_DRAIN_S)
            if proc.poll() is None:  # pragma: no cover - SIGKILL of our own child
                proc.kill()
            proc.wait()
            raise GroupTimeout(argv, timeout_s, proc.pid)
        pipes.drain(_AFTER_EXIT_S)
    finally:
        # Whatever the helper left behind in its group (a backgrounded grandchild) goes too.
        _kill_group(proc.pid)
        pipes.close()
        aborting.unregister(undo)
    return Finished(proc.wait(), bytes(pipes.out), bytes(pipes.err))


class _Pipes:
    """The child's stdout and stderr, read as they come (so it never blocks on a full pipe),
    each kept up to :data:`MAX_OUTPUT_BYTES`."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self.out = bytearray()
        self.err = bytearray()
        self._bufs = {proc.stdout.fileno(): self.out, proc.stderr.fileno(): self.err}
        self._sel = selectors.DefaultSelector()
        for fd in self._bufs:
            self._sel.register(fd, selectors.EVENT_READ)

    def _pump(self, wait_s: float) -> None:
        for key, _ in self._sel.select(max(0.0, wait_s)):
            fd = int(key.fd)
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                self._sel.unregister(fd)
                continue
            buf = self._bufs[fd]
            buf += data[:max(0, MAX_OUTPUT_BYTES - len(buf))]

    def until_exit(self, deadline: float) -> bool:
        """Read until the child exits (True) or ``deadline`` passes (False)."""
        while self._proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._sel.get_map():
                self._pump(min(left, _POLL_S))
            else:  # both pipes closed: only the exit is left to wait for
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=min(left, _POLL_S))
        return True

    def drain(self, limit_s: float) -> None:
        """What the pipes still hold, until both reach end of file or ``limit_s`` passes."""
        end = time.monotonic() + limit_s
        while self._sel.get_map() and time.monotonic() < end:
            self._pump(end - time.monotonic())

    def close(self) -> None:
        self._sel.close()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


class HelperFailed(RuntimeError):
    """A helper run by :func:`run_checked` could not be started, did not finish in time, or
    exited non-zero; the message says which, in one line."""


def run_checked(argv: Sequence[str], *, timeout_s: float) -> Finished:
    """:func:`run_in_group`, with every way it can go wrong as one :class:`HelperFailed` line:
    ``X did not answer within T s (its process group was killed)``, ``cannot run X: reason``,
    ``X ARG exit N: <its last line of stderr>``."""
    name = os.path.basename(argv[0])
    try:
        proc = run_in_group(argv, timeout_s=timeout_s)
    except GroupTimeout:
        raise HelperFailed(f"{argv[0]} did not answer within {timeout_s:.3g} s (its process "
                           "group was killed)") from None
    except OSError as exc:
        raise HelperFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        what = f"{name} {argv[1]}" if len(argv) > 1 else name
        raise HelperFailed(f"{what} exit {proc.returncode}{': ' + said[-1][:300] if said else ''}")
    return proc


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


__all__ = ["Finished", "GroupTimeout", "HelperFailed", "run_checked", "run_in_group"]
