"""A real ``preflight serve`` process against hostile configs, signals, stuck NVML and a client
holding connections at the fd limit (issue #11 points 1 and 5)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from preflight.core.config import Config
from preflight.core.result import Report, Result, Status
from preflight.daemon import Daemon, RunKind, running
from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.hardening.test_hostile_config import BOMB
from tests.serve.conftest import REPO, ServeProcess, fixture_file, get, wait_for

Serve = Callable[..., ServeProcess]

HOSTILE = {
    "not-utf8": b"interval_s: 0.5\n# \xff\xfe\n",
    "nested-10000": b"a: " + b"[" * 10000 + b"]" * 10000 + b"\n",
    "5000-digit-int": b"expect_gpus: " + b"9" * 5000 + b"\n",
    "alias-bomb": BOMB.encode(),
    "inf-interval": b"interval_s: .inf\n",
    "1e300-timeout": b"check_timeout_s: 1e300\n",
    # YAML's own escapes: a value that would clear the terminal of whoever tails the log.
    "escape-in-value": b'interval_s: "\\e[2J\\a\\nforged"\n',
    "escape-in-key": b'"bad\\e[2J\\nkey": 1\n',
}
#: What must never reach a log line raw: C0 (newline included: it forges a second line), DEL, C1.
RAW_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _more_failures(sp: ServeProcess, before: int) -> bool:
    return sp.log().count("config reload failed") > before


def test_sighup_with_any_hostile_config_keeps_the_old_one(serve: Serve, tmp_path: Path) -> None:
    cfg = tmp_path / "preflight.yaml"
    cfg.write_text("interval_s: 0.5\ncheck_timeout_s: 5\n")
    sp = serve("--listen", "127.0.0.1:0", "--config", str(cfg))
    wait_for(lambda: sp.metrics()["preflight_runs_total"] >= 1, timeout_s=20, what="a run")
    for name, data in [*HOSTILE.items(), ("fifo", None)]:
        cfg.unlink()
        if data is None:
            os.mkfifo(cfg)  # nobody writes it: a read would block for ever
        else:
            cfg.write_bytes(data)
        lines_before = len(sp.log().splitlines())
        failed_before = sp.log().count("config reload failed")
        sp.proc.send_signal(signal.SIGHUP)
        wait_for(functools.partial(_more_failures, sp, failed_before),
                 timeout_s=10, what=f"the reload of {name} to fail")
        new = sp.log().splitlines()[lines_before:]
        assert sum("config reload failed" in line for line in new) == 1, (name, new)
        assert all(len(line) < 700 and not RAW_CONTROL.search(line) for line in new), name
        assert "Traceback" not in sp.log()
        assert sp.metrics()["preflight_config_reload_success"] == 0, name
        assert sp.proc.poll() is None
        # restore a good file so the next case starts from success
        cfg.unlink()
        cfg.write_text("interval_s: 0.5\ncheck_timeout_s: 5\n")
        sp.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: sp.metrics()["preflight_config_reload_success"] == 1, timeout_s=10,
                 what="the good config to reload")
    runs = sp.metrics()["preflight_runs_total"]
    wait_for(lambda: sp.metrics()["preflight_runs_total"] >= runs + 2, timeout_s=20,
             what="runs to continue on the old config")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_starting_with_a_hostile_config_exits_2_with_one_line(tmp_path: Path, name: str) -> None:
    cfg = tmp_path / "preflight.yaml"
    cfg.write_bytes(HOSTILE[name])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "preflight", "serve", "--listen",
                           "127.0.0.1:0", "--config", str(cfg)], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr  # not 1: systemd would restart it for ever
    assert proc.stderr.count("\n") == 1 and "configuration error" in proc.stderr, proc.stderr
    assert not RAW_CONTROL.search(proc.stderr.rstrip("\n")), proc.stderr


class _Canned:
    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report:
        return Report(results=tuple(Result(c, Status.PASS, "Ok", "fine") for c in expected))

    def kill(self) -> None:
        pass


def test_a_stuck_nvml_query_does_not_freeze_the_loop(tmp_path: Path) -> None:
    """The GPU-use probe blocks on a FIFO nobody writes (a driver call that never returns): node
    runs go on, the bandwidth test is deferred with the reason, /healthz stays ok."""
    fifo = tmp_path / "nvml.fifo"
    os.mkfifo(fifo)
    calls: list[float] = []

    def stuck_gpus() -> GpuSnapshot:
        calls.append(time.monotonic())
        with open(fifo, "rb") as f:  # blocks: no writer
            f.read()
        return topologies.healthy_8x_h100()

    runner = _Canned()
    d = Daemon(Config(listen="127.0.0.1:0", interval_s=0.2, check_timeout_s=0.3,
                      bandwidth_interval_s=0.2), runner=runner, gpus=stuck_gpus,
               known_checks=("alpha", "allreduce"), bandwidth=True)
    try:
        with running(d):
            host, port = d.address
            wait_for(lambda: sum(k is RunKind.NODE for k, _, _ in d.history) >= 5, timeout_s=10,
                     what="five node runs while NVML hangs")
            assert not any(k is RunKind.BANDWIDTH for k, _, _ in d.history)
            assert len(calls) == 1  # one stuck query, not a new thread per loop
            assert get(f"http://{host}:{port}/healthz").status == 200
    finally:
        # release the stuck thread
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)


def test_idle_connections_at_the_fd_limit_cannot_fail_a_run(tmp_path: Path) -> None:
    """A client holds 400 idle connections to a daemon whose fd limit is 200 (systemd's
    LimitNOFILE, scaled down): the child runs still get their pipes, so no RunFailed."""
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    env.update({"PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture_file(tmp_path)),
                "PREFLIGHT_EXPECT_GPUS": "8"})

    if shutil.which("prlimit") is None:
        pytest.skip("prlimit not installed (Debian: util-linux)")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["prlimit", "--nofile=200:200", sys.executable, "-m", "preflight", "--log-level",
             "info", "serve", "--listen", "127.0.0.1:0", "--interval", "0.5"], stdout=log,
            stderr=subprocess.STDOUT, env=env)
    sockets: list[socket.socket] = []
    try:
        found: list[str] = []

        def listening() -> bool:
            m = re.search(r"listening on http://([\d.]+):(\d+)", log_path.read_text())
            if m:
                found[:] = [m.group(1), m.group(2)]
            return bool(m)

        wait_for(listening, timeout_s=20, what="the daemon to listen")
        host, port = found[0], int(found[1])
        wait_for(lambda: "node run:" in log_path.read_text(), timeout_s=20, what="a first run")
        stop = threading.Event()

        def hold() -> None:
            while not stop.is_set() and len(sockets) < 400:
                try:
                    sockets.append(socket.create_connection((host, port), timeout=2))
                except OSError:
                    time.sleep(0.01)

        holder = threading.Thread(target=hold)
        holder.start()
        runs_before = log_path.read_text().count("node run:")
        wait_for(lambda: log_path.read_text().count("node run:") >= runs_before + 3,
                 timeout_s=40, what="three node runs under the connection flood")
        stop.set()
        holder.join()
        text = log_path.read_text()
        assert "RunFailed" not in text, text[-2000:]
        assert text.count("HTTP connections at once") == 1  # one warning a minute, not one each
    finally:
        for s in sockets:
            s.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
