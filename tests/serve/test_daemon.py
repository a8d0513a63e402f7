"""The daemon in this process with real HTTP on loopback: scrape content, /healthz, /report,
child runs that raise, hang or print garbage, and the bandwidth schedule (fake runners)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.core.config import Config
from preflight.core.result import Report, Result, Status
from preflight.daemon import ChildRunner, Daemon, RunKind, parse_listen, running, sd_notify
from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.helpers import pid_alive
from tests.serve.conftest import FAKE_CHILD, REPO, get, samples, wait_for

KNOWN = ("alpha", "beta")


class FakeRunner:
    """Returns canned reports; ``gate`` holds a run until set; ``delay_s`` makes runs slow."""

    def __init__(self, *, delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.gate = gate
        self.calls: list[RunKind] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report:
        with self._lock:
            self.calls.append(kind)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.gate is not None:
                self.gate.wait(10)
            time.sleep(self.delay_s)
            if kind is RunKind.BANDWIDTH:
                # As the runner lifts it: the figures live in Report.bandwidth.
                return Report(results=(Result("allreduce", Status.PASS, "BusbwOk", "fast"),),
                              bandwidth={"busbw_gbps": 370.0, "link_efficiency": 0.82})
            return Report(results=tuple(Result(c, Status.PASS, "Ok", "fine") for c in expected))
        finally:
            with self._lock:
                self.active -= 1

    def kill(self) -> None:
        if self.gate is not None:
            self.gate.set()


def config(**changes: object) -> Config:
    return Config(listen="127.0.0.1:0", interval_s=0.3).replace(**changes)


def url(d: Daemon, path: str) -> str:
    host, port = d.address
    return f"http://{host}:{port}{path}"


def child_daemon(mode: str, tmp_path: Path, *, grace_s: float = 20.0, **changes: object
                 ) -> Daemon:
    def argv(kind: RunKind, cfg: Config) -> list[str]:
        return [sys.executable, str(FAKE_CHILD), mode, str(tmp_path / "grandchild.pid")]

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return Daemon(config(**changes), runner=ChildRunner(argv_for=argv, env=env, grace_s=grace_s),
                  known_checks=KNOWN, bandwidth=False, grace_s=grace_s)


def test_metrics_exist_before_the_first_run_then_show_it() -> None:
    gate = threading.Event()
    runner = FakeRunner(gate=gate)
    with running(Daemon(config(), runner=runner, known_checks=KNOWN, bandwidth=False)) as d:
        first = get(url(d, "/metrics"))
        assert first.status == 200
        assert first.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        m = samples(first.text)
        assert m["preflight_last_run_timestamp_seconds"] == 0
        assert m['preflight_check_status{check="beta",status="pass"}'] == 0
        report = get(url(d, "/report"))
        assert report.status == 503
        assert "no check run" in report.json_body()["error"]
        gate.set()
        wait_for(lambda: get(url(d, "/report")).status == 200, timeout_s=5, what="first run")
        m = samples(get(url(d, "/metrics")).text)
        assert m['preflight_check_status{check="beta",status="pass"}'] == 1
        assert m["preflight_last_run_timestamp_seconds"] > 1.6e9
        assert m["preflight_node_healthy"] == 1
        assert get(url(d, "/nope")).status == 404


def test_report_has_the_check_json_schema() -> None:
    with running(Daemon(config(), runner=FakeRunner(), known_checks=KNOWN,
                        bandwidth=False)) as d:
        wait_for(lambda: get(url(d, "/report")).status == 200, timeout_s=5, what="first run")
        import json

        data = json.loads(get(url(d, "/report")).body)
        assert data["schema_version"] == 1
        assert data["mode"] == "serve"
        assert [r["check"] for r in data["results"]] == list(KNOWN)
        assert Report.from_json(data).status is Status.PASS


def test_healthz_goes_503_when_the_loop_stalls() -> None:
    """A runner that blocks past its deadline (a daemon bug) must show on /healthz."""
    gate = threading.Event()
    stalled = FakeRunner(gate=gate)
    d = Daemon(config(check_timeout_s=0.01), runner=stalled, known_checks=KNOWN, bandwidth=False,
               grace_s=0.2)
    with running(d):
        assert get(url(d, "/healthz")).status == 200
        # limit = deadline of the run in progress (0.21 s) + interval (0.3 s)
        wait_for(lambda: get(url(d, "/healthz")).status == 503, timeout_s=3,
                 what="/healthz to report the stall")
        assert "stalled" in get(url(d, "/healthz")).text
        assert get(url(d, "/metrics")).status == 200  # still serving
        gate.set()
        wait_for(lambda: get(url(d, "/healthz")).status == 200, timeout_s=3,
                 what="/healthz to recover")


def test_a_check_that_raises_is_an_error_and_counted(tmp_path: Path) -> None:
    with running(child_daemon("raise", tmp_path)) as d:
        wait_for(lambda: samples(get(url(d, "/metrics")).text)["preflight_runs_total"] >= 2,
                 timeout_s=15, what="two runs")
        m = samples(get(url(d, "/metrics")).text)
        assert m['preflight_check_status{check="beta",status="error"}'] == 1
        assert m['preflight_check_status{check="alpha",status="pass"}'] == 1
        assert m['preflight_check_result_info{check="beta",reason="CheckCrashed",'
                 'scope="undecided",status="error"}'] == 1
        assert m['preflight_check_errors_total{check="beta"}'] >= 2
        assert m['preflight_check_errors_total{check="alpha"}'] == 0
        beta = Report.from_json(get(url(d, "/report")).json_body()).result("beta")
        assert beta is not None and "probe exploded" in beta.message


def test_a_check_that_hangs_is_an_error_at_its_deadline(tmp_path: Path) -> None:
    with running(child_daemon("hang-check", tmp_path)) as d:
        wait_for(lambda: get(url(d, "/report")).status == 200, timeout_s=15, what="a run")
        beta = Report.from_json(get(url(d, "/report")).json_body()).result("beta")
        assert beta is not None
        assert (beta.status, beta.reason) == (Status.ERROR, "CheckTimeout")
        assert get(url(d, "/healthz")).status == 200


def test_a_hanging_run_is_killed_with_its_process_group(tmp_path: Path) -> None:
    d = child_daemon("hang-run", tmp_path, grace_s=1.0, check_timeout_s=0.5, interval_s=5.0)
    with running(d):
        wait_for((tmp_path / "grandchild.pid").exists, timeout_s=10,
                 what="the child to start its grandchild")
        grandchild = int((tmp_path / "grandchild.pid").read_text())
        assert get(url(d, "/metrics")).status == 200  # serving while the child hangs
        wait_for(lambda: get(url(d, "/report")).status == 200, timeout_s=10,
                 what="the run to be killed")
        report = Report.from_json(get(url(d, "/report")).json_body())
        assert {(r.check, r.status, r.reason) for r in report.results} == {
            ("alpha", Status.ERROR, "RunTimeout"), ("beta", Status.ERROR, "RunTimeout")}
        assert "1.5 s deadline" in report.results[0].message
        wait_for(lambda: not pid_alive(grandchild), timeout_s=5,
                 what="the grandchild to be killed too")


def test_a_child_without_a_report_is_an_error_quoting_its_output(tmp_path: Path) -> None:
    with running(child_daemon("garbage", tmp_path)) as d:
        wait_for(lambda: get(url(d, "/report")).status == 200, timeout_s=15, what="a run")
        report = Report.from_json(get(url(d, "/report")).json_body())
        assert {r.reason for r in report.results} == {"RunFailed"}
        assert "exit code 1" in report.results[0].message


def _busy(snapshot: GpuSnapshot) -> GpuSnapshot:
    gpus = list(snapshot.gpus)
    gpus[2] = dataclasses.replace(gpus[2], compute_pids=(4242,))
    return dataclasses.replace(snapshot, gpus=tuple(gpus))


def test_bandwidth_waits_for_idle_gpus_and_never_overlaps_a_run() -> None:
    snapshot = {"now": _busy(topologies.healthy_8x_h100())}
    runner = FakeRunner(delay_s=0.05)
    d = Daemon(config(interval_s=0.1, bandwidth_interval_s=0.3), runner=runner,
               gpus=lambda: snapshot["now"], known_checks=("shm", "allreduce"))
    assert d.bandwidth  # on by default once an allreduce check exists
    with running(d):
        wait_for(lambda: len(runner.calls) >= 5, timeout_s=5, what="node runs")
        assert RunKind.BANDWIDTH not in runner.calls  # a job holds GPU 2
        m = samples(get(url(d, "/metrics")).text)
        assert m["preflight_allreduce_last_run_timestamp_seconds"] == 0
        snapshot["now"] = topologies.healthy_8x_h100()
        wait_for(lambda: runner.calls.count(RunKind.BANDWIDTH) >= 2, timeout_s=5,
                 what="two bandwidth runs once the GPUs are idle")
        m = samples(get(url(d, "/metrics")).text)
        assert m["preflight_allreduce_bus_bandwidth_bytes_per_second"] == 370e9
        assert m["preflight_allreduce_link_efficiency_ratio"] == 0.82
        assert m['preflight_check_status{check="allreduce",status="pass"}'] == 1
        assert m['preflight_check_status{check="shm",status="pass"}'] == 1
    assert runner.max_active == 1
    spans = sorted((start, end) for _, start, end in d.history)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    # its own, longer interval: far fewer bandwidth runs than node runs
    assert runner.calls.count(RunKind.BANDWIDTH) < runner.calls.count(RunKind.NODE) / 2


def test_no_nvml_means_no_bandwidth_test() -> None:
    runner = FakeRunner()
    d = Daemon(config(interval_s=0.05, bandwidth_interval_s=0.05), runner=runner,
               gpus=topologies.no_driver, known_checks=("shm", "allreduce"))
    with running(d):
        wait_for(lambda: len(runner.calls) >= 4, timeout_s=5, what="node runs")
    assert RunKind.BANDWIDTH not in runner.calls


def test_exclusive_compute_mode_means_no_periodic_bandwidth_test() -> None:
    """On GPUs in EXCLUSIVE_PROCESS mode a job starting during the test could not get its GPU."""
    snap = topologies.healthy_8x_h100()
    gpus = tuple(dataclasses.replace(g, compute_mode="EXCLUSIVE_PROCESS") for g in snap.gpus)
    runner = FakeRunner()
    d = Daemon(config(interval_s=0.05, bandwidth_interval_s=0.05), runner=runner,
               gpus=lambda: dataclasses.replace(snap, gpus=gpus),
               known_checks=("shm", "allreduce"))
    with running(d):
        wait_for(lambda: len(runner.calls) >= 4, timeout_s=5, what="node runs")
    assert RunKind.BANDWIDTH not in runner.calls


def test_listen_binds_exactly_the_address_given() -> None:
    """127.0.0.2 is loopback too on Linux: a daemon told 127.0.0.2 must not answer on 127.0.0.1."""
    d = Daemon(config(listen="127.0.0.2:0"), runner=FakeRunner(), known_checks=KNOWN,
               bandwidth=False)
    with running(d):
        host, port = d.address
        assert host == "127.0.0.2"
        assert get(url(d, "/healthz")).status == 200
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.settimeout(2)
            s.connect(("127.0.0.1", port))


def test_reload_keeps_the_old_config_when_the_new_one_is_bad() -> None:
    from preflight.core.config import ConfigError

    answers: list[Config | Exception] = [ConfigError("x.yaml: interval_s must be > 0, got -1"),
                                         config(interval_s=7.0)]

    def load() -> Config:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with running(Daemon(config(), load_config=load, runner=FakeRunner(), known_checks=KNOWN,
                        bandwidth=False)) as d:
        assert d.reload() is False
        assert d.config.interval_s == 0.3
        assert samples(get(url(d, "/metrics")).text)["preflight_config_reload_success"] == 0
        assert d.reload() is True
        assert d.config.interval_s == 7.0
        assert samples(get(url(d, "/metrics")).text)["preflight_config_reload_success"] == 1


@given(st.text(max_size=30))
def test_parse_listen_never_raises_anything_but_valueerror(text: str) -> None:
    try:
        host, port = parse_listen(text)
    except ValueError as exc:
        assert "listen address" in str(exc)
    else:
        assert host and 0 <= port <= 65535


def test_parse_listen_examples() -> None:
    assert parse_listen("127.0.0.1:9857") == ("127.0.0.1", 9857)
    assert parse_listen("[::1]:9857") == ("::1", 9857)
    assert parse_listen("0.0.0.0:0") == ("0.0.0.0", 0)
    for bad in ("9857", ":9857", "::1:9857", "host:99999", "host:port"):
        with pytest.raises(ValueError):
            parse_listen(bad)


@pytest.mark.parametrize("abstract", [False, True])
def test_sd_notify_sends_one_datagram(tmp_path: Path, abstract: bool) -> None:
    name = f"\0preflight-test-{os.getpid()}" if abstract else str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(name)
        sock.settimeout(2)
        address = "@" + name[1:] if abstract else name
        assert sd_notify("READY=1", {"NOTIFY_SOCKET": address}) is True
        assert sock.recv(100) == b"READY=1"
    assert sd_notify("READY=1", {}) is False
    assert sd_notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False


def test_check_runs_yield_the_cpu_to_the_node_s_job(tmp_path: Path) -> None:
    """The check process runs at CHILD_NICE above the daemon: a training job's data loaders and
    the daemon's own scrapes come first."""
    from preflight.daemon import CHILD_NICE

    def argv(kind: RunKind, cfg: Config) -> list[str]:
        return [sys.executable, str(FAKE_CHILD), "nice"]

    runner = ChildRunner(argv_for=argv, env={**os.environ, "PYTHONPATH": str(REPO)}, grace_s=10)
    report = runner(RunKind.NODE, config(), list(KNOWN))
    beta = report.result("beta")
    assert beta is not None, report
    assert beta.message == f"nice {min(19, os.nice(0) + CHILD_NICE)}"


def test_a_stop_while_a_check_run_starts_kills_it_and_no_run_starts_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child exists before Popen returns: a stop in that window must still kill it (it runs
    in a session of its own and would outlive the daemon), and no later run may start."""
    import subprocess

    from preflight.daemon import child

    real = subprocess.Popen
    started: list[int] = []
    in_popen = threading.Event()

    def slow_popen(*a: object, **k: object) -> subprocess.Popen[bytes]:
        proc = real(*a, **k)  # type: ignore[call-overload]
        started.append(proc.pid)
        in_popen.set()
        time.sleep(0.5)  # the window: the child runs, the runner has not recorded it
        return proc  # type: ignore[no-any-return]

    monkeypatch.setattr(child.subprocess, "Popen", slow_popen)
    runner = ChildRunner(argv_for=lambda kind, cfg: ["sleep", "30"], grace_s=30)
    got: list[Report] = []
    t = threading.Thread(target=lambda: got.append(runner(RunKind.NODE, config(), list(KNOWN))))
    t0 = time.monotonic()
    t.start()
    assert in_popen.wait(10)
    runner.kill()
    t.join(20)
    assert not t.is_alive() and time.monotonic() - t0 < 10  # not the child's 30 s
    assert not pid_alive(started[0])
    again = runner(RunKind.NODE, config(), list(KNOWN))
    assert len(started) == 1 and "the daemon is stopping" in again.results[0].message
