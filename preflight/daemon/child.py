"""Check runs in a child process group with a deadline (``python -m preflight check --json``).

When the deadline passes the child's whole process group is killed and every check of that run is
reported as ERROR (``RunTimeout``): a hung driver call or a crashing check never takes the daemon
down. The daemon itself never imports torch (the bandwidth workers do, in their own processes).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import yaml

from preflight.checks import GPU_LOAD_CHECKS
from preflight.core.config import Config, as_data
from preflight.core.result import Report, Result, Status
from preflight.daemon.systemd import NOTIFY_VARS

#: JSON); checks run concurrently, so the run as a whole needs one check deadline plus this.
CHILD_GRACE_S = 20.0
#: Niceness of the check process (background work on a node that trains).
CHILD_NICE = 10
#: Bytes of a failed child's stderr quoted in the ERROR message.
STDERR_TAIL_BYTES = 600


class RunKind(enum.Enum):
    """What a run checks: the node checks, or the bandwidth test alone."""

    NODE = "node"
    BANDWIDTH = "bandwidth"



class Runner(Protocol):
    """Runs one kind of run and returns its Report; must return within its own deadline."""

    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report: ...

    def kill(self) -> None:
        """Stop a run in progress now (daemon shutdown)."""


ArgvFor = Callable[[RunKind, Config], Sequence[str]]




def run_deadline_s(kind: RunKind, config: Config, grace_s: float = CHILD_GRACE_S) -> float:
    """How long a run of ``kind`` may take before its process group is killed."""
    own = (config.bench_timeout_s + config.gpu_speed_timeout_s if kind is RunKind.BANDWIDTH
           else config.check_timeout_s)
    return own + grace_s


def config_text(config: Config) -> str:
    """``config`` as YAML, the form the child reads from its standard input."""
    return yaml.safe_dump(as_data(config), sort_keys=True)


def failed_report(expected: Sequence[str], *, reason: str, message: str, remedy: str,
                  details: Mapping[str, Any], duration_s: float) -> Report:
    """A Report that says "could not tell" (ERROR) for every check the run should have judged."""
    from preflight import __version__

    return Report(results=tuple(
        Result(name, Status.ERROR, reason, message, remedy, dict(details), duration_s)
        for name in expected), version=__version__, mode="serve")


class ChildRunner:
    """Runs ``preflight check --json`` in a child process group with a deadline.

    Args:
        root: passed to the child as ``--root``.
        argv_for: the child's argv per run kind; tests point it at a small script (a check that
            hangs or raises). Production uses :meth:`default_argv`, which runs only our checks.
        env: the child's environment (default: ours without systemd's notify variables).
        grace_s: how much longer than its checks' deadline a run may take.
    """

    def __init__(self, *, root: str = "/", argv_for: ArgvFor | None = None,
                 env: Mapping[str, str] | None = None, grace_s: float = CHILD_GRACE_S) -> None:
        self.root = root
        self.grace_s = grace_s
        self.argv_for: ArgvFor = argv_for or self.default_argv
        base = dict(os.environ if env is None else env)
        self.env = {k: v for k, v in base.items() if k not in NOTIFY_VARS}
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def default_argv(self, kind: RunKind, config: Config) -> list[str]:
        # The config travels on stdin so that the child judges with exactly the daemon's config,
        # even after a SIGHUP that kept the old one because the file on disk turned invalid.
        argv = [sys.executable, "-m", "preflight", "check", "--json", "--config", "/dev/stdin",
                "--root", self.root]
        if kind is RunKind.BANDWIDTH:
            return [*argv, "--only", ",".join(GPU_LOAD_CHECKS)]
        return [*argv, "--no-bandwidth"]

    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report:
        argv = list(self.argv_for(kind, config))
        deadline = run_deadline_s(kind, config, self.grace_s)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=self.env,
                                    start_new_session=True)
        except OSError as exc:
            return failed_report(expected, reason="RunFailed",
                                 message=f"cannot start the check process {argv[0]}: {exc}",
                                 remedy="Reinstall preflight; the daemon's interpreter must be "
                                        "able to run `python -m preflight check`.",
                                 details={"argv": argv}, duration_s=0.0)
        # The node checks are background work on a training node: at nice CHILD_NICE they yield
        # the CPU to the job's data loaders and to this daemon's own scrapes. (The bandwidth test
        # runs only when no job uses the GPUs; its workers inherit the same niceness.)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, CHILD_NICE)
        with self._lock:
            self._proc = proc
        try:
            try:
                out, err = proc.communicate(config_text(config).encode(), timeout=deadline)
            except subprocess.TimeoutExpired:
                self._kill_group(proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=5.0)
                return failed_report(
                    expected, reason="RunTimeout",
                    message=f"the {kind.value} check run did not finish within its "
                            f"{deadline:g} s deadline; the daemon killed it (process group "
                            f"{proc.pid})",
                    remedy="Something on this node does not answer (a hung GPU or driver shows "
                           "in dmesg as Xid errors); run `preflight check --log-level debug` by "
                           "hand to see which check waits.",
                    details={"deadline_s": deadline}, duration_s=time.monotonic() - started)
        finally:
            # Bandwidth workers live in the child's group; none may outlive a run.
            self._kill_group(proc)
            with self._lock:
                self._proc = None
        return self._parse(kind, proc.returncode, out, err, expected=expected,
                           duration_s=time.monotonic() - started)

    @staticmethod
    def _parse(kind: RunKind, returncode: int, out: bytes, err: bytes, *,
               expected: Sequence[str], duration_s: float) -> Report:
        tail = err[-STDERR_TAIL_BYTES:].decode(errors="replace").strip()
        try:
            return Report.from_json(json.loads(out))
        except (ValueError, KeyError, TypeError) as exc:
            why = f"exit code {returncode}" if returncode >= 0 else f"signal {-returncode}"
            return failed_report(
                expected, reason="RunFailed",
                message=f"the {kind.value} check run ended with {why} and no valid JSON report "
                        f"({type(exc).__name__}: {exc}); stderr: {tail or '(empty)'}",
                remedy="Run `preflight check --json --log-level debug` by hand on this node "
                       "and report the output.",
                details={"returncode": returncode}, duration_s=duration_s)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None:
            self._kill_group(proc)
