"""Run a helper process so that nothing it starts can outlive its deadline.

``subprocess.run(timeout=...)`` kills only the direct child, then waits for its pipes to close: a
wrapper script (``#!/bin/sh`` around the training venv's python, a site's ``scontrol`` shim) whose
own child keeps the pipe open makes that wait endless, and the grandchild keeps running. Here the
child leads its own session and process group, and on the deadline the whole group is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from preflight.core import aborting

#: Seconds to collect what a killed group wrote before giving up on its pipes.
_DRAIN_S = 2.0


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


def run_in_group(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
                 input_bytes: bytes | None = None) -> Finished:
    """Run ``argv`` in a new process group; kill the group on ``timeout_s`` and after it ends.

    Raises:
        GroupTimeout: the deadline passed (the group is dead when this is raised).
        OSError: the program cannot be started (FileNotFoundError, PermissionError...).
    """
    if aborting.aborted():
        raise aborting.Aborted(f"not starting {argv[0]}: preflight is being stopped by a signal")
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if input_bytes is not None
                            else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(env) if env is not None else None,
                            start_new_session=True)
    # Its own session is out of reach of a signal to preflight: a SIGTERM kills the group here.
    try:
        undo = aborting.register(lambda: _kill_group(proc.pid))
    except aborting.Aborted:
        _kill_group(proc.pid)
        proc.wait()
        raise
    try:
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


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


__all__ = ["Finished", "GroupTimeout", "run_in_group"]
