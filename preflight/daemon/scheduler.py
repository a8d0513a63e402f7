"""The daemon: one scheduler thread, the cached Report, the HTTP server, reload on request.

* A scrape never runs a check: ``/metrics`` renders the cached Report through
  :class:`~preflight.outputs.prom.ReportCollector`; the text is rendered once per state change.
* The bandwidth test (the ``allreduce`` check) runs on its own, longer interval and only when NVML
  shows no compute process on any GPU, so it never steals a running job's GPUs; one lock and one
  scheduler thread make sure two runs never overlap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from preflight.bench.gate import blocker
from preflight.checks import GPU_LOAD_CHECKS
from preflight.checks.allreduce import NAME as ALLREDUCE_CHECK
from preflight.core.config import Config, ConfigError, cut
from preflight.core.result import Report, Status
from preflight.daemon.child import (
    CHILD_GRACE_S,
    ChildRunner,
    RunKind,
    Runner,
    failed_report,
    run_deadline_s,
)
from preflight.daemon.server import Health, Server, make_server, parse_listen
from preflight.daemon.systemd import sd_notify, watchdog_interval_s
from preflight.outputs.prom import DaemonStats, MetricsSnapshot, render
from preflight.probes.gpu import GpuSnapshot
from preflight.probes.xid_events import XidWatcher

if TYPE_CHECKING:
    from preflight.daemon.kube import NodeStatus

log = logging.getLogger(__name__)


class DaemonError(RuntimeError):
    """The daemon cannot start (the address cannot be bound...)."""



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
        known_checks: checks whose series exist from the first scrape (the config's site checks
            are added to them, reload after reload).
        bandwidth: run the bandwidth test at all (default: when an ``allreduce`` check exists).
        root: where the host filesystem is mounted (``--root``).
        grace_s: how much longer than its checks' deadline a run may take (child start-up).
        env: where systemd's variables are read from.
        clock: monotonic seconds (tests).
        xid_watcher: counts NVML Xid events on its own thread (started and stopped with the
            daemon; never waited on); None = Xids only from each check run's kernel log.
        node_status: writes the node's condition to Kubernetes on its own thread (default:
            made from the config when ``kube_node_status`` is on; preflight.daemon.kube).
    """

    def __init__(self, config: Config, *, load_config: Callable[[], Config] | None = None,
                 runner: Runner | None = None, gpus: Callable[[], GpuSnapshot] | None = None,
                 known_checks: Sequence[str] | None = None, bandwidth: bool | None = None,
                 root: str = "/", env: Mapping[str, str] | None = None,
                 grace_s: float = CHILD_GRACE_S,
                 clock: Callable[[], float] = time.monotonic,
                 xid_watcher: XidWatcher | None = None,
                 node_status: NodeStatus | None = None) -> None:
        self._xid = xid_watcher
        if node_status is None and config.kube_node_status:
            from preflight.daemon.kube import from_config

            node_status = from_config(config, os.environ if env is None else env)
        self._kube = node_status
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
        self._gpu_query: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._server: Server | None = None
        #: (kind, start, end) of every run, in monotonic seconds; tests assert no overlap.
        self.history: list[tuple[RunKind, float, float]] = []

    # ---- state ------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._generation += 1

    def checks(self) -> tuple[str, ...]:
        """The checks of this config: the known ones, then the site checks it adds."""
        site = [sc.name for sc in self.config.site_checks if sc.name not in self.known_checks]
        return (*self.known_checks, *site)

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
        order = {name: i for i, name in enumerate(self.checks())}
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
        return MetricsSnapshot(report=self.report(), known_checks=self.checks(),
                               daemon=stats)

    def metrics(self) -> bytes:
        """The exposition text, rendered once per state change (a scrape is a dict lookup)."""
        with self._lock:
            # Xid events change the text between runs: the watcher's own version is in the key.
            generation = (self._generation, self._xid.version if self._xid else 0)
            cached_generation, text = self._rendered
        if cached_generation == generation:
            return text + self._kube_metrics()
        text = render(self.snapshot())
        with self._lock:
            if self._generation == generation[0]:
                self._rendered = (generation, text)
        return text + self._kube_metrics()

    def _kube_metrics(self) -> bytes:
        """The node-status writer's few series, rendered on every scrape (they change between
        runs, with each write)."""
        if self._kube is None:
            return b""
        from prometheus_client.core import CollectorRegistry
        from prometheus_client.exposition import generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._kube)
        return generate_latest(registry)

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
                    else [c for c in self.checks() if c not in GPU_LOAD_CHECKS])
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
        if kind is RunKind.NODE and self._kube is not None:
            merged = self.report()
            if merged is not None:
                self._kube.observe(merged)  # counts and wakes its thread; no I/O here
        return report

    def _gpus_busy(self) -> str | None:
        """Why the bandwidth test must wait, or None. NVML runs in this process, so the query
        runs on its own thread with a deadline (``check_timeout_s``): a driver call that never
        returns costs one stuck thread and a deferred test, never the scheduler loop. While a
        stuck query has not returned, no second one is started."""
        with self._lock:
            stuck = self._gpu_query
        if stuck is not None and stuck.is_alive():
            return ("the previous NVML query for GPU use has not returned yet (a hung driver "
                    "call; see dmesg for Xid errors)")
        answer: list[str | None] = []

        def query() -> None:
            try:
                if self._gpus is not None:
                    snap = self._gpus()
                else:
                    from preflight.probes.node import make_context

                    snap = make_context(self.config, env=self._env, root=self.root).gpus()
                answer.append(_busy_gpus(snap))
            except Exception as exc:
                answer.append(f"cannot read GPU use from NVML: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=query, name="gpu-busy", daemon=True)
        with self._lock:
            self._gpu_query = thread
        thread.start()
        timeout_s = self.config.check_timeout_s
        thread.join(timeout_s)
        if thread.is_alive():
            log.error("the NVML query for GPU use did not answer within %g s; the bandwidth test "
                      "waits until it does", timeout_s)
            return f"NVML did not answer the GPU-use query within {timeout_s:g} s"
        return answer[0] if answer else "the NVML query for GPU use returned nothing"

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
            self._server = make_server(host, port, self)
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
        if self._kube is not None:
            self._kube.start()
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
        if self._kube is not None:
            self._kube.stop(timeout_s=0.5)
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
        except Exception as exc:  # any mistake in a new file must not end the daemon
            log.error("config reload failed, keeping the previous config: %s: %s",
                      type(exc).__name__, cut(str(exc)))
            log.debug("reload traceback", exc_info=True)
            ok = False
        else:
            if new.listen != self.config.listen:
                log.warning("listen changed to %s in the config; restart the daemon to apply it "
                            "(still serving on %s)", new.listen, self.config.listen)
                new = new.replace(listen=self.config.listen)
            kube = {k: getattr(self.config, k) for k in dataclasses.asdict(self.config)
                    if k.startswith("kube_") and getattr(new, k) != getattr(self.config, k)}
            if kube:
                log.warning("%s changed in the config; restart the daemon to apply it (the node "
                            "status keeps its settings)", ", ".join(sorted(kube)))
                new = new.replace(**kube)
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
        from preflight.daemon.signals import serve_until_signalled

        serve_until_signalled(self)


@contextlib.contextmanager
def running(daemon: Daemon) -> Iterator[Daemon]:
    """``with running(Daemon(...)) as d:`` starts it and always stops it (tests, benchmarks)."""
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
