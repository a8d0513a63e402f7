"""With --python naming a training venv that has no nccl4py, the workers run nccl4py from
preflight's own environment and load the venv's own libnccl.so.2 (which that venv's engines
probe names), so the test exercises the job's NCCL without torch's start; --engine torch keeps
the venv's torch. Real venvs (tests/venvs.py) with a real libnccl.so.2 built here; the engines'
packages are stand-ins, since only whether they import is asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from preflight.bench import plan
from preflight.bench.procs import ENGINES_SCRIPT, WORKER_SCRIPT, interpreter_facts
from preflight.bench.protocol import apply
from preflight.bench.records import WorkerState
from preflight.bench.worker import allreduce, cudadrv, wire
from tests.conftest import MakeCtx
from tests.venvs import MakeVenv, site_packages

TORCH = ("2.11.0+cu130", "13.0")
#: What pip leaves for torch's NCCL: the wheel's metadata and its library.
NCCL_WHEEL = {"nvidia-nccl-cu13": "2.28.9"}


def _packages(root: Path, *names: str) -> None:
    """Importable stand-ins for ``names`` ("cuda.bindings" makes cuda/bindings/)."""
    for name in names:
        pkg = root.joinpath(*name.split("."))
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")


@pytest.fixture
def nccl4py_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This interpreter can import the nccl4py engine's packages."""
    _packages(tmp_path / "here", "nccl", "cuda.bindings")
    monkeypatch.syspath_prepend(str(tmp_path / "here"))


def _venv_lib(python: Path) -> str:
    return str(site_packages(python.parent.parent) / "nvidia/nccl/lib/libnccl.so.2")


def test_the_engines_probe_of_another_interpreter_names_its_own_libnccl(
        make_venv: MakeVenv) -> None:
    venv = make_venv(torch=TORCH, nccl_code=22809, packages=NCCL_WHEEL)
    found = interpreter_facts(str(venv))
    assert found is not None
    assert found["python"] == str(venv)
    assert found["libnccl"] == _venv_lib(venv)
    assert found["modules"]["torch"].startswith(str(site_packages(venv.parent.parent)))
    assert found["modules"]["nccl"] is None
    assert interpreter_facts("/nonexistent/python") is None
    proc = subprocess.run([str(venv), str(ENGINES_SCRIPT)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and '"libnccl"' in proc.stdout


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
    venv = make_venv(torch=TORCH, nccl_code=22809, packages=NCCL_WHEEL)
    _packages(site_packages(venv.parent.parent), "nccl", "cuda.bindings")
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None
    assert (p.options.python, p.options.libnccl) == (str(venv), None)


def test_nothing_to_borrow_leaves_the_venv_to_decide(make_ctx: MakeCtx,
                                                     make_venv: MakeVenv) -> None:
    # No nccl4py here either (the test environment has none): the venv's own interpreter runs
    # the workers, which pick its torch.
    venv = make_venv(torch=TORCH, nccl_code=22809, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None and p.options.libnccl is None
    assert p.options.python == str(venv)


def test_a_venv_whose_libnccl_cannot_load_is_not_borrowed(
        make_ctx: MakeCtx, make_venv: MakeVenv, nccl4py_here: None) -> None:
    # The wheel's metadata but no library: nothing to hand to nccl4py.
    venv = make_venv(torch=TORCH, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None and p.options.libnccl is None
    assert p.options.python == str(venv)


def test_worker_says_when_the_venvs_libnccl_does_not_load(tmp_path: Path) -> None:
    """A libnccl that is no library: a clear error naming it (before nccl4py is imported), not
    a traceback from deep inside nccl4py."""
    bogus = tmp_path / "libnccl.so.2"
    bogus.write_text("not an ELF file")
    with pytest.raises(RuntimeError, match="cannot load the training environment's NCCL"):
        allreduce.import_nccl(str(bogus))


def test_the_worker_script_starts_with_the_standard_library_alone(tmp_path: Path) -> None:
    """``python -S -I``: no site-packages, no PYTHONPATH; the worker still parses its plan (and
    says what it needs)."""
    proc = subprocess.run([sys.executable, "-S", "-I", str(WORKER_SCRIPT), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "--plan" in proc.stdout, proc.stderr


def test_nccl4py_workers_nccl_version_reads_as_nccl_prints_it() -> None:
    """The nccl4py worker reports ncclGetVersion's integer; the parent writes it with the same
    reader as the fingerprint (probes/pyenv.py)."""
    # 2708: before 2.9 the code was major*1000 + minor*100 + patch.
    for code, text in ((22809, "2.28.9"), (21903, "2.19.3"), (2708, "2.7.8")):
        st = WorkerState(rank=0, label="GPU 0")
        apply(st, {"ev": wire.ENGINE, "step": wire.ALLREDUCE, "engine": "nccl4py",
                   "nccl_code": code}, 0.0, (1 << 30,))
        assert st.nccl_version == text and st.engine == "nccl4py"


def test_worker_waits_for_the_parents_release_then_goes() -> None:
    """A finished nccl4py worker exits only once the parent closed its control pipe (every rank
    done), or after its deadline when the parent never does."""
    import os
    import threading
    import time

    r, w = os.pipe()
    try:
        threading.Timer(0.3, os.close, args=(w,)).start()
        t0 = time.monotonic()
        wire.Control(r).wait_release(30.0)
        assert 0.25 <= time.monotonic() - t0 < 15.0  # released by the close, not the 30 s
    finally:
        os.close(r)
    r, w = os.pipe()
    try:
        t0 = time.monotonic()
        wire.Control(r).wait_release(0.2)
        assert 0.15 <= time.monotonic() - t0 < 15.0  # waited, and did not hang
    finally:
        os.close(r)
        os.close(w)


def test_two_control_lines_that_arrive_together_are_both_read() -> None:
    import os

    r, w = os.pipe()
    try:
        os.write(w, wire.control_line(uid="ab") + wire.control_line(go=True))
        control = wire.Control(r)
        assert control.get(wire.UID, 1.0) == "ab"
        assert control.get(wire.GO, 1.0) is True
        with pytest.raises(TimeoutError):
            control.get(wire.PORT, 0.1)
    finally:
        os.close(r)
        os.close(w)


def test_the_ptx_the_driver_compiles_is_package_data_with_every_kernel() -> None:
    """The kernels ship as a file beside the worker (pyproject's package-data) and hold the three
    entry points the worker loads (they ran on H200s: docs/benchmarks.md)."""
    ptx = Path(cudadrv.KERNELS).read_text()
    for name in ("pf_fill", "pf_check", "pf_bf16"):
        assert ptx.count(f".visible .entry {name}(") == 1
    assert ptx.count("{") == ptx.count("}") == 3
    assert "kernels.ptx" in (Path(__file__).parents[2] / "pyproject.toml").read_text()


def test_a_venv_without_torch_is_not_borrowed_for_its_systems_libnccl(
        make_ctx: MakeCtx, make_venv: MakeVenv, nccl4py_here: None) -> None:
    """No torch there, so no NCCL of its own job to test (a libnccl its loader finds is the
    system's): its own workers run, and say what it lacks."""
    venv = make_venv(nccl_code=22809, packages=NCCL_WHEEL)
    p = plan(make_ctx(python=str(venv)), backend="nccl")
    assert p.options is not None and p.options.libnccl is None
    assert p.options.python == str(venv) and p.notes == ()
