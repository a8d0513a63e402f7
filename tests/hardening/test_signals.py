"""A SIGTERM, SIGHUP or Ctrl-C to a one-shot command (Kubernetes stopping an init container, Slurm
ending a prolog, an operator's Ctrl-C) while the GPU tests' workers run: no worker process, no
directory in TMPDIR stays, and the exit is the one the signal gives. Real workers (the gpu_speed
``cpu`` engine, the all-reduce on gloo), real signals (core/aborting.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from preflight.bench.procs import WORKER_SCRIPT
from preflight.bench.worker.wire import STALL_ENV
from preflight.core import aborting
from preflight.core.procgroup import run_in_group
from tests.gpuspeed.nodes import node
from tests.helpers import REPO, write_fixture

#: One worker program runs both GPU tests.
BENCH_WORKER = SPEED_WORKER = str(WORKER_SCRIPT)


def _workers(script: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if script in (p.info["cmdline"] or []):
            found.append(p)
    return found


def _wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def _stopped(procs: list[psutil.Process]) -> bool:
    try:
        return any(p.status() == psutil.STATUS_STOPPED for p in procs)
    except psutil.Error:
        return False


def _check_with_a_stopped_speed_worker(tmp_path: Path) -> tuple[subprocess.Popen[bytes],
                                                                  list[psutil.Process]]:
    """``preflight check --only gpu_speed`` on a fixture 2-GPU node; GPU 1's worker stops itself
    in d2d (a worker hung in the driver looks the same from outside)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    env.update({"PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path),
                "PREFLIGHT_NVML_FIXTURE": str(write_fixture(tmp_path / "nvml.json", node())),
                "PREFLIGHT_GPU_SPEED_ENGINE": "cpu", STALL_ENV: "0000:00:07.0:d2d"})
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "check", "--only", "gpu_speed"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for("a stopped gpu_speed worker", lambda: _stopped(_workers(SPEED_WORKER)))
    return proc, _workers(SPEED_WORKER)


def _scratch(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("preflight-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_to_check_kills_the_gpu_workers_and_removes_their_directory(
        tmp_path: Path, sig: int) -> None:
    proc, workers = _check_with_a_stopped_speed_worker(tmp_path)
    assert workers and _scratch(tmp_path)
    proc.send_signal(sig)
    rc = proc.wait(20)
    # Killed by SIGTERM / SIGHUP as before (what a prolog's caller reads); Ctrl-C exits 130.
    assert rc == (130 if sig == signal.SIGINT else -sig)
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == []
    assert _scratch(tmp_path) == []


def test_a_killed_check_takes_its_stopped_worker_with_it(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the worker dies with its parent (PR_SET_PDEATHSIG), even while
    stopped, where it could not notice the parent is gone."""
    proc, workers = _check_with_a_stopped_speed_worker(tmp_path)
    proc.kill()
    proc.wait(20)
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == []


_THREADED_BENCH = """
import sys, threading
from preflight.bench.parent import BenchOptions, run_workers
from preflight.core import aborting
opts = BenchOptions(backend="gloo", nproc=2, sizes=(1 << 20,), timeout_s=120, iters=100000,
                    warmup=1)
# As `preflight check` runs the all-reduce: in a daemon thread, the CLI's handler in main.
with aborting.undo_on_signals():
    t = threading.Thread(target=run_workers, args=(opts,), daemon=True)
    t.start()
    t.join(110)
"""


def test_sigterm_during_an_all_reduce_in_a_check_thread_leaves_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", _THREADED_BENCH], env=env)
    try:
        _wait_for("two all-reduce workers",
                  lambda: len([p for p in _workers(BENCH_WORKER)
                               if p.ppid() == proc.pid]) == 2)
        workers = [p for p in _workers(BENCH_WORKER) if p.ppid() == proc.pid]
        time.sleep(1.0)  # importing torch or measuring
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == []
    assert _scratch(tmp_path) == []


# ------------------------------------------------------------------------ the registry itself
@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """abort() is once per process: give each test its own state."""
    monkeypatch.setattr(aborting, "_aborted", threading.Event())
    monkeypatch.setattr(aborting, "_pending", {})


def test_abort_undoes_newest_first_past_a_failing_undo_and_refuses_new_work(fresh: None) -> None:
    done: list[str] = []

    def boom() -> None:
        raise RuntimeError("undo failed")

    aborting.register(lambda: done.append("first"))
    aborting.register(boom)
    kept = aborting.register(lambda: done.append("unregistered"))
    aborting.register(lambda: done.append("last"))
    aborting.unregister(kept)
    aborting.abort()
    assert done == ["last", "first"]
    with pytest.raises(aborting.Aborted):
        aborting.register(lambda: None)
    aborting.abort()  # a second signal: nothing runs twice
    assert done == ["last", "first"]


def test_undo_abandoned_runs_what_is_left_and_allows_more(fresh: None) -> None:
    done: list[int] = []
    aborting.unregister(aborting.register(lambda: done.append(1)))
    aborting.register(lambda: done.append(2))
    aborting.undo_abandoned()
    assert done == [2]
    aborting.register(lambda: done.append(3))
    aborting.undo_abandoned()
    assert done == [2, 3]


def test_abort_kills_a_helper_process_group_and_none_starts_after(fresh: None) -> None:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(
        run_in_group(["sleep", "60"], timeout_s=60).returncode))
    started = time.monotonic()
    t.start()
    _wait_for("the helper", lambda: bool(aborting._pending))
    aborting.abort()
    t.join(40)
    assert got == [-signal.SIGKILL] and time.monotonic() - started < 40  # the helper sleeps 60 s
    with pytest.raises(aborting.Aborted):
        run_in_group(["true"], timeout_s=5)


_STARTING = r"""
import os, signal, subprocess, sys, threading, time
from preflight.core import aborting
kids = []
aborting.register(lambda: [os.killpg(p.pid, signal.SIGKILL) for p in kids])

def start():
    with aborting.starting():
        p = subprocess.Popen(["sleep", "60"], start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(1.0)  # the signal comes while the child is not yet on record
        kids.append(p)
    time.sleep(60)

with aborting.undo_on_signals():
    if sys.argv[1] == "thread":
        t = threading.Thread(target=start, daemon=True)
        t.start()
        t.join()
    else:
        start()
"""


@pytest.mark.parametrize("where", ["thread", "main"])
def test_a_signal_while_a_process_starts_waits_until_its_undo_can_see_it(where: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _STARTING, where], env=env,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        child = psutil.Process(int(proc.stdout.readline()))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM
        assert time.monotonic() - t0 > 0.5  # it waited for the child to be on record
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs([child], timeout=5)
    assert alive == [], "the child started during the signal outlived preflight"
