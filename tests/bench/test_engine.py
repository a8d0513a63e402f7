"""On CPU: the engine choice, phase times, a frozen rank named within 5 s in any phase (real gloo
workers, real SIGSTOP), a slow start that says so, nothing left behind on SIGTERM or when the
parent is killed, a loopback-only store; the diagnosis itself as pure functions."""

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
from preflight.bench.diagnosis import FROZEN_SILENT_S, STOPPED_CONFIRM_S, frozen, late
from preflight.bench.options import BenchOptions, Deadlines, Limits, RunOptions
from preflight.bench.parent import run_workers
from preflight.bench.procs import proc_state, stat_state
from preflight.bench.records import RunRecord, WorkerState, progress_order
from preflight.bench.verdict import judge
from preflight.bench.worker import engines
from preflight.core.result import Status
from tests import topologies
from tests.bench.workers import rank as _rank_of
from tests.bench.workers import workers as _workers_of
from tests.helpers import REPO, run_cli, write_fixture

SIZES = (1 << 20, 2 << 20)


def _opts(timeout_s: float = 120.0, **changes: object) -> BenchOptions:
    base = dict(backend="gloo", nproc=2, sizes=SIZES, timeout_s=timeout_s, iters=100, warmup=2,
                env={**os.environ})
    base.update(changes)
    return BenchOptions(**base)  # type: ignore[arg-type]


def _workers(parent: int) -> list[psutil.Process]:
    return _workers_of(parent)


def _rank(parent: int, rank: int) -> psutil.Process | None:
    return _rank_of(parent, rank)


# ----------------------------------------------------------------------------- frozen detection
STEP = {"spawn": "start", "imports": "start", "context": "start", "init": "allreduce",
        "warmup": "allreduce", "measure": "allreduce", "verify": "allreduce", "d2d": "speed"}


def _ranks(*phases: str, size: int | None = None) -> list[WorkerState]:
    return [WorkerState(rank=r, label=f"GPU {r}", reduces=True, step=STEP[p], phase=p,
                        size=size, order=progress_order(STEP[p], p, size, (size or 0,)),
                        entered=0.0, last_beat=0.0, heard=True)
            for r, p in enumerate(phases)]


def test_stopped_state_is_named_after_the_confirmation_not_before() -> None:
    ranks = _ranks("measure", "measure", size=1 << 30)
    for st in ranks:
        st.last_beat = 10.0
    ranks[1].kernel_state = "T"
    assert frozen(ranks, 10.0) is None  # first seen stopped: not yet
    assert frozen(ranks, 10.0 + STOPPED_CONFIRM_S / 2) is None
    f = frozen(ranks, 10.0 + STOPPED_CONFIRM_S)
    assert f is not None and f.kind == "stalled" and f.ranks == (1,)
    assert f.message.startswith("rank 1 (GPU 1) stopped in measure of 1 GiB (process state T")
    assert f.message.endswith("; rank 0 reached measure of 1 GiB")
    ranks[1].kernel_state = "S"  # resumed (SIGCONT): forgotten
    assert frozen(ranks, 20.0) is None
    assert ranks[1].stopped_since is None
    ranks[1].kernel_state, ranks[1].exit_code = "T", -9  # a dead process is not "stopped"
    assert frozen(ranks, 30.0) is None and frozen(ranks, 40.0) is None


def test_silence_while_measuring_is_frozen_but_a_slow_import_is_not() -> None:
    ranks = _ranks("measure", "measure")
    ranks[0].last_beat, ranks[1].last_beat = 100.0, 100.0 - FROZEN_SILENT_S - 0.1
    f = frozen(ranks, 100.0)
    assert f is not None and f.ranks == (1,) and "no heartbeat for 3 s" in f.message
    # The same silence while importing or creating the communicator (init): left to the phase
    # deadline, since a long C call may hold the GIL off the heartbeat thread.
    for phase in ("imports", "context", "init"):
        ranks = _ranks(phase, phase)
        ranks[0].last_beat, ranks[1].last_beat = 100.0, 90.0
        assert frozen(ranks, 100.0) is None
    # Everyone silent while measuring: no live witness, so the deadline decides.
    ranks = _ranks("measure", "measure")
    assert frozen(ranks, 100.0) is None


def test_the_rank_behind_is_named_and_the_speed_step_is_judged_per_worker() -> None:
    limits = RunOptions(allreduce=_opts(timeout_s=8.0)).limits()
    assert (limits.init_s, limits.step_s) == (4.0, 2.0)
    ranks = _ranks("measure", "init", size=1 << 20)
    ranks[1].size = None
    for st in ranks:
        st.last_beat = 100.0
    f = late(ranks, limits, 100.0, {"allreduce": 0.0})
    assert f is not None and f.kind == "stalled" and f.ranks == (1,)
    assert f.message.startswith("rank 1 (GPU 1) stalled in init after 100 s; rank 0 reached ")
    # One GPU stuck in its device copy while the other measured it long ago.
    speed = Limits(start_s=15.0, speed_setup_s=15.0, speed_measure_s=7.5, speed_total_s=30.0)
    workers = [WorkerState(rank=r, label=f"GPU {r}", measures=True, step="speed", phase=p,
                           order=progress_order("speed", p, None, ()), entered=0.0,
                           last_beat=9.0, heard=True) for r, p in enumerate(("gemm", "d2d"))]
    workers[0].entered = 8.5
    f = late(workers, speed, 9.0, {"speed": 0.0})
    assert f is not None and f.ranks == (1,) and f.kind == "stalled"
    assert f.message.startswith("the worker for GPU 1 stalled in d2d after 9.0 s (deadline "
                                "7.5 s) (heartbeats still arrive")
    assert late(workers, speed, 7.0, {"speed": 0.0}) is None


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
def test_sigstop_named_within_15_s_in_any_phase(when: str) -> None:
    """The step deadline here is 30 s: only the stop itself (seen in the kernel's process state
    within about 2 s) can make the verdict come in 15 s, which a loaded machine still meets."""
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
    assert "(process state T" in result.message  # named by the stop, not by a deadline
    assert took < 15, f"named {took:.1f} s after the stop (step deadline 30 s)"
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE


# ------------------------------------------------------------------------------- slow start
def test_deadline_while_importing_says_so(tmp_path: Path) -> None:
    """A 'torch' that takes 60 s to import (cold NFS): an ERROR that says the workers were still
    starting, not a hang to drain the node for."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    # 10 s: a start-up deadline of 5 s, by which even a loaded machine has started the
    # interpreter (else the message would say it had not), while the import still sleeps.
    result = judge(run_workers(_opts(timeout_s=10.0, env=env)))
    assert result.status is Status.ERROR and result.reason == "WorkerStartSlow", result.message
    assert "still starting after" in result.message
    assert "still importing torch / nccl4py / cuda-bindings" in result.message
    assert "hang" not in result.message and "Xid" not in result.remedy


def test_interpreter_that_never_starts_says_so(tmp_path: Path) -> None:
    slow = tmp_path / "slowpython"
    slow.write_text(f"#!/bin/sh\nsleep 60\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    result = judge(run_workers(_opts(timeout_s=4.0, python=str(slow))))
    assert result.reason == "WorkerStartSlow", result.message
    assert "the interpreter has not started the worker yet" in result.message


def test_all_ranks_alive_in_one_step_past_its_deadline_is_a_hang() -> None:
    ranks = _ranks("measure", "measure", size=4)
    for st in ranks:
        st.last_beat = 99.0
    limits = RunOptions(allreduce=_opts(timeout_s=8.0)).limits()
    f = late(ranks, limits, 100.0, {"allreduce": 0.0})
    assert f is not None and f.kind == "hung" and "the collective itself hangs" in f.message


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


def _have(*names: str) -> dict[str, object]:
    return {"modules": {n: f"/site/{n}" for n in names}}


def test_one_choice_of_engine_from_what_the_interpreter_has() -> None:
    """The worker and the parent ask the same function (preflight/bench/worker/engines.py)."""
    both, torch_only, none = _have("nccl", "cuda.bindings", "torch"), _have("torch"), _have()
    assert engines.choose("allreduce", "auto", both) == ("nccl4py", "torch")
    assert engines.choose("allreduce", "auto", torch_only) == ("torch",)
    assert engines.choose("allreduce", "auto", both, backend="gloo") == ("torch",)
    assert engines.choose("allreduce", "nccl4py", torch_only) == ()
    assert engines.need("allreduce", "auto") == \
        "nccl4py (nccl.bindings and cuda.bindings) or torch"
    cuda = _have("cuda.bindings", "cuda.pathfinder")
    assert engines.choose("speed", "auto", cuda) == ("cuda",)
    assert engines.choose("speed", "auto", torch_only) == ("torch",)
    assert engines.choose("speed", "cpu", none) == ("cpu",)
    assert engines.need("speed", "auto") == "cuda-bindings and cuda-pathfinder or torch"
    # This interpreter, as the worker sees itself (torch 2.13 CPU is installed for the tests).
    here = engines.facts()
    assert here["python"] == sys.executable and here["modules"]["torch"]


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
        if len(_workers(parent.pid)) == 2 and list(tmp_path.glob("preflight-gpu-*")):
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
    assert _gone(workers, 15)
    assert list(tmp_path.glob("preflight-gpu-*")) == []


def test_a_stopped_worker_does_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    parent = _start_parent(tmp_path)
    workers = _workers(parent.pid)
    w1 = _rank(parent.pid, 1)
    assert w1 is not None
    # Its heartbeat thread starts right after PR_SET_PDEATHSIG: once there are two threads, the
    # kernel kills it with its parent (a clock could not tell that on a loaded machine).
    for _ in range(6000):
        if w1.num_threads() >= 2:
            break
        time.sleep(0.01)
    assert w1.num_threads() >= 2, "rank 1 never started its heartbeat"
    w1.send_signal(signal.SIGSTOP)
    parent.kill()
    parent.wait(10)
    assert _gone(workers, 15), [p.pid for p in workers if p.is_running()]


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
