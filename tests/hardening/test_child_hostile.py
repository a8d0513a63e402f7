"""The daemon's check child is untrusted input: a real child script (hostile_child.py) that floods
its output, prints reports of the wrong shape, or leaves grandchildren holding its pipes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from preflight.core.config import Config
from preflight.core.result import Report, Status
from preflight.daemon import ChildRunner, Daemon, RunKind, running
from preflight.daemon.child import MAX_REPORT_BYTES
from preflight.daemon.server import Health, make_server
from tests import topologies
from tests.helpers import REPO
from tests.serve.conftest import get, samples, wait_for

HOSTILE = Path(__file__).with_name("hostile_child.py")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def runner(mode: str, pid_file: Path | None = None, **kwargs: float) -> ChildRunner:
    def argv(kind: RunKind, config: Config) -> list[str]:
        return [sys.executable, str(HOSTILE), mode, *([str(pid_file)] if pid_file else [])]

    return ChildRunner(argv_for=argv, env=ENV, **kwargs)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for init to reap it is dead too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.hardening.test_child_hostile import runner
from tests.helpers import own_peak_rss_bytes
from preflight.core.config import Config
from preflight.daemon import RunKind
report = runner(sys.argv[2])(RunKind.NODE, Config(check_timeout_s=30), ["alpha"])
print(json.dumps({"report": report.to_json(),
                  "peak_rss": own_peak_rss_bytes()}))
"""


def test_a_child_flooding_stdout_is_stopped_and_the_daemon_stays_small() -> None:
    """1.5 GB on stdout grew the daemon to 4.2 GB; now reading stops at the limit."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(REPO), "flood"], env=ENV,
                          capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(proc.stdout)
    result = Report.from_json(out["report"]).results[0]
    assert (result.status, result.reason) == (Status.ERROR, "RunFailed")
    assert f"more than {MAX_REPORT_BYTES} bytes to standard output" in result.message
    # The daemon's code and libraries take ~60 MB; the child's 1.5 GB must not show.
    assert out["peak_rss"] < 200 << 20, out["peak_rss"]


def test_a_child_flooding_stderr_keeps_only_its_tail() -> None:
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(REPO), "flood-stderr"], env=ENV,
                          capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(proc.stdout)
    assert Report.from_json(out["report"]).results[0].reason == "AlphaOk"
    assert out["peak_rss"] < 200 << 20, out["peak_rss"]


@pytest.mark.parametrize(("mode", "words"), [
    ("fingerprint-str", "fingerprint is str, expected an object or null"),
    ("bandwidth-list", "bandwidth is list, expected an object or null"),
    ("details-list", "results[0].details is not an object"),
    ("nan-duration", "results[0].duration_s is not a finite number"),
    ("bad-check-name", "results[0].check is not a check name"),
])
def test_a_report_of_the_wrong_shape_is_a_failed_run_and_every_endpoint_answers(
        mode: str, words: str, caplog: pytest.LogCaptureFixture) -> None:
    d = Daemon(Config(interval_s=60.0, listen="127.0.0.1:0", check_timeout_s=5),
               runner=runner(mode), known_checks=["alpha"], bandwidth=False,
               gpus=topologies.healthy_8x_h100, env=ENV)
    with caplog.at_level(logging.INFO), running(d):
        host, port = d.address
        base = f"http://{host}:{port}"
        wait_for(lambda: get(f"{base}/report").status == 200, timeout_s=20, what="a run")
        for _ in range(3):  # every scrape, not only the first
            metrics = get(f"{base}/metrics")
            assert metrics.status == 200
            assert samples(metrics.text)[
                'preflight_check_status{check="alpha",status="error"}'] == 1
        report = Report.from_json(get(f"{base}/report").json_body())
        result = report.results[0]
        assert (result.check, result.status, result.reason) == ("alpha", Status.ERROR,
                                                                "RunFailed")
        assert words in result.message
    assert "Traceback" not in caplog.text


def test_a_grandchild_that_calls_setsid_and_holds_the_pipe_is_killed_and_the_run_counts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every later run was a RunTimeout: the daemon waited for the end of a pipe that a
    grandchild in its own session kept open. Now reading stops a moment after the child exits,
    whatever holds the pipe is killed, and what the child printed is the run's report."""
    pid_file = tmp_path / "grandchild.pid"
    run = runner("setsid-holder", pid_file, grace_s=30.0)
    for attempt in range(2):
        pid_file.unlink(missing_ok=True)
        with caplog.at_level(logging.WARNING):
            report = run(RunKind.NODE, Config(check_timeout_s=1), ["alpha"])
        assert [(r.status, r.reason) for r in report.results] == [(Status.PASS, "AlphaOk")], \
            (attempt, report.results[0].message)
        grandchild = int(pid_file.read_text())
        wait_for(lambda: not alive(grandchild), timeout_s=10,  # noqa: B023
                 what="the grandchild holding the pipe to be killed")
        assert f"pid {grandchild} (" in caplog.text and "holding its output" in caplog.text


def test_a_grandchild_that_left_the_process_group_dies_with_the_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    report = runner("setpgid-hide", pid_file)(RunKind.NODE, Config(check_timeout_s=1), ["alpha"])
    assert report.results[0].reason == "AlphaOk"
    grandchild = int(pid_file.read_text())
    wait_for(lambda: not alive(grandchild), timeout_s=10, what="the hidden grandchild to die")


def test_a_hanging_child_with_a_setsid_grandchild_is_a_timeout_and_leaves_nothing(
        tmp_path: Path) -> None:
    """The child hangs past its deadline while a grandchild in its own session holds the pipe:
    RunTimeout at the deadline (not later), and both are gone."""
    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.hardening.hostile_child import grandchild\n"
        f"grandchild('os.setsid()', {str(pid_file)!r})\n"
        "time.sleep(600)\n")
    run = ChildRunner(argv_for=lambda kind, config: [sys.executable, str(script)], env=ENV,
                      grace_s=2.0)
    started = time.monotonic()
    report = run(RunKind.NODE, Config(check_timeout_s=1), ["alpha"])
    assert report.results[0].reason == "RunTimeout"
    assert time.monotonic() - started < 30  # the 3 s deadline, not the grandchild's 600 s
    grandchild_pid = int(pid_file.read_text())
    wait_for(lambda: not alive(grandchild_pid), timeout_s=10, what="the grandchild to die")


class _Broken:
    """A Served whose metrics and report raise (a bug of ours, whatever validation missed)."""

    def metrics(self) -> bytes:
        raise TypeError("'str' object is not a mapping")

    def health(self) -> Health:
        return Health(True, "ok\n")

    def report(self) -> Report | None:
        raise ValueError("dictionary update sequence element #0 has length 1")


def test_an_endpoint_that_cannot_render_answers_500_with_one_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    server = make_server("127.0.0.1", 0, _Broken())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        with caplog.at_level(logging.ERROR):
            for path in ("/metrics", "/report", "/metrics"):
                answer = get(f"http://{host}:{port}{path}")
                assert answer.status == 500 and b"internal error" in answer.body
            assert get(f"http://{host}:{port}/healthz").status == 200
    finally:
        server.shutdown()
        server.server_close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 3 and all(r.exc_info is None for r in errors)
    assert "TypeError: 'str' object is not a mapping" in errors[0].getMessage()
