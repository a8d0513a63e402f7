"""Run a helper process so that nothing it starts can outlive its deadline.

``subprocess.run(timeout=...)`` kills only the direct child, then waits for its pipes to close: a
wrapper script (``#!/bin/sh`` around the training venv's python, a site's ``scontrol`` shim) whose
own child keeps the pipe open makes that wait endless, and the grandchild keeps running. Here the
child leads its own session and process group, its own exit (not the end of its pipes) says when
it is done, and on the deadline or after its exit the whole group is killed.
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
#: What is kept of stdout and of stderr without ``max_output_bytes`` (the rest is dropped).
MAX_OUTPUT_BYTES = 16 << 20


@dataclass(frozen=True)
class Finished:
    """How the process ended (``returncode`` < 0: killed by that signal) and what it wrote; with
    ``max_output_bytes``, the bytes past the limit were read and dropped (counted here)."""

    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_dropped: int = 0
    stderr_dropped: int = 0


class GroupTimeout(Exception):
    """The process did not finish in time; its whole process group was killed."""

    def __init__(self, argv: Sequence[str], timeout_s: float, pgid: int) -> None:
        super().__init__(f"{argv[0]} did not finish within {timeout_s:g} s; killed its process "
                         f"group {pgid}")
        self.timeout_s = timeout_s
        self.pgid = pgid


def run_in_group(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
                 input_bytes: bytes | None = None,
                 max_output_bytes: int | None = None) -> Finished:
    """Run ``argv`` in a new process group; kill the group on ``timeout_s`` and after it ends.

    ``max_output_bytes`` bounds what is kept of stdout and of stderr (each): the rest is read and
    dropped, so a child that prints without end neither blocks on a full pipe nor fills memory.

    Raises:
        GroupTimeout: the deadline passed (the group is dead when this is raised).
        OSError: the program cannot be started (FileNotFoundError, PermissionError...).
    """
    # Its own session is out of reach of a signal to preflight: a SIGTERM kills the group here,
    # and one that comes while it starts waits until that undo is on record.
    try:
        with aborting.starting():
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if input_bytes is not None
                                    else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE,
                                    env=dict(env) if env is not None else None,
                                    start_new_session=True)
            try:
                undo = aborting.register(lambda: _kill_group(proc.pid))
            except aborting.Aborted:  # the signal came while it started
                _kill_group(proc.pid)
                proc.wait()
                raise
    except aborting.Aborted as exc:
        raise aborting.Aborted(f"not starting {argv[0]}: {exc}") from None
    try:
        if input_bytes is None:
            # Judged by the helper's own exit: a grandchild it left holding the pipes (an
            # scontrol wrapper that backgrounds a logger) is not waited for.
            return _read_bounded(proc, argv, timeout_s, max_output_bytes or MAX_OUTPUT_BYTES)
        out, err = proc.communicate(input_bytes, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=_DRAIN_S)
        if proc.poll() is None:  # pragma: no cover - SIGKILL of our own child
            proc.kill()
            proc.wait()
        raise GroupTimeout(argv, timeout_s, proc.pid) from None
    finally:
        # Whatever the helper left behind in its group (a backgrounded grandchild) goes too.
        _kill_group(proc.pid)
        aborting.unregister(undo)
    return Finished(proc.returncode, out, err)


def _read_bounded(proc: subprocess.Popen[bytes], argv: Sequence[str], timeout_s: float,
                  limit: int) -> Finished:
    """Read both pipes until they close, keeping ``limit`` bytes of each, within ``timeout_s``.

    Once the child itself has ended, what is left of its group is killed, so a backgrounded
    grandchild holding the pipes open cannot stretch the wait."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    deadline = time.monotonic() + timeout_s
    kept = {out: bytearray(), err: bytearray()}
    dropped = dict.fromkeys(kept, 0)
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        ended_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                raise subprocess.TimeoutExpired(list(argv), timeout_s)
            if ended_at is None and proc.poll() is not None:
                ended_at = now
                _kill_group(proc.pid)
            if ended_at is not None and now > ended_at + _DRAIN_S:
                break
            for key, _ in sel.select(timeout=min(deadline - now, 0.25)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = max(0, limit - len(kept[key.fd]))
                kept[key.fd] += chunk[:room]
                dropped[key.fd] += len(chunk) - min(room, len(chunk))
    try:
        returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(list(argv), timeout_s) from None
    return Finished(returncode, bytes(kept[out]), bytes(kept[err]), dropped[out], dropped[err])


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
