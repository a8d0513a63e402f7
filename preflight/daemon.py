"""``preflight serve``: a long-running daemon that keeps a fresh verdict and serves it as metrics.

Design (ARCHITECTURE.md, Daemon; STYLE habit 11):

* Checks run in a **child process** (``python -m preflight check --json --no-bandwidth``) with a
  deadline; when it passes, the child's whole process group is killed and every check of that run
  is reported as ERROR (``RunTimeout``). A hung driver call or a crashing check can therefore never
  take the daemon down, and the child's own per-check deadlines give per-check ERRORs first. The
  daemon itself never imports torch (the bandwidth workers do, in their own processes).
* A scrape never runs a check: ``/metrics`` renders the cached Report through
  :class:`~preflight.outputs.prom.ReportCollector`; the text is rendered once per state change.
* The bandwidth test (the ``allreduce`` check) runs on its own, longer interval and only when NVML
  shows no compute process on any GPU, so it never steals a running job's GPUs; one lock and one
  scheduler thread make sure two runs never overlap.
* systemd: ``READY=1`` once listening, ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the loop is
  alive (a datagram to ``$NOTIFY_SOCKET``, abstract ``@`` sockets included; no dependency), clean
  exit on SIGTERM/SIGINT, config reload on SIGHUP (a bad file keeps the old config and sets
  ``preflight_config_reload_success 0``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import yaml

from preflight.bench.gate import blocker
from preflight.checks.allreduce import NAME as ALLREDUCE_CHECK
from preflight.core.config import Config, ConfigError
from preflight.core.result import Report, Result, Status
from preflight.outputs.prom import DaemonStats, MetricsSnapshot, render
from preflight.probes.gpu import GpuSnapshot
from preflight.probes.xid_events import XidWatcher

log = logging.getLogger(__name__)

#: Seconds a node-check child may take beyond ``check_timeout_s`` (interpreter start, imports,
#: JSON); checks run concurrently, so the run as a whole needs one check deadline plus this.
CHILD_GRACE_S = 20.0
#: Niceness of the check process (background work on a node that trains).
CHILD_NICE = 10
#: Bytes of a failed child's stderr quoted in the ERROR message.
STDERR_TAIL_BYTES = 600
#: The text format every Prometheus parses (2.x included); prometheus_client >= 0.22 labels its
#: output 1.0.0, which only differs for non-legacy metric names, and we have none.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Variables a child must not inherit: only the daemon talks to systemd.
_NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class DaemonError(RuntimeError):
    """The daemon cannot start (the address cannot be bound...)."""


class RunKind(enum.Enum):
    """What a run checks: the node checks, or the bandwidth test alone."""

    NODE = "node"
    BANDWIDTH = "bandwidth"


# --------------------------------------------------------------------------------------------
# Parsing


def parse_listen(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:9857"`` for IPv6) -> (host, port).

    Raises:
        ValueError: not HOST:PORT, or the port is not in 0..65535 (0 = any free port).
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"listen address {text!r} is not HOST:PORT (e.g. 127.0.0.1:9857)")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"listen address {text!r}: port {port} is not in 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen address {text!r}: write an IPv6 host in brackets, "
                         "e.g. [::1]:9857")
    if not host:
        raise ValueError(f"listen address {text!r} has no host; say 0.0.0.0:{port} to listen "
                         "on every IPv4 address")
    return host, port


# --------------------------------------------------------------------------------------------
# systemd notification


def sd_notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (``"READY=1"``) to systemd's ``$NOTIFY_SOCKET``; False when not under
    systemd or when the datagram could not be sent (never raises: systemd is optional).

    The protocol is one datagram on a unix socket (sd_notify(3)); a leading ``@`` names an
    abstract socket.
    """
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(1.0)
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %r: %s", address, exc)
        return False
    return True


def watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds (sd_watchdog_enabled(3)), None when not asked for or
    meant for another process (``$WATCHDOG_PID``)."""
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


# --------------------------------------------------------------------------------------------
# Running checks in a child


class Runner(Protocol):
    """Runs one kind of run and returns its Report; must return within its own deadline."""

    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report: ...

    def kill(self) -> None:
        """Stop a run in progress now (daemon shutdown)."""


ArgvFor = Callable[[RunKind, Config], Sequence[str]]


#: The checks that load the GPUs: they run in the bandwidth run (idle GPUs only), not each interval.
GPU_LOAD_CHECKS = (ALLREDUCE_CHECK, "gpu_speed")


def run_deadline_s(kind: RunKind, config: Config, grace_s: float = CHILD_GRACE_S) -> float:
    """How long a run of ``kind`` may take before its process group is killed."""
    own = (config.bench_timeout_s + config.gpu_speed_timeout_s if kind is RunKind.BANDWIDTH
           else config.check_timeout_s)
    return own + grace_s


def config_text(config: Config) -> str:
    """``config`` as YAML, the form the child reads from its standard input."""
    data = {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(config).items()}
    return yaml.safe_dump(data, sort_keys=True)


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
        self.env = {k: v for k, v in base.items() if k not in _NOTIFY_VARS}
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


# --------------------------------------------------------------------------------------------
# The daemon


@dataclass(frozen=True)
class Health:
    ok: bool
    message: str


def _busy_gpus(snapshot: GpuSnapshot) -> str | None:
    """Why the periodic bandwidth test must not run now, or None (preflight.bench.gate)."""
    stop = blocker(snapshot, periodic=True)
    return stop.why if stop else None


class Daemon:
    """Scheduler + cache + HTTP server. Construct, then :meth:`start`; :meth:`stop` ends it.

    Args:
        config: the validated config (interval_s, bandwidth_interval_s, listen...).
        load_config: re-reads the config (file < environment < command line) on SIGHUP.
        runner: runs checks; default :class:`ChildRunner` (tests inject a fake, slow one).
        gpus: fresh GPU snapshot for the "is a job using the GPUs?" question (NVML).
        known_checks: checks whose series exist from the first scrape.
        bandwidth: run the bandwidth test at all (default: when an ``allreduce`` check exists).
        root: where the host filesystem is mounted (``--root``).
        grace_s: how much longer than its checks' deadline a run may take (child start-up).
        env: where systemd's variables are read from.
        clock: monotonic seconds (tests).
        xid_watcher: counts NVML Xid events on its own thread (started and stopped with the
            daemon; never waited on); None = Xids only from each check run's kernel log.
    """

    def __init__(self, config: Config, *, load_config: Callable[[], Config] | None = None,
                 runner: Runner | None = None, gpus: Callable[[], GpuSnapshot] | None = None,
                 known_checks: Sequence[str] | None = None, bandwidth: bool | None = None,
                 root: str = "/", env: Mapping[str, str] | None = None,
                 grace_s: float = CHILD_GRACE_S,
                 clock: Callable[[], float] = time.monotonic,
                 xid_watcher: XidWatcher | None = None) -> None:
        self._xid = xid_watcher
        if known_checks is None:
            from preflight.checks import CHECKS

            known_checks = [c.name for c in CHECKS]
        self.config = config
        self.known_checks = tuple(known_checks)
        self.bandwidth = ALLREDUCE_CHECK in self.known_checks if bandwidth is None else bandwidth
        self._load_config = load_config
        self.root = root
        self.grace_s = grace_s
        self._runner: Runner = runner or ChildRunner(root=root, env=env, grace_s=grace_s)
        self._gpus = gpus
        self._env = dict(os.environ if env is None else env)
        self._clock = clock
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._node: Report | None = None
        self._bandwidth: Report | None = None
        self._bandwidth_at = 0.0
        self._runs_total = 0
        self._errors: dict[str, int] = {}
        self._reload_ok = True
        self._generation = 0
        self._rendered: tuple[tuple[int, int], bytes] = ((-1, -1), b"")
        self._tick = clock()
        self._busy_until: float | None = None
        self._threads: list[threading.Thread] = []
        self._server: _Server | None = None
        #: (kind, start, end) of every run, in monotonic seconds; tests assert no overlap.
        self.history: list[tuple[RunKind, float, float]] = []

    # ---- state ------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._generation += 1

    def report(self) -> Report | None:
        """The last node report with the last bandwidth result merged in; None before any run."""
        with self._lock:
            node, bw = self._node, self._bandwidth
        if node is None:
            return None
        if bw is None:
            return node
        results = [r for r in node.results if r.check not in GPU_LOAD_CHECKS]
        results += [r for r in bw.results if r.check in GPU_LOAD_CHECKS]
        order = {name: i for i, name in enumerate(self.known_checks)}
        results.sort(key=lambda r: order.get(r.check, len(order)))
        return dataclasses.replace(node, results=tuple(results),
                                   bandwidth=bw.bandwidth or node.bandwidth)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            stats = DaemonStats(runs_total=self._runs_total,
                                check_errors_total=dict(self._errors),
                                config_reload_success=self._reload_ok,
                                bandwidth_timestamp_s=self._bandwidth_at,
                                interval_s=self.config.interval_s,
                                xid_counts=self._xid.counts() if self._xid else None,
                                xid_watching=self._xid.watching if self._xid else False)
        return MetricsSnapshot(report=self.report(), known_checks=self.known_checks,
                               daemon=stats)

    def metrics(self) -> bytes:
        """The exposition text, rendered once per state change (a scrape is a dict lookup)."""
        with self._lock:
            # Xid events change the text between runs: the watcher's own version is in the key.
            generation = (self._generation, self._xid.version if self._xid else 0)
            cached_generation, text = self._rendered
        if cached_generation == generation:
            return text
        text = render(self.snapshot())
        with self._lock:
            if self._generation == generation[0]:
                self._rendered = (generation, text)
        return text

    def health(self) -> Health:
        """Alive when the loop ran within two intervals (plus the deadline of a run in progress:
        a long but bounded bandwidth test is not a stall)."""
        now = self._clock()
        with self._lock:
            tick, busy_until = self._tick, self._busy_until
        limit = tick + 2 * self.config.interval_s
        if busy_until is not None:
            limit = max(limit, busy_until + self.config.interval_s)
        age = now - tick
        if now <= limit:
            return Health(True, f"ok: loop ran {age:.1f} s ago\n")
        return Health(False, f"stalled: the check loop last ran {age:.1f} s ago (limit "
                             f"{limit - tick:.1f} s = 2 x interval_s plus the deadline of a run "
                             "in progress)\n")

    def _beat(self) -> None:
        with self._lock:
            self._tick = self._clock()

    # ---- runs -------------------------------------------------------------------------------

    def run_once(self, kind: RunKind) -> Report:
        """One run of ``kind`` under the run lock; its Report replaces the cached one."""
        config = self.config
        expected = ([c for c in self.known_checks if c in GPU_LOAD_CHECKS]
                    if kind is RunKind.BANDWIDTH
                    else [c for c in self.known_checks if c not in GPU_LOAD_CHECKS])
        with self._run_lock:
            self._beat()
            start = self._clock()
            with self._lock:
                self._busy_until = start + run_deadline_s(kind, config, self.grace_s)
            try:
                report = self._runner(kind, config, expected)
            except Exception as exc:  # a broken runner must not end the loop
                log.exception("%s run crashed", kind.value)
                report = failed_report(expected, reason="RunFailed",
                                       message=f"the daemon could not run the {kind.value} "
                                               f"checks: {type(exc).__name__}: {exc}",
                                       remedy="This is a bug; report the daemon's log.",
                                       details={}, duration_s=self._clock() - start)
            end = self._clock()
            self.history.append((kind, start, end))
        report = dataclasses.replace(report, mode="serve")
        if self._stop.is_set():
            # Killed by our own shutdown: says nothing about the node, so it is not recorded.
            return report
        with self._lock:
            self._busy_until = None
            self._tick = end
            self._runs_total += 1
            for r in report.results:
                if r.status is Status.ERROR:
                    self._errors[r.check] = self._errors.get(r.check, 0) + 1
            if kind is RunKind.BANDWIDTH:
                self._bandwidth = report
                self._bandwidth_at = report.timestamp_s
            else:
                self._node = report
            self._changed()
        bad = [f"{r.check}={r.status.word}({r.reason})" for r in report.results
               if r.status >= Status.WARN]
        log.info("%s run: %s in %.1f s%s", kind.value, report.status.word, end - start,
                 f": {', '.join(bad)}" if bad else "")
        return report

    def _gpus_busy(self) -> str | None:
        try:
            if self._gpus is not None:
                snap = self._gpus()
            else:
                from preflight.core.context import make_context

                snap = make_context(self.config, env=self._env, root=self.root).gpus()
        except Exception as exc:
            return f"cannot read GPU use from NVML: {type(exc).__name__}: {exc}"
        return _busy_gpus(snap)

    def _loop(self) -> None:
        last_node: float | None = None
        bandwidth_due = 0.0  # right after the first node run, then every bandwidth_interval_s
        while not self._stop.is_set():
            self._beat()
            now = self._clock()
            if last_node is None or now >= last_node + self.config.interval_s:
                last_node = now
                self.run_once(RunKind.NODE)
                if self._stop.is_set():
                    break
                if self.bandwidth and self._clock() >= bandwidth_due:
                    busy = self._gpus_busy()
                    if busy:
                        log.info("bandwidth test deferred: %s", busy)
                    else:
                        self.run_once(RunKind.BANDWIDTH)
                        bandwidth_due = self._clock() + self.config.bandwidth_interval_s
            self._beat()
            wait = last_node + self.config.interval_s - self._clock()
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()

    def _watchdog(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            health = self.health()
            if health.ok:
                sd_notify("WATCHDOG=1", self._env)
            else:
                # No ping: systemd restarts a daemon whose loop is stuck (WatchdogSec).
                log.error("not pinging the systemd watchdog: %s", health.message.strip())

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) actually bound (port 0 in --listen picks a free one)."""
        if self._server is None:
            raise DaemonError("not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Bind ``config.listen``, start the HTTP and scheduler threads, tell systemd READY."""
        try:
            host, port = parse_listen(self.config.listen)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        try:
            self._server = _make_server(host, port, self)
        except OSError as exc:
            raise DaemonError(f"cannot listen on {self.config.listen}: "
                              f"{exc.strerror or exc}") from None
        bound_host, bound_port = self.address
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        log.warning("listening on http://%s:%d (/metrics /healthz /report)", shown, bound_port)
        self._threads = [
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                             name="http", daemon=True),
            threading.Thread(target=self._loop, name="loop", daemon=True),
        ]
        every = watchdog_interval_s(self._env)
        if every is not None:
            self._threads.append(threading.Thread(target=self._watchdog, args=(every,),
                                                  name="watchdog", daemon=True))
        for t in self._threads:
            t.start()
        if self._xid is not None:
            self._xid.start()
        sd_notify(f"READY=1\nSTATUS=serving on {shown}:{bound_port}\nMAINPID={os.getpid()}",
                  self._env)

    def stop(self, timeout_s: float = 1.5) -> None:
        """Stop serving, kill a run in progress (its process group), join the threads."""
        sd_notify("STOPPING=1", self._env)
        self._stop.set()
        self._wake.set()
        self._runner.kill()
        if self._xid is not None:
            self._xid.stop(timeout_s=0.5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def reload(self) -> bool:
        """Re-read the config; a bad one keeps the old and sets the reload metric to 0."""
        if self._load_config is None:
            return True
        try:
            new = self._load_config()
        except (ConfigError, OSError) as exc:
            log.error("config reload failed, keeping the previous config: %s", exc)
            ok = False
        else:
            if new.listen != self.config.listen:
                log.warning("listen changed to %s in the config; restart the daemon to apply it "
                            "(still serving on %s)", new.listen, self.config.listen)
                new = new.replace(listen=self.config.listen)
            self.config = new
            log.warning("config reloaded (interval %g s, bandwidth interval %g s)",
                        new.interval_s, new.bandwidth_interval_s)
            ok = True
        with self._lock:
            self._reload_ok = ok
            self._changed()
        self._wake.set()
        return ok

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT (in the main thread); SIGHUP reloads the config."""
        wake = threading.Event()
        pending: list[int] = []

        def on_signal(signum: int, _frame: object) -> None:
            pending.append(signum)
            wake.set()

        previous = {s: signal.signal(s, on_signal)
                    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            self.start()
            while True:
                wake.wait(0.5)
                wake.clear()
                while pending:
                    signum = pending.pop(0)
                    if signum == signal.SIGHUP:
                        self.reload()
                    else:
                        log.warning("%s: stopping", signal.Signals(signum).name)
                        return
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)


# --------------------------------------------------------------------------------------------
# HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default backlog of 5 makes the 6th simultaneous connection wait for a SYN
    # retransmit (1 s, then 3 s): a fleet of Prometheus replicas or a burst of clients must not.
    request_queue_size = 128
    preflight: Daemon


def _make_server(host: str, port: int, daemon: Daemon) -> _Server:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]

    class Server(_Server):
        address_family = family

    server = Server((host, port), _Handler)
    server.preflight = daemon
    return server


class _Handler(BaseHTTPRequestHandler):
    """``/metrics``, ``/healthz``, ``/report``; nothing else, nothing that runs a check."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
    # Headers and body are two writes; with Nagle on, the body of a kept-alive connection waits
    # for the client's delayed ACK (40 ms on Linux) on every scrape.
    disable_nagle_algorithm = True
    timeout = 10.0  # a client that stops talking cannot hold a thread for ever
    server: _Server
    server_version = "preflight"

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        daemon = self.server.preflight
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, daemon.metrics(), METRICS_CONTENT_TYPE)
        elif path == "/healthz":
            health = daemon.health()
            self._send(200 if health.ok else 503, health.message.encode(),
                       "text/plain; charset=utf-8")
        elif path == "/report":
            report = daemon.report()
            if report is None:
                body = {"error": "no check run has finished yet; retry in a few seconds"}
                self._send(503, json.dumps(body).encode() + b"\n", "application/json")
            else:
                self._send(200, json.dumps(report.to_json(), indent=2).encode() + b"\n",
                           "application/json")
        elif path == "/":
            self._send(200, b"preflight serve: /metrics /healthz /report\n",
                       "text/plain; charset=utf-8")
        else:
            self._send(HTTPStatus.NOT_FOUND, f"no such page {path!r}; try /metrics /healthz "
                       "/report\n".encode(), "text/plain; charset=utf-8")

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


@contextlib.contextmanager
def running(daemon: Daemon) -> Iterator[Daemon]:
    """``with running(Daemon(...)) as d:`` starts it and always stops it (tests, benchmarks)."""
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


__all__ = ["ChildRunner", "Daemon", "DaemonError", "RunKind", "parse_listen", "running",
           "sd_notify"]
