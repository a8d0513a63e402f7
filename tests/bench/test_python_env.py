"""``--python`` tests the training environment, and only it: preflight installed from its wheel
(not editable) in venv A, which also reaches torch; training venvs B (neither torch nor nccl4py)
and C (torch, no preflight). The workers run under B or C and import nothing from A but their
own standard-library code: under B the all-reduce is an ERROR naming B and what it lacks (it used
to pass on A's torch), under C it runs C's torch, and the JSON says which torch, from where."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.gpuspeed.nodes import node
from tests.helpers import REPO, write_fixture
from tests.venvs import site_packages


def _site_of_this_interpreter() -> Path:
    import psutil  # a dependency of preflight, installed next to torch

    return Path(psutil.__file__).parent.parent


def _bare_venv(root: Path, *, reach: Path | None = None) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    if reach is not None:
        # What this venv can import beyond its own site-packages (after it: its own comes first).
        (site_packages(root) / "zz-reach.pth").write_text(f"{reach}\n")
    return root / "bin" / "python"


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pyenv")
    wheels = base / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels)]
    try:
        import setuptools  # noqa: F401  (build here, without fetching anything)

        build.append("--no-build-isolation")
    except ImportError:
        pass
    copy = base / "src"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info",
                                                              "build", "__pycache__", ".carry"))
    subprocess.run([*build, str(copy)], check=True, timeout=600, capture_output=True)
    wheel = next(wheels.glob("cluster_preflight-*.whl"))
    deps = _site_of_this_interpreter()
    a = _bare_venv(base / "A", reach=deps)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site_packages(base / "A")), str(wheel)], check=True,
                   timeout=300, capture_output=True)
    return {"A": a, "B": _bare_venv(base / "B"), "C": _bare_venv(base / "C", reach=deps),
            "A_site": site_packages(base / "A"), "deps": deps}


def _preflight(venvs: dict[str, Path], *args: str, cwd: Path,
               extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFLIGHT_") and k != "PYTHONPATH"}
    env.update(extra or {})
    # Not from the source tree: the working directory is elsewhere, no PYTHONPATH.
    return subprocess.run([str(venvs["A"]), "-m", "preflight", *args], capture_output=True,
                          text=True, timeout=180, env=env, cwd=cwd, check=False)


def test_preflight_in_venv_a_is_its_installed_copy(venvs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    proc = subprocess.run([str(venvs["A"]), "-c", "import preflight; print(preflight.__file__)"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True)
    assert proc.stdout.strip().startswith(str(venvs["A_site"]))
    worker = venvs["A_site"] / "preflight" / "bench" / "worker"
    assert (worker / "kernels.ptx").is_file() and (worker / "start.py").is_file()


def test_a_training_venv_without_an_engine_is_an_error_naming_it_and_what_it_lacks(
        venvs: dict[str, Path], tmp_path: Path) -> None:
    b = venvs["B"]
    proc = _preflight(venvs, "bench", "--backend", "gloo", "--nproc", "2", "--max-bytes", "1M",
                      "--python", str(b), "--json", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["reason"]) == ("error", "EngineMissing")
    assert out["message"] == f"the all-reduce test needs torch, which {b} cannot import."
    env = out["environment"]
    assert env["python"] == str(b) and env["torch"] is None and env["nccl4py"] is None
    # The table says the same in one line.
    proc = _preflight(venvs, "bench", "--backend", "gloo", "--max-bytes", "1M", "--python",
                      str(b), cwd=tmp_path)
    assert f"# environment: python {b} " in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_training_venv_with_torch_runs_its_own_torch(venvs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    c = venvs["C"]
    theirs = subprocess.run([str(c), "-c", "import torch; print(torch.__file__, "
                             "torch.__version__)"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, check=True).stdout.split()
    proc = _preflight(venvs, "bench", "--backend", "gloo", "--max-bytes", "1M", "--python",
                      str(c), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["engine"]) == ("pass", "torch")
    env = out["environment"]
    assert env["python"] == str(c)
    assert env["torch"] == {"version": theirs[1], "path": theirs[0]}
    assert not env["torch"]["path"].startswith(str(venvs["A_site"]))


def test_the_speed_workers_run_under_the_training_venv_too(venvs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    b = venvs["B"]
    nvml = {"PREFLIGHT_NVML_FIXTURE": str(write_fixture(tmp_path / "nvml.json", node()))}
    proc = _preflight(venvs, "bench", "--gpu", "--gpu-engine", "cpu", "--python", str(b),
                      "--json", cwd=tmp_path, extra=nvml)
    out = json.loads(proc.stdout)
    assert out["environment"]["python"] == str(b), proc.stderr
    assert [g["device"]["engine"] for g in out["gpus"]] == ["cpu", "cpu"]
    proc = _preflight(venvs, "bench", "--gpu", "--python", str(b), "--json", cwd=tmp_path,
                      extra=nvml)
    out = json.loads(proc.stdout)
    assert (out["status"], out["reason"]) == ("skip", "EngineMissing"), proc.stderr
    assert out["message"] == ("no GPU speed test: the GPU speed test needs cuda-bindings and "
                              f"cuda-pathfinder or torch, which {b} cannot import")
    assert str(b) in out["failure"]["message"]
