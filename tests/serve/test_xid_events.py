"""The daemon's Xid event watcher through the fake event source: catch-up from a kernel log under
``--root``, events counted per GPU and code, a source that fails or hangs never blocks the caller,
and the counts on a real daemon's /metrics over HTTP."""

from __future__ import annotations

import time
from pathlib import Path

from preflight.core.config import Config
from preflight.core.result import Report, Result, Status
from preflight.daemon import Daemon, running
from preflight.probes.xid_events import (
    FakeXidEvents,
    XidNotice,
    XidWatcher,
    kernel_log_catch_up,
)
from tests.checks.test_xid import FELL_OFF_GPU3, MMU_GPU0, kmsg_root
from tests.serve.conftest import get, samples, wait_for
from tests.serve.test_daemon import FakeRunner

BUS = {"0000:18:00": "0", "0000:5d:00": "3"}


def test_catch_up_then_events(tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (10.0, FELL_OFF_GPU3), (20.0, MMU_GPU0), (30.0, MMU_GPU0),
                     (40.0, "NVRM: Xid (PCI:0000:99:00): 79, GPU has fallen off the bus."))
    source = FakeXidEvents(BUS)
    w = XidWatcher(source, catch_up=kernel_log_catch_up(root), wait_s=0.05)
    w.start()
    try:
        wait_for(lambda: w.watching, timeout_s=5, what="watching")
        assert w.counts() == {("3", 79): 1, ("0", 31): 2, ("0000:99:00", 79): 1}
        source.events.put(XidNotice("3", 79))
        source.events.put(XidNotice("1", 48))
        wait_for(lambda: w.counts().get(("1", 48)) == 1, timeout_s=5, what="event counted")
        assert w.counts()[("3", 79)] == 2
        assert w.status() == "watching"
    finally:
        t0 = time.monotonic()
        w.stop(timeout_s=60.0)
    # stop() returns before its 60 s only when the watcher's thread ended: it did not hang
    assert time.monotonic() - t0 < 30
    assert source.closed.is_set()


def test_no_nvml_still_catches_up_and_says_why(tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (10.0, FELL_OFF_GPU3))
    w = XidWatcher(FakeXidEvents(open_error=RuntimeError("NVML Shared Library Not Found")),
                   catch_up=kernel_log_catch_up(root))
    w.start()
    wait_for(lambda: bool(w.counts()), timeout_s=5, what="catch-up")
    assert w.counts() == {("0000:5d:00", 79): 1}  # no NVML: named by PCI address
    assert not w.watching
    assert "no NVML Xid events: RuntimeError: NVML Shared Library Not Found" in w.status()
    w.stop()


def test_hung_nvml_never_blocks_the_caller() -> None:
    w = XidWatcher(FakeXidEvents(open_delay_s=60.0), open_timeout_s=0.2)
    w.start()
    t0 = time.monotonic()
    assert w.counts() == {} and not w.watching
    assert time.monotonic() - t0 < 20  # NVML's open takes 60 s; the caller does not wait for it
    wait_for(lambda: "did not answer within 0.2 s" in w.status(), timeout_s=5,
             what="deadline reported")
    t0 = time.monotonic()
    w.stop(timeout_s=0.2)
    assert time.monotonic() - t0 < 20  # its own 0.2 s, not the 60 s open


def test_daemon_serves_event_counts_over_http(tmp_path: Path) -> None:
    source = FakeXidEvents(BUS)
    watcher = XidWatcher(source, catch_up=kernel_log_catch_up(
        kmsg_root(tmp_path, (10.0, FELL_OFF_GPU3))), wait_s=0.05)

    class XidRunner(FakeRunner):
        def __call__(self, kind: object, config: Config, expected: object) -> Report:
            # The check run's kernel-log view; the watcher's counts take precedence on /metrics.
            return Report(results=(Result("xid", Status.FAIL, "XidNodeFault", "Xid 79",
                                          details={"xids": [{"gpu": "3", "xid": 79,
                                                             "count": 1}]}),))

    cfg = Config(listen="127.0.0.1:0", interval_s=30.0)
    daemon = Daemon(cfg, runner=XidRunner(), known_checks=("xid",), bandwidth=False,
                    xid_watcher=watcher)
    with running(daemon) as d:
        host, port = d.address
        url = f"http://{host}:{port}/metrics"
        wait_for(lambda: samples(get(url).text).get("preflight_xid_events_watching") == 1,
                 timeout_s=5, what="watcher up")
        key = 'preflight_xid_errors_total{gpu="3",xid="79"}'
        assert samples(get(url).text)[key] == 1
        source.events.put(XidNotice("3", 79))
        source.events.put(XidNotice("0", 13))
        wait_for(lambda: samples(get(url).text).get(key) == 2, timeout_s=5,
                 what="event on /metrics between two check runs")
        assert samples(get(url).text)['preflight_xid_errors_total{gpu="0",xid="13"}'] == 1
    assert source.closed.is_set()
