"""Check runs in a child process group with a deadline (``python -m preflight check --json``).

When the deadline passes the child's whole process group is killed and every check of that run is
reported as ERROR (``RunTimeout``): a hung driver call or a crashing check never takes the daemon
down. The daemon itself never imports torch (the bandwidth workers do, in their own processes).

The child is trusted no more than any other input:

* Its output is read in bounded amounts: at most :data:`MAX_REPORT_BYTES` of stdout (beyond, the
  run is killed and ``RunFailed`` says why) and the last :data:`STDERR_KEEP_BYTES` of stderr, so a
  child writing gigabytes costs the daemon no memory.
* Reading stops when the child has exited and :data:`DRAIN_S` has passed: a process it left
  behind (a grandchild that called ``setsid``) may hold the pipes open for ever. Whatever still
  holds them is found through ``/proc`` (:mod:`preflight.probes.holders`) and killed, with the
  child's session and process group; the report the child printed still counts.
* Its report is validated (:func:`parse_report`: the schema's types, then a trial rendering as
  ``/metrics`` and ``/report`` would do it) before it replaces the last one: a report whose
  ``fingerprint`` is a string is a failed run, never a broken endpoint.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from preflight.checks import GPU_LOAD_CHECKS
from preflight.core.config import Config, as_data
from preflight.core.result import SCHEMA_VERSION, Report, Result, Scope, Status
from preflight.core.textsafe import escape
from preflight.daemon.systemd import NOTIFY_VARS
from preflight.outputs.prom import DaemonStats, MetricsSnapshot, render
from preflight.probes.holders import (
    FileId,
    Wanted,
    describe_process,
    find_holders,
    session_members,
)

log = logging.getLogger(__name__)

#: JSON); checks run concurrently, so the run as a whole needs one check deadline plus this.
CHILD_GRACE_S = 20.0
#: Niceness of the check process (background work on a node that trains).
CHILD_NICE = 10
#: Bytes of a failed child's stderr quoted in the ERROR message.
STDERR_TAIL_BYTES = 600
#: Most bytes of the child's stdout read: a report is tens of KiB (every Xid and port of a big
#: node stays well under 1 MiB); beyond this the run is killed and failed.
MAX_REPORT_BYTES = 8 << 20
#: Bytes of the child's stderr kept (its tail; the rest is read and dropped).
STDERR_KEEP_BYTES = 64 << 10
#: Seconds the pipes may stay open after the child exited (what it printed is read by then).
DRAIN_S = 2.0
#: Most results a report may carry (the checks number a few dozen with site checks).
MAX_RESULTS = 512
_CHECK_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_REASON = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")


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


class ReportInvalid(ValueError):
    """The child's output is not a report this daemon can serve; the message says what is wrong."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ReportInvalid(what)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _optional_object(data: Mapping[str, Any], key: str) -> None:
    value = data.get(key)
    _need(value is None or isinstance(value, dict), f"{key} is {type(value).__name__}, expected "
          "an object or null")


def parse_report(raw: bytes, *, known_checks: Sequence[str] = ()) -> Report:
    """The Report in a child's stdout, validated as ``/metrics`` and ``/report`` need it.

    Checks the schema's types (``schema_version``, each result's check name, status, scope,
    reason token, texts, ``details`` object, finite ``duration_s``; ``fingerprint`` and
    ``bandwidth`` objects or null, ``fingerprint.packages`` an object), then renders the report
    as both endpoints would: whatever a free-form field holds, what is served afterwards cannot
    fail.

    Raises:
        ReportInvalid: with what is wrong (one line, escaped).
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ReportInvalid(f"not JSON: {escape(str(exc), 200)}") from None
    _need(isinstance(data, dict), f"the report is {type(data).__name__}, expected an object")
    _need(data.get("schema_version") == SCHEMA_VERSION,
          f"schema_version {escape(repr(data.get('schema_version')), 40)}, expected "
          f"{SCHEMA_VERSION}")
    results = data.get("results")
    _need(isinstance(results, list) and len(results) <= MAX_RESULTS,
          f"results is not a list of at most {MAX_RESULTS} results")
    statuses = {s.word for s in Status}
    scopes = {s.value for s in Scope}
    for i, r in enumerate(results):
        _need(isinstance(r, dict), f"results[{i}] is not an object")
        _need(isinstance(r.get("check"), str) and bool(_CHECK_NAME.fullmatch(r["check"])),
              f"results[{i}].check is not a check name")
        _need(isinstance(r.get("status"), str) and r["status"] in statuses,
              f"results[{i}].status is not one of the statuses")
        scope = r.get("scope", "node")
        _need(isinstance(scope, str) and scope in scopes, f"results[{i}].scope is not a scope")
        _need(isinstance(r.get("reason"), str) and bool(_REASON.fullmatch(r["reason"])),
              f"results[{i}].reason is not a reason token")
        for key in ("message", "remedy"):
            _need(isinstance(r.get(key, ""), str), f"results[{i}].{key} is not a text")
        _need(isinstance(r.get("details", {}), dict), f"results[{i}].details is not an object")
        _need(_is_number(r.get("duration_s", 0.0)) and r.get("duration_s", 0.0) >= 0,
              f"results[{i}].duration_s is not a finite number >= 0")
    _need(isinstance(data.get("host"), str), "host is not a text")
    _need(_is_number(data.get("timestamp_s")), "timestamp_s is not a finite number")
    for key in ("version", "mode"):
        _need(isinstance(data.get(key, ""), str), f"{key} is not a text")
    _optional_object(data, "fingerprint")
    _optional_object(data, "bandwidth")
    if isinstance(data.get("fingerprint"), dict):
        _optional_object(data["fingerprint"], "packages")
        _optional_object(data["fingerprint"], "meta")
    report = Report.from_json(data)
    try:  # what each endpoint does with it: free-form fields cannot break a later scrape
        json.dumps(report.to_json())
        render(MetricsSnapshot(report, known_checks, DaemonStats()))
    except Exception as exc:
        raise ReportInvalid(f"cannot be served: {type(exc).__name__}: "
                            f"{escape(str(exc), 200)}") from None
    return report


@dataclass
class _Output:
    """What one run's child wrote, and why reading stopped."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    #: None: both pipes ended; "deadline", "too-much", "held" (open after the child exited).
    stopped: str | None = None
    #: Processes still holding the pipes (or the child's session) that were killed.
    killed: list[str] = field(default_factory=list)


def _exited(pid: int) -> bool:
    """The child has exited; it is left a zombie (not reaped), so its pid and process-group id
    cannot be reused before the group is killed."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid == pid


class ChildRunner:
    """Runs ``preflight check --json`` in a child process group with a deadline.

    Args:
        root: passed to the child as ``--root``.
        argv_for: the child's argv per run kind; tests point it at a small script (a check that
            hangs or raises). Production uses :meth:`default_argv`, which runs only our checks.
        env: the child's environment (default: ours without systemd's notify variables).
        grace_s: how much longer than its checks' deadline a run may take.
        max_report_bytes: most bytes of stdout read (:data:`MAX_REPORT_BYTES`).
        drain_s: how long the pipes may stay open once the child exited (:data:`DRAIN_S`).
    """

    def __init__(self, *, root: str = "/", argv_for: ArgvFor | None = None,
                 env: Mapping[str, str] | None = None, grace_s: float = CHILD_GRACE_S,
                 max_report_bytes: int = MAX_REPORT_BYTES, drain_s: float = DRAIN_S) -> None:
        self.root = root
        self.grace_s = grace_s
        self.max_report_bytes = max_report_bytes
        self.drain_s = drain_s
        self.argv_for: ArgvFor = argv_for or self.default_argv
        base = dict(os.environ if env is None else env)
        self.env = {k: v for k, v in base.items() if k not in NOTIFY_VARS}
        self._proc: subprocess.Popen[bytes] | None = None
        #: set by :meth:`kill` (the daemon is stopping): no run starts after it
        self._killed = False
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
        # Started and recorded under the lock: a kill() meanwhile (the daemon stopping) waits
        # for it and then kills its group, instead of missing a child that is not yet recorded.
        with self._lock:
            if self._killed:
                return failed_report(expected, reason="RunFailed",
                                     message="the daemon is stopping: no check run started",
                                     remedy="None needed; the daemon was told to stop.",
                                     details={}, duration_s=0.0)
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=self.env,
                                        start_new_session=True)
            except OSError as exc:
                return failed_report(expected, reason="RunFailed",
                                     message=f"cannot start the check process {argv[0]}: {exc}",
                                     remedy="Reinstall preflight; the daemon's interpreter must "
                                            "be able to run `python -m preflight check`.",
                                     details={"argv": argv}, duration_s=0.0)
            self._proc = proc
        # The node checks are background work on a training node: at nice CHILD_NICE they yield
        # the CPU to the job's data loaders and to this daemon's own scrapes. (The bandwidth test
        # runs only when no job uses the GPUs; its workers inherit the same niceness.)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, CHILD_NICE)
        try:
            out = self._read(proc, config_text(config).encode(), started + deadline)
        finally:
            # Bandwidth workers live in the child's group; none may outlive a run. The group is
            # killed while the child is still an unreaped zombie (its pid cannot be reused).
            self._kill_group(proc)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
            with self._lock:
                self._proc = None
        duration = time.monotonic() - started
        if out.killed:
            log.warning("the %s check run left %d process(es) behind holding its output or in "
                        "its session; killed: %s", kind.value, len(out.killed),
                        "; ".join(out.killed[:5]))
        if out.stopped == "deadline":
            return failed_report(
                expected, reason="RunTimeout",
                message=f"the {kind.value} check run did not finish within its "
                        f"{deadline:g} s deadline; the daemon killed it (process group "
                        f"{proc.pid})",
                remedy="Something on this node does not answer (a hung GPU or driver shows "
                       "in dmesg as Xid errors); run `preflight check --log-level debug` by "
                       "hand to see which check waits.",
                details={"deadline_s": deadline}, duration_s=duration)
        if out.stopped == "too-much":
            return failed_report(
                expected, reason="RunFailed",
                message=f"the {kind.value} check run wrote more than {self.max_report_bytes} "
                        "bytes to standard output (a report is tens of KiB); the daemon "
                        f"stopped reading and killed it (process group {proc.pid})",
                remedy="Run `preflight check --json --log-level debug` by hand on this node "
                       "and see what prints so much (a site check writing to stdout?).",
                details={"max_report_bytes": self.max_report_bytes}, duration_s=duration)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return self._judge(kind, returncode, bytes(out.stdout), bytes(out.stderr),
                           expected=expected, duration_s=duration)

    def _read(self, proc: subprocess.Popen[bytes], config: bytes,
              deadline_at: float) -> _Output:
        """Feed the config to the child's stdin and read its stdout and stderr, bounded."""
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out = _Output()
        pipes = (proc.stdout.fileno(), proc.stderr.fileno())
        ids = {FileId.of(os.fstat(fd)) for fd in pipes}
        sel = selectors.DefaultSelector()
        pending = memoryview(config)
        stdin = proc.stdin.fileno()
        os.set_blocking(stdin, False)
        sel.register(stdin, selectors.EVENT_WRITE)
        for fd in pipes:
            sel.register(fd, selectors.EVENT_READ)
        exited_at: float | None = None
        try:
            while any(key.fd in pipes for key in sel.get_map().values()):
                now = time.monotonic()
                if exited_at is None and _exited(proc.pid):
                    exited_at = now
                if now >= deadline_at:
                    out.stopped = "deadline"
                    break
                if exited_at is not None and now >= exited_at + self.drain_s:
                    out.stopped = "held"
                    break
                wait = min(deadline_at, exited_at + self.drain_s if exited_at else now + 0.2)
                for key, _ in sel.select(max(0.0, wait - now)):
                    if key.fd == stdin:
                        try:
                            pending = pending[os.write(stdin, pending[:65536]):]
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError:  # the child closed its stdin: it needs no more
                            pending = pending[len(pending):]
                        if not pending:
                            sel.unregister(stdin)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                    elif key.fd == pipes[0]:
                        out.stdout += chunk
                        if len(out.stdout) > self.max_report_bytes:
                            out.stopped = "too-much"
                            del out.stdout[:]
                            return out
                    else:
                        out.stderr += chunk
                        del out.stderr[:-STDERR_KEEP_BYTES]
        finally:
            sel.close()
            # A pipe still open once reading stopped: whoever holds it is the run's too.
            out.killed = self._kill_leftovers(proc, ids if out.stopped is not None else set())
        return out

    def _kill_leftovers(self, proc: subprocess.Popen[bytes], pipes: set[FileId]) -> list[str]:
        """Kill the child's group, its session (a process that left the group by ``setpgid``),
        and every process holding ``pipes`` (one that left the session by ``setsid``); describe
        those that were not the child itself."""
        self._kill_group(proc)
        me = os.getpid()
        victims = {pid: describe_process("/proc", pid).describe()
                   for pid in session_members("/proc", proc.pid)}
        if pipes:
            scan = find_holders("/proc", Wanted(files=frozenset(pipes)), maps=False,
                                deadline_s=2.0, skip_pids=(me,))
            victims.update({h.pid: h.describe() for h in scan.holders})
        killed = []
        for pid, what in sorted(victims.items()):
            if pid in (me, 1):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                if pid != proc.pid:
                    killed.append(what)
        return killed

    @staticmethod
    def _judge(kind: RunKind, returncode: int, out: bytes, err: bytes, *,
               expected: Sequence[str], duration_s: float) -> Report:
        tail = escape(err[-STDERR_TAIL_BYTES:].decode(errors="replace").strip(),
                      STDERR_TAIL_BYTES)
        try:
            return parse_report(out, known_checks=expected)
        except ReportInvalid as exc:
            why = f"exit code {returncode}" if returncode >= 0 else f"signal {-returncode}"
            return failed_report(
                expected, reason="RunFailed",
                message=f"the {kind.value} check run ended with {why} and no valid JSON report "
                        f"({exc}); stderr: {tail or '(empty)'}",
                remedy="Run `preflight check --json --log-level debug` by hand on this node "
                       "and report the output.",
                details={"returncode": returncode}, duration_s=duration_s)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            proc = self._proc
        if proc is not None:
            self._kill_group(proc)
