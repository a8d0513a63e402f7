"""Issue 14 points 3 and 5 and issue 11's bench parts, on CPU: the engine choice, phase times,
a frozen rank named within 5 s in any phase (real gloo workers, real SIGSTOP), a slow start that
says so, nothing left behind on SIGTERM or when the parent is killed, a loopback-only store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as hst

from preflight.bench import BenchUsageError, plan
from preflight.bench.parent import (
    FROZEN_SILENT_S,
    STOPPED_CONFIRM_S,
    WORKER_SCRIPT,
    BenchOptions,
    Deadlines,
    RankState,
    RunRecord,
    _frozen,
    _stalled,
    proc_state,
    run_workers,
    stat_state,
)
from preflight.bench.verdict import judge
from preflight.core.result import Status
from tests import topologies
from tests.helpers import REPO, run_cli, write_fixture

SIZES = (1 << 20, 2 << 20)


def _opts(timeout_s: float = 120.0, **changes: object) -> BenchOptions:
    base = dict(backend="gloo", nproc=2, sizes=SIZES, timeout_s=timeout_s, iters=100, warmup=2,
                env={**os.environ})
    base.update(changes)
    return BenchOptions(**base)  # type: ignore[arg-type]


def _workers(parent: int) -> list[psutil.Process]:
    out = []
    for child in psutil.Process(parent).children(recursive=True):
        try:
            if str(WORKER_SCRIPT) in child.cmdline():
                out.append(child)
        except psutil.Error:
            continue
    return out


def _rank(parent: int, rank: int) -> psutil.Process | None:
    for p in _workers(parent):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd[cmd.index("--rank") + 1] == str(rank):
            return p
    return None


# ----------------------------------------------------------------------------- frozen detection
def _ranks(*phases: str) -> list[RankState]:
    return [RankState(rank=r, label=f"GPU {r}", phase=p, entered=0.0, last_beat=0.0)
            for r, p in enumerate(phases)]


def test_stopped_state_is_named_after_the_confirmation_not_before() -> None:
    ranks = _ranks("measure", "measure")

    class Proc:
        pid = 4242

        def poll(self) -> None:
            return None

    for st in ranks:
        st.proc = Proc()  # type: ignore[assignment]
        st.last_beat = 10.0
    state = {4242: "T"}
    assert _frozen(ranks, 10.0, state.get) is None  # first seen stopped: not yet
    assert _frozen(ranks, 10.0 + STOPPED_CONFIRM_S / 2, state.get) is None
    f = _frozen(ranks, 10.0 + STOPPED_CONFIRM_S, state.get)
    assert f is not None and f.kind == "stalled" and "process state T" in f.message
    state[4242] = "S"  # resumed (SIGCONT): forgotten
    assert _frozen(ranks, 20.0, state.get) is None
    assert ranks[0].stopped_since is None


def test_silence_past_init_is_frozen_but_a_slow_import_is_not() -> None:
    ranks = _ranks("measure", "measure")
    ranks[0].last_beat, ranks[1].last_beat = 100.0, 100.0 - FROZEN_SILENT_S - 0.1
    f = _frozen(ranks, 100.0, lambda pid: None)
    assert f is not None and f.ranks == (1,) and "no heartbeat for 3 s" in f.message
    # The same silence while importing (spawn) or creating the communicator (init): left to the
    # phase deadline, since a long C call may hold the GIL off the heartbeat thread.
    for phase in ("spawn", "init"):
        ranks = _ranks(phase, phase)
        ranks[0].last_beat, ranks[1].last_beat = 100.0, 90.0
        assert _frozen(ranks, 100.0, lambda pid: None) is None
    # Everyone silent past init: no live witness, so the deadline decides (hung or frozen).
    ranks = _ranks("measure", "measure")
    assert _frozen(ranks, 100.0, lambda pid: None) is None


def test_proc_state_reads_the_kernel() -> None:
    assert proc_state(os.getpid()) in ("R", "S")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(100):
            if proc_state(child.pid) == "T":
                break
            time.sleep(0.01)
        assert proc_state(child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert proc_state(child.pid) is None


@given(comm=hst.text(max_size=20).filter(lambda c: "\x00" not in c),
       state=hst.sampled_from("RSDTtZXI"), rest=hst.text(max_size=40))
def test_stat_state_survives_any_command_name(comm: str, state: str, rest: str) -> None:
    raw = f"4242 ({comm}) {state} 1 4242 4242 0 -1 {rest.replace(')', '')}".encode()
    assert stat_state(raw) == state


@given(hst.binary(max_size=64))
def test_stat_state_never_raises(raw: bytes) -> None:
    got = stat_state(raw)
    assert got is None or (len(got) == 1 and got.isalpha())


@pytest.mark.parametrize("when", ["spawn", "init", "warm-up of 1 MiB", "measure of 2 MiB"])
def test_sigstop_named_within_5_s_in_any_phase(when: str) -> None:
    """The step deadline here is 30 s: only the stop itself can make the verdict come in 5 s."""
    hit = threading.Event()
    records: list[RunRecord] = []
    opts = _opts(iters=400)
    assert Deadlines.from_timeout(opts.timeout_s).step_s == 30

    def progress(where: str) -> None:
        if where == when:
            hit.set()

    t = threading.Thread(target=lambda: records.append(run_workers(opts, on_progress=progress)))
    t.start()
    victim = None
    for _ in range(3000):  # watch the progress, not the clock
        victim = _rank(os.getpid(), 1)
        if victim is not None and (when == "spawn" or hit.is_set()):
            break
        time.sleep(0.01)
    assert victim is not None, f"never saw rank 1 in {when}"
    victim.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    t.join(60)
    took = time.monotonic() - stopped
    result = judge(records[0])
    assert result.status is Status.FAIL and result.reason == "AllreduceStalled", result.message
    assert result.stalled_ranks == (1,)
    assert result.message.startswith("rank 1 (CPU) stopped in ")
    assert took < 5, f"named {took:.1f} s after the stop"
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE


# ------------------------------------------------------------------------------- slow start
def test_deadline_while_importing_says_so(tmp_path: Path) -> None:
    """A 'torch' that takes 60 s to import (cold NFS): an ERROR that says the workers were still
    starting, not a hang to drain the node for."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    result = judge(run_workers(_opts(timeout_s=4.0, env=env)))
    assert result.status is Status.ERROR and result.reason == "WorkerStartSlow", result.message
    assert "still starting after" in result.message
    assert "still importing torch / nccl4py" in result.message
    assert "hang" not in result.message and "Xid" not in result.remedy


def test_interpreter_that_never_starts_says_so(tmp_path: Path) -> None:
    slow = tmp_path / "slowpython"
    slow.write_text(f"#!/bin/sh\nsleep 60\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    result = judge(run_workers(_opts(timeout_s=4.0, python=str(slow))))
    assert result.reason == "WorkerStartSlow", result.message
    assert "the interpreter has not started the worker yet" in result.message


def test_stalled_keeps_naming_a_hang_after_init() -> None:
    ranks = _ranks("measure", "measure")
    for st in ranks:
        st.heard, st.last_beat, st.step = True, 99.0, 3
    f = _stalled(ranks, Deadlines.from_timeout(8), 100.0, 0.0)
    assert f is not None and f.kind == "hung"


# ------------------------------------------------------------------------- engine and phases
def test_engine_choice_and_bad_engine(tmp_path: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(snapshot=topologies.no_driver())
    p = plan(ctx, engine="auto")
    assert p.options is not None and p.options.engine == "torch"  # gloo is torch's
    with pytest.raises(BenchUsageError, match="gloo needs --engine torch"):
        plan(ctx, engine="nccl4py")
    with pytest.raises(BenchUsageError, match="--engine must be one of"):
        plan(ctx, engine="mpi")
    env = {"PREFLIGHT_NVML_FIXTURE": str(write_fixture(tmp_path / "n.json",
                                                       topologies.no_driver()))}
    proc = run_cli(["bench", "--engine", "nccl4py", "--backend", "gloo"], env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "gloo needs --engine torch" in proc.stderr
    proc = run_cli(["bench"], env={**env, "PREFLIGHT_BENCH_ENGINE": "mpi"})
    assert proc.returncode == 2 and "bench_engine" in proc.stderr and "Traceback" not in proc.stderr


def test_worker_auto_engine_follows_what_the_interpreter_has(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(WORKER_SCRIPT.parent))
    try:
        import worker  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    args = worker._parse(["--rank", "0", "--world-size", "2", "--backend", "nccl", "--sizes",
                          "4", "--progress-fd", "1"])
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert worker._pick_engine(args) == "torch"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert worker._pick_engine(args) == "nccl4py"
    args.backend = "gloo"
    assert worker._pick_engine(args) == "torch"


def test_check_runs_only_the_largest_size(make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(snapshot=topologies.healthy_8x_h100())
    full = plan(ctx, backend="nccl", engine="torch")
    short = plan(ctx, backend="nccl", engine="torch", largest_only=True)
    assert full.options is not None and short.options is not None
    assert len(full.options.sizes) == 11 and short.options.sizes == (1 << 30,)


def test_phase_times_in_bench_json(tmp_path: Path) -> None:
    env = {"PREFLIGHT_NVML_FIXTURE": str(write_fixture(tmp_path / "n.json",
                                                       topologies.no_driver()))}
    proc = run_cli(["bench", "--max-bytes", "1M", "--json"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    times = out["phase_times_s"]
    assert list(times) == ["interpreter", "imports", "cuda_context", "nccl_init", "allocation",
                           "warmup", "sweep", "teardown"]
    assert all(v >= 0 for v in times.values())
    assert times["imports"] > 0.05  # torch really was imported
    assert all(v <= out["elapsed_s"] for v in times.values())
    assert out["engine"] == "torch" and out["first_allreduce_s"] > 0


# --------------------------------------------------------------------------- nothing left behind
_PARENT = textwrap.dedent("""
    import os, sys
    from preflight.bench.parent import BenchOptions, run_workers
    opts = BenchOptions(backend="gloo", nproc=2, sizes=(1 << 20,), timeout_s=120, iters=10**6,
                        warmup=1, env=dict(os.environ))
    run_workers(opts)
""")


def _start_parent(tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], env=env)
    for _ in range(3000):
        if len(_workers(parent.pid)) == 2 and list(tmp_path.glob("preflight-bench-*")):
            w1 = _rank(parent.pid, 1)
            if w1 is not None and proc_state(w1.pid) is not None:
                return parent
        time.sleep(0.01)
    parent.kill()
    raise AssertionError("the workers never started")


def _gone(procs: list[psutil.Process], within: float) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=within)
    return not alive


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_kills_workers_and_removes_the_log_dir(tmp_path: Path, sig: int) -> None:
    parent = _start_parent(tmp_path)
    workers = _workers(parent.pid)
    time.sleep(1.0)  # the workers are importing or measuring
    parent.send_signal(sig)
    # SystemExit(128 + 15); an uncaught KeyboardInterrupt re-raises SIGINT on the way out.
    assert parent.wait(20) in (128 + sig, -sig)
    assert _gone(workers, 5)
    assert list(tmp_path.glob("preflight-bench-*")) == []


def test_a_stopped_worker_does_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    parent = _start_parent(tmp_path)
    workers = _workers(parent.pid)
    time.sleep(1.0)  # past the worker's PR_SET_PDEATHSIG
    w1 = _rank(parent.pid, 1)
    assert w1 is not None
    w1.send_signal(signal.SIGSTOP)
    parent.kill()
    parent.wait(10)
    assert _gone(workers, 5), [p.pid for p in workers if p.is_running()]


def test_store_listens_on_loopback_only() -> None:
    seen: list[list[str]] = []
    hit = threading.Event()

    def progress(where: str) -> None:
        if where.startswith("warm-up") and not hit.is_set():
            w0 = _rank(os.getpid(), 0)
            assert w0 is not None
            seen.append([c.laddr.ip for c in w0.net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN])
            hit.set()

    record = run_workers(_opts(), on_progress=progress)
    assert record.failure is None and record.store_port
    assert seen and seen[0], "rank 0 listened on nothing?"
    assert set(seen[0]) == {"127.0.0.1"}, seen


def test_on_done_fires_once_when_every_rank_reported_done() -> None:
    """The allreduce check hands the GPUs to gpu_speed at that moment, before the exits."""
    calls: list[float] = []
    record = run_workers(_opts(nproc=2), on_done=lambda: calls.append(time.monotonic()))
    assert record.failure is None
    assert len(calls) == 1
    assert all(st.phase == "done" for st in record.ranks)


def test_on_done_never_fires_for_a_run_that_fails() -> None:
    calls: list[int] = []
    env = {**os.environ, "PREFLIGHT_BENCH_TEST_CORRUPT_RANK": "1"}
    # A wrong sum still ends with every rank done (the verdict fails, not the run) ...
    record = run_workers(_opts(env=env), on_done=lambda: calls.append(1))
    assert record.failure is None and calls == [1]
    # ... a worker that cannot start never gets there.
    calls.clear()
    record = run_workers(_opts(python="/nonexistent/python"), on_done=lambda: calls.append(1))
    assert record.failure is not None and calls == []
