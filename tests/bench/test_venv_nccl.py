"""Issue 14 point 3: with --python naming a training venv that has no nccl4py, the workers run
nccl4py from preflight's own environment and load the venv's own libnccl.so.2 (found by its
fingerprint), so the test exercises the job's NCCL without torch's start; --engine torch keeps
the venv's torch. Real venvs (tests/venvs.py) with a real libnccl.so.2 built here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.bench import plan
from preflight.bench.parent import WORKER_SCRIPT, RankState, _consume
from tests.conftest import MakeCtx
from tests.venvs import MakeVenv, site_packages

TORCH = ("2.11.0+cu130", "13.0")
#: What pip leaves for torch's NCCL: the wheel's metadata (the fingerprint looks for its file).
NCCL_WHEEL = {"nvidia-nccl-cu13": "2.28.9"}


@pytest.fixture
def nccl4py_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This interpreter can import the engine's packages (stand-ins on sys.path: the plan only
    asks whether they import)."""
    for pkg in ("nccl", "cuda"):
        (tmp_path / "here" / pkg).mkdir(parents=True)
        (tmp_path / "here" / pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "here"))


def _venv_lib(python: Path) -> str:
    return str(site_packages(python.parent.parent) / "nvidia/nccl/lib/libnccl.so.2")


def test_venv_without_nccl4py_gets_its_own_libnccl_through_ours(
        make_ctx: MakeCtx, make_venv: MakeVenv, nccl4py_here: None) -> None:
    venv = make_venv(torch=TORCH, nccl_code=22809, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl", largest_only=True)
    assert p.options is not None
    assert p.options.python == sys.executable
    assert p.options.engine == "nccl4py"
    assert p.options.libnccl == _venv_lib(venv)
    assert any("runs the training environment's NCCL" in n and _venv_lib(venv) in n
               for n in p.notes)


def test_engine_torch_keeps_the_venvs_torch(make_ctx: MakeCtx, make_venv: MakeVenv,
                                            nccl4py_here: None) -> None:
    venv = make_venv(torch=TORCH, nccl_code=22809, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl", engine="torch")
    assert p.options is not None
    assert (p.options.python, p.options.libnccl, p.options.engine) == (str(venv), None, "torch")


def test_venv_with_nccl4py_runs_the_engine_itself(make_ctx: MakeCtx, make_venv: MakeVenv,
                                                  nccl4py_here: None) -> None:
    venv = make_venv(torch=TORCH, nccl_code=22809,
                     packages={**NCCL_WHEEL, "nccl4py": "0.6.0",
                               "cuda-bindings": "13.5.0"})
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None
    assert (p.options.python, p.options.libnccl) == (str(venv), None)


def test_nothing_to_borrow_leaves_the_venv_to_decide(
        make_ctx: MakeCtx, make_venv: MakeVenv, monkeypatch: pytest.MonkeyPatch) -> None:
    # No nccl4py here either: the venv's own interpreter runs the workers (and picks torch).
    import preflight.bench

    monkeypatch.setattr(preflight.bench, "_engine_available", lambda backend, engine: False)
    venv = make_venv(torch=TORCH, nccl_code=22809, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None and p.options.libnccl is None
    assert p.options.python == str(venv)


def test_a_venv_whose_libnccl_cannot_load_is_not_borrowed(
        make_ctx: MakeCtx, make_venv: MakeVenv, nccl4py_here: None) -> None:
    # The wheel's metadata but no loadable library: nothing to hand to nccl4py.
    venv = make_venv(torch=TORCH, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None and p.options.libnccl is None
    assert p.options.python == str(venv)


def test_worker_says_when_the_venvs_libnccl_does_not_load(tmp_path: Path) -> None:
    """The worker's --libnccl with a file that is no library: a clear error on the progress pipe
    (before any CUDA call matters), not a traceback from deep inside nccl4py."""
    bogus = tmp_path / "libnccl.so.2"
    bogus.write_text("not an ELF file")
    sys.path.insert(0, str(WORKER_SCRIPT.parent))
    try:
        import worker  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    with pytest.raises(RuntimeError, match="cannot load the training environment's NCCL"):
        worker._preload(str(bogus))


def test_worker_cli_accepts_libnccl() -> None:
    proc = subprocess.run([sys.executable, str(WORKER_SCRIPT), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "--libnccl" in proc.stdout


def test_nccl4py_workers_nccl_version_reads_as_nccl_prints_it() -> None:
    """The nccl4py worker reports ncclGetVersion's integer; the parent writes it with the same
    reader as the fingerprint (probes/pyenv.py)."""
    # 2708: before 2.9 the code was major*1000 + minor*100 + patch.
    for code, text in ((22809, "2.28.9"), (21903, "2.19.3"), (2708, "2.7.8")):
        st = RankState(rank=0, label="GPU 0")
        line = json.dumps({"ev": "spawned", "pid": 1, "engine": "nccl4py", "nccl_code": code})
        _consume(st, line.encode() + b"\n", (1 << 30,), 0.0, None)
        assert st.nccl_version == text


def test_worker_waits_for_the_parents_release_then_goes() -> None:
    """A finished nccl4py worker exits only once the parent closed its control pipe (every rank
    done), or after its deadline when the parent never does."""
    import os
    import threading
    import time

    sys.path.insert(0, str(WORKER_SCRIPT.parent))
    try:
        import worker
    finally:
        sys.path.pop(0)
    r, w = os.pipe()
    with os.fdopen(r) as stream:
        threading.Timer(0.3, os.close, args=(w,)).start()
        t0 = time.monotonic()
        worker.await_release(stream, 30.0)
        assert 0.25 <= time.monotonic() - t0 < 5.0
    r, w = os.pipe()
    try:
        with os.fdopen(r) as stream:
            t0 = time.monotonic()
            worker.await_release(stream, 0.2)
            assert 0.15 <= time.monotonic() - t0 < 5.0
    finally:
        os.close(w)


def test_the_ptx_the_driver_compiles_is_whole() -> None:
    """The GPU-side fill and check are spliced from shared pieces: both kernels present, every
    piece in place, braces balanced (the PTX itself ran on H200s: docs/benchmarks.md)."""
    sys.path.insert(0, str(WORKER_SCRIPT.parent))
    try:
        import worker
    finally:
        sys.path.pop(0)
    ptx = worker._PTX
    assert "@" not in ptx.replace("@%p", "").replace("@!%p", "")
    assert ptx.count(".visible .entry pf_fill(") == 1
    assert ptx.count(".visible .entry pf_check(") == 1
    assert ptx.count(worker._PTX_INDEX) == 2 and ptx.count(worker._PTX_PATTERN) == 2
    assert ptx.count("{") == ptx.count("}") == 2
