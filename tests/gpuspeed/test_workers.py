"""The real GPU workers and their parent, on CPU (the ``cpu`` engine): phases, figures, the go
after every worker is ready, a frozen worker named, nothing left behind; and one worker per rank
running the speed step and then the all-reduce (gloo), as the check does on GPUs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from preflight.bench.options import BenchOptions, RunOptions, SpeedOptions
from preflight.bench.parent import WorkerRun, run_speed
from preflight.bench.session import GpuTests
from preflight.bench.verdict import judge
from preflight.bench.worker.wire import STALL_ENV
from preflight.core.result import Status
from preflight.gpuspeed.probe import Target, WorkerSpeedProbe

TARGETS = (Target("0000:00:06.0", 0, "GPU 0, 0000:00:06.0"),
           Target("0000:00:07.0", 1, "GPU 1, 0000:00:07.0"))


def _gone(pid: int | None) -> bool:
    return pid is None or not psutil.pid_exists(pid) or \
        psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _speed(**changes: object) -> SpeedOptions:
    base: dict[str, object] = dict(bus_ids=tuple(t.bus_id for t in TARGETS), cuda_indices=(0, 1),
                                   labels=tuple(t.label for t in TARGETS), timeout_s=30,
                                   engine="cpu")
    base.update(changes)
    return SpeedOptions(**base)  # type: ignore[arg-type]


def test_two_cpu_workers_report_every_figure_and_phase_time() -> None:
    run = WorkerSpeedProbe(engine="cpu", timeout_s=30).measure(TARGETS)
    assert run.failure is None
    assert [m.bus_id for m in run.measures] == [t.bus_id for t in TARGETS]
    for m in run.measures:
        assert set(m.figures) == {"h2d", "d2h", "d2d", "gemm"}
        assert all(v > 0 for v in m.figures.values())
        assert {"interpreter", "imports", "setup", "h2d", "d2h", "d2d", "gemm"} <= set(m.phase_s)
        assert m.device["engine"] == "cpu"
    assert run.environment["python"]


def test_a_frozen_worker_is_named_with_its_gpu_and_phase_and_nothing_is_left() -> None:
    opts = _speed(timeout_s=30, env={**os.environ, STALL_ENV: "0000:00:07.0:d2d"})
    started = time.monotonic()
    rec = run_speed(opts)
    took = time.monotonic() - started
    assert rec.failure is not None and rec.failure.kind == "stalled"
    assert rec.failure.message.startswith("the worker for GPU 1, 0000:00:07.0 stopped in d2d "
                                          "(process state T"), rec.failure.message
    assert rec.failure.ranks == (1,)
    # "(process state T" above: named by its stopped state, not by the 7.5 s measurement
    # deadline (whose message differs), so the clock only has to show the run did not hang.
    assert took < opts.timeout_s, took
    assert all(_gone(st.pid) for st in rec.workers)


def test_an_interpreter_that_does_not_exist_is_a_spawn_failure() -> None:
    run = WorkerSpeedProbe(python="/nonexistent/python3", engine="cpu").measure(TARGETS[:1])
    assert run.failure is not None and run.failure.kind == "spawn"
    assert run.failure.message == ("cannot start the worker for GPU 0, 0000:00:06.0 with "
                                   "/nonexistent/python3: No such file or directory")


@pytest.mark.skipif(importlib.util.find_spec("cuda") is not None,
                    reason="cuda-bindings is installed here")
def test_an_engine_that_cannot_run_here_says_what_is_missing() -> None:
    run = WorkerSpeedProbe(engine="cuda", timeout_s=30).measure(TARGETS[:1])
    assert run.failure is not None and run.failure.kind == "engine"
    assert run.failure.message == ("the GPU speed test needs cuda-bindings and cuda-pathfinder, "
                                   f"which {run.environment['python']} cannot import")


def test_one_worker_per_rank_measures_its_gpu_then_joins_the_all_reduce() -> None:
    """The check's shared run, with the cpu engine and gloo: the same processes report the
    speed figures and then an exact all-reduce; the speed record comes back before the
    all-reduce is done, and nothing is left at the end."""
    ar = BenchOptions(backend="gloo", nproc=2, sizes=(1 << 20,), timeout_s=60, iters=3, warmup=1,
                      labels=tuple(t.label for t in TARGETS))
    tests = GpuTests()
    tests.expect_allreduce(ar)
    speed = tests.speed(_speed())
    assert speed.failure is None
    assert all(set(st.figures) == {"h2d", "d2h", "d2d", "gemm"} for st in speed.workers)
    speed_pids = [st.pid for st in speed.workers]
    assert all(not _gone(pid) for pid in speed_pids)  # still running: the all-reduce follows
    record = tests.allreduce(ar)
    result = judge(record)
    assert result.status is Status.PASS, result.message
    assert [r.correct for r in result.rows] == [True]
    assert [st.pid for st in record.ranks] == speed_pids
    assert "speed" in result.phase_times_s and list(result.phase_times_s)[-1] == "teardown"
    assert all(_gone(pid) for pid in speed_pids)


def test_the_all_reduce_runs_on_its_own_when_the_speed_step_ended_the_run() -> None:
    ar = BenchOptions(backend="gloo", nproc=2, sizes=(1 << 20,), timeout_s=60, iters=3, warmup=1)
    tests = GpuTests()
    tests.expect_allreduce(ar)
    # 30 s: the whole speed step's deadline, start-up included, which a loaded machine's slow
    # worker start must not reach; the stall itself is named by its stopped state in ~2 s.
    speed = tests.speed(_speed(timeout_s=30, env={**os.environ,
                                                  STALL_ENV: "0000:00:06.0:gemm"}))
    assert speed.failure is not None and speed.failure.kind == "stalled"
    record = tests.allreduce(ar)
    assert record.failure is None and judge(record).status is Status.PASS
    assert not {st.pid for st in record.ranks} & {st.pid for st in speed.workers}


def test_different_interpreters_do_not_share_workers() -> None:
    ar = BenchOptions(backend="gloo", nproc=2, sizes=(4,), timeout_s=60, python="/other/python")
    assert RunOptions.combine(_speed(), ar) is None
    assert RunOptions.combine(_speed(), BenchOptions(backend="gloo", nproc=1, sizes=(4,),
                                                     timeout_s=60)) is None  # GPU 1 is no rank
    both = RunOptions.combine(_speed(), BenchOptions(backend="gloo", nproc=2, sizes=(4,),
                                                     timeout_s=60))
    assert both is not None
    assert [both.plan(i)["bus_id"] for i in (0, 1)] == ["0000:00:06.0", "0000:00:07.0"]
    assert both.plan(1)["speed"] is not None and both.plan(1)["allreduce"]["rank"] == 1


def test_workers_measure_only_after_every_one_is_ready() -> None:
    """The go: no worker measures before the slowest finished its setup (all GPUs at once)."""
    run = WorkerRun(RunOptions(speed=_speed()))
    rec = run.speed()
    assert rec.failure is None
    assert run.go_sent
    assert all(st.speed_times["setup"] >= 0 for st in rec.workers)


def test_a_cpu_only_torch_says_so_instead_of_failing_inside_torch() -> None:
    """The test environment's torch is a CPU build: the torch engine cannot use a GPU, and the
    worker says that in words (it used to fail with torch's internal AttributeError)."""
    from importlib.metadata import version

    torch_version = version("torch")
    if "+cpu" not in torch_version:
        pytest.skip(f"torch {torch_version} is no CPU-only build")
    run = WorkerSpeedProbe(engine="torch", timeout_s=30).measure(TARGETS[:1])
    assert run.failure is not None and run.failure.kind == "engine"
    assert run.failure.message == (
        f"the GPU speed test needs torch, which {run.environment['python']} cannot use here: "
        f"torch {torch_version} cannot use the GPU (a CPU-only build)")
    assert "_cuda" not in run.failure.message and "Traceback" not in run.failure.message


def _gpu_dirs(root: Path, count: int) -> Path:
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    for i in range(count):
        (gpus / f"0000:00:{6 + i:02x}.0").mkdir(parents=True)
    return gpus


def test_workers_started_before_nvml_answers_are_adopted_and_the_extra_one_exits(
        tmp_path: Path) -> None:
    """The driver lists 3 GPUs, 2 are measured: the 2 workers started while NVML was read do the
    work (same processes), the third is told to exit; nothing is left."""
    tests = GpuTests()
    tests.prestart(_gpu_dirs(tmp_path, 3), python=sys.executable, env=None)
    early = tests._early
    assert early is not None and len(early.workers) == 3
    pids = [st.pid for st in early.workers]
    rec = tests.speed(_speed())
    assert rec.failure is None
    assert [st.pid for st in rec.workers] == pids[:2]
    assert all(set(st.figures) == {"h2d", "d2h", "d2d", "gemm"} for st in rec.workers)
    assert all(_gone(pid) for pid in pids)
    assert not list(Path(early.log_dir).parent.glob(Path(early.log_dir).name))


def test_workers_started_for_a_test_that_does_not_run_exit_at_once(tmp_path: Path) -> None:
    tests = GpuTests()
    tests.prestart(_gpu_dirs(tmp_path, 2), python=sys.executable, env=None)
    early = tests._early
    assert early is not None
    pids = [st.pid for st in early.workers]
    t0 = time.monotonic()
    tests.release()
    assert time.monotonic() - t0 < 10
    assert all(_gone(pid) for pid in pids)
    assert [st.proc.returncode for st in early.workers if st.proc] == [0, 0]  # exited, not killed
    tests.prestart(tmp_path / "no-such-dir", python=sys.executable, env=None)
    assert tests._early is None  # no driver listing: nothing started


def test_the_early_start_is_a_config_key(tmp_path: Path, make_ctx) -> None:  # type: ignore[no-untyped-def]
    from preflight.bench.session import gpu_tests
    from preflight.gpuspeed import prestart

    _gpu_dirs(tmp_path, 1)
    off = make_ctx(root=str(tmp_path), gpu_prestart=False)
    prestart(off)
    assert gpu_tests(off)._early is None
    on = make_ctx(root=str(tmp_path))
    prestart(on)
    early = gpu_tests(on)._early
    assert early is not None and len(early.workers) == 1
    gpu_tests(on).release()
    assert all(_gone(st.pid) for st in early.workers)



#: cuda-bindings' driver module, stood in for: a GPU that answers until ``FAIL_AT`` (a call name,
#: and how many calls of it succeed first) fails with CUDA's error ``ERR``.
_DRIVER = """
import enum
FAIL_AT, ERR = {fail_at!r}, {err!r}
ERRORS = {{100: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
           2: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory")}}
calls = {{}}
class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37
def _call(name, *values):
    calls[name] = calls.get(name, 0) + 1
    if FAIL_AT and FAIL_AT[0] == name and calls[name] > FAIL_AT[1]:
        return (ERR,)
    return (0, *values)
def cuInit(flags): return _call("cuInit")
def cuDeviceGetByPCIBusId(bus): return _call("cuDeviceGetByPCIBusId", 0)
def cuDevicePrimaryCtxRetain(dev): return _call("cuDevicePrimaryCtxRetain", 1)
def cuCtxSetCurrent(ctx): return _call("cuCtxSetCurrent")
def cuDeviceGetPCIBusId(n, dev): return _call("cuDeviceGetPCIBusId", b"0000:00:06.0\\0")
def cuStreamCreate(flags): return _call("cuStreamCreate", 7)
def cuDeviceGetAttribute(attr, dev): return _call("cuDeviceGetAttribute", 9)
def cuDeviceGetName(n, dev): return _call("cuDeviceGetName", b"Stand-in GPU\\0")
def cuMemAlloc(nbytes): return _call("cuMemAlloc", 4096)
def cuGetErrorName(err): return (0, ERRORS[int(err)][0].encode())
def cuGetErrorString(err): return (0, ERRORS[int(err)][1].encode())
"""
#: cuda-pathfinder, stood in for: it finds ``CUBLAS`` (a library with cuBLAS's three symbols).
_PATHFINDER = """
import types
CUBLAS = {cublas!r}
class DynamicLibNotFoundError(RuntimeError):
    pass
def load_nvidia_dynamic_lib(name):
    return types.SimpleNamespace(abs_path=CUBLAS)
"""
_CUBLAS_C = "int cublasCreate_v2(void) {return 1;} int cublasSetStream_v2(void) {return 1;} " \
            "int cublasGemmEx(void) {return 1;}\n"


@pytest.mark.parametrize(("fail_at", "err", "phase", "error"), [
    (("cuInit", 0), 100, "CUDA context creation",
     "CUDA cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"),
    # The second buffer of the engine's setup: the engine is half made when it fails.
    (("cuMemAlloc", 1), 2, "setup", "CUDA cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of "
     "memory)"),
])
def test_a_cuda_engine_that_cannot_start_reports_cudas_error(
        tmp_path: Path, fail_at: tuple[str, int], err: int, phase: str, error: str) -> None:
    """The cuda engine on a node without a usable GPU (cuda-bindings stand-ins whose calls
    fail): the worker reports CUDA's own error and where, never an error from cleaning up what
    was never made (without a driver, "'CudaEngine' object has no attribute 'dev'" once hid
    it)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libcublas")
    (tmp_path / "cublas.c").write_text(_CUBLAS_C)
    lib = tmp_path / "libcublas.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "cublas.c")],
                   check=True, timeout=60)
    for pkg in ("cuda", "cuda/bindings", "cuda/pathfinder"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "cuda/pathfinder/__init__.py").write_text(_PATHFINDER.format(cublas=str(lib)))
    (tmp_path / "cuda/bindings/driver.py").write_text(_DRIVER.format(fail_at=fail_at, err=err))
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    rec = run_speed(_speed(bus_ids=(TARGETS[0].bus_id,), cuda_indices=(0,),
                           labels=(TARGETS[0].label,), engine="cuda",
                           env={**os.environ, "PYTHONPATH": path}))
    assert rec.failure is not None and rec.failure.kind == "error", rec.failure
    assert rec.failure.message == f"the worker for GPU 0, 0000:00:06.0 failed in {phase}: {error}"
    assert "AttributeError" not in (rec.workers[0].traceback or "")
    assert all(_gone(st.pid) for st in rec.workers)
