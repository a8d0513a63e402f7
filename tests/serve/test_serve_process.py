"""A real ``preflight serve`` process: real child runs, signals, systemd notify, promtool."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.serve.conftest import REPO, ServeProcess, get, wait_for

Serve = Callable[..., ServeProcess]
PROMTOOL = shutil.which("promtool")


def first_run(sp: ServeProcess, *, runs: float = 1) -> dict[str, float]:
    wait_for(lambda: sp.metrics()["preflight_runs_total"] >= runs, timeout_s=20,
             what=f"{runs} finished run(s)")
    return sp.metrics()


def test_real_scrape_is_clean_for_promtool(serve: Serve) -> None:
    sp = serve("--listen", "127.0.0.1:0", "--interval", "30")
    m = first_run(sp)
    # The fixture node (8 healthy H100) through the real checks, in a real child.
    assert m['preflight_check_status{check="gpu_visible",status="pass"}'] == 1
    assert m["preflight_gpu_visible"] == 8
    assert m["preflight_gpu_expected"] == 8
    assert m["preflight_shm_size_bytes"] > 0
    assert m["preflight_last_run_timestamp_seconds"] > time.time() - 60
    # the allreduce check exists, but a job holds GPU 0: no bandwidth test
    # The wording of bench.gate.blocker, shared with the allreduce check's SKIP.
    # Logged after the node run is counted (the GPU-use query comes between): wait for it.
    deferred = "bandwidth test deferred: compute processes use the GPUs: GPU 0 (pid 1)"
    wait_for(lambda: deferred in sp.log(), timeout_s=20, what="the deferral in the log")
    assert m["preflight_allreduce_last_run_timestamp_seconds"] == 0
    text = get(f"{sp.url}/metrics").body
    if PROMTOOL is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          timeout=30, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_daemon_never_imports_torch(serve: Serve) -> None:
    """torch loads libtorch*.so and torch/_C; neither may appear in the daemon's memory map."""
    sp = serve("--listen", "127.0.0.1:0", "--interval", "30")
    first_run(sp)
    maps = _mapped_files(sp.proc.pid)
    assert "site-packages" in maps  # the map is readable and lists Python extensions
    assert "libtorch" not in maps
    assert "/torch/" not in maps
    # And in Python terms: building the CLI and a daemon loads no torch module.
    code = ("import sys; from preflight.cli import build_parser; build_parser(); "
            "from preflight.daemon import Daemon; from preflight.core.config import Config; "
            "Daemon(Config()); print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_sigterm_exits_cleanly_and_promptly(serve: Serve, tmp_path: Path) -> None:
    """docs/daemon.md: SIGTERM stops within 2 s on an idle machine; asserted with the margin a
    loaded CI machine needs, far below systemd's 90 s stop timeout."""
    sp = serve("--listen", "127.0.0.1:0", "--interval", "0.2")
    first_run(sp)
    started = time.monotonic()
    sp.proc.send_signal(signal.SIGTERM)
    rc = sp.proc.wait(30)
    took = time.monotonic() - started
    assert rc == 0
    assert took < 10, f"took {took:.2f} s"
    port = int(sp.url.rsplit(":", 1)[1])
    with socket.socket() as s:  # nothing left listening (TIME_WAIT of closed scrapes is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    children = subprocess.run(["pgrep", "-P", str(sp.proc.pid)], capture_output=True,
                              check=False)
    assert children.stdout == b""


def test_sighup_with_a_bad_or_missing_config_keeps_the_old_one(serve: Serve,
                                                              tmp_path: Path) -> None:
    cfg = tmp_path / "preflight.yaml"
    cfg.write_text("interval_s: 0.5\ncheck_timeout_s: 5\n")
    sp = serve("--listen", "127.0.0.1:0", "--config", str(cfg))
    first_run(sp)
    assert sp.metrics()["preflight_config_reload_success"] == 1

    cfg.write_text("interval_s: -3\n")  # invalid
    sp.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: sp.metrics()["preflight_config_reload_success"] == 0, timeout_s=5,
             what="the reload to fail")
    assert "interval_s must be a finite number in 0.001..604800 s, got -3.0" in sp.log()
    assert "keeping the previous config" in sp.log()
    # Still running on the old config (every 0.5 s), and its children still judge the node:
    runs = sp.metrics()["preflight_runs_total"]
    first_run(sp, runs=runs + 2)
    assert sp.metrics()['preflight_check_errors_total{check="shm"}'] == 0

    cfg.unlink()  # disappears
    sp.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "cannot read config file" in sp.log(), timeout_s=5, what="the reload log")
    assert sp.metrics()["preflight_config_reload_success"] == 0

    cfg.write_text("interval_s: 0.5\nunknown_key: 1\n")
    sp.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "unknown key 'unknown_key'" in sp.log(), timeout_s=5, what="the reload log")

    cfg.write_text("interval_s: 0.25\n")  # good again
    sp.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: sp.metrics()["preflight_config_reload_success"] == 1, timeout_s=5,
             what="the reload to succeed")
    assert "config reloaded (interval 0.25 s" in sp.log()
    assert sp.proc.poll() is None


def test_systemd_ready_and_watchdog(serve: Serve, tmp_path: Path) -> None:
    """Type=notify: READY=1 once listening, WATCHDOG=1 every half WATCHDOG_USEC."""
    address = f"\0preflight-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(10)
        sp = serve("--listen", "127.0.0.1:0", "--interval", "5",
                   env={"NOTIFY_SOCKET": "@" + address[1:], "WATCHDOG_USEC": "400000"})
        messages = [sock.recv(4096).decode()]
        assert messages[0].startswith("READY=1\n")
        assert f"MAINPID={sp.proc.pid}" in messages[0]
        pings = 0
        deadline = time.monotonic() + 5
        while pings < 3 and time.monotonic() < deadline:
            msg = sock.recv(4096).decode()
            pings += msg == "WATCHDOG=1"
        assert pings >= 3
        sp.proc.send_signal(signal.SIGTERM)
        assert sp.proc.wait(5) == 0
        while True:  # the last datagram says it is stopping
            msg = sock.recv(4096).decode()
            if msg != "WATCHDOG=1":
                break
        assert msg == "STOPPING=1"


def test_an_address_in_use_is_a_clear_error(serve: Serve) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sp = serve("--listen", f"127.0.0.1:{port}", wait_listening=False)
        assert sp.proc.wait(30) == 2
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in sp.log()
    assert "Traceback" not in sp.log()


@pytest.mark.parametrize("listen", ["9857", "localhost:http", "[::1:9857"])
def test_a_bad_listen_value_exits_2(serve: Serve, listen: str) -> None:
    sp = serve("--listen", listen, wait_listening=False)
    assert sp.proc.wait(30) == 2
    assert "listen" in sp.log()
    assert "Traceback" not in sp.log()
