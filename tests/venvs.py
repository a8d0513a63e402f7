"""A real second interpreter for the versions tests: throwaway venvs with fake installed
distributions (``*.dist-info/METADATA``), a fake ``torch`` package whose ``__init__`` refuses to be
imported (so a test proves torch is read, never imported) and, where a C compiler exists, a real
shared library exporting ``ncclGetVersion``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests import topologies

MakeVenv = Callable[..., Path]

TORCH_VERSION_PY = """\
from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '{version}'
debug = False
cuda: Optional[str] = {cuda!r}
git_version = '{git}'
hip: Optional[str] = None
"""

FAKE_NCCL_C = "int ncclGetVersion(int *version) { *version = %d; return 0; }\n"


def site_packages(root: Path) -> Path:
    return next((root / "lib").glob("python3*/site-packages"))


def add_dist(site: Path, name: str, version: str) -> None:
    """What pip leaves behind for ``name==version``, as far as importlib.metadata reads it."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def build_fake_nccl(directory: Path, code: int) -> Path | None:
    """A real libnccl.so.2 whose ncclGetVersion answers ``code``; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "fake_nccl.c"
    src.write_text(FAKE_NCCL_C % code)
    lib = directory / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    src.unlink()
    return lib


@pytest.fixture(scope="session")
def make_venv(tmp_path_factory: pytest.TempPathFactory) -> MakeVenv:
    """Create (once per distinct spec) a venv with the given fake distributions.

    Keyword args: ``packages`` {name: version}; ``torch`` (version, cuda) to add a torch package
    with a version.py; ``nccl_code`` to put a real libnccl.so.2 into nvidia/nccl/lib.
    """
    made: dict[str, Path] = {}

    def make(*, packages: Mapping[str, str] | None = None,
             torch: tuple[str, str | None] | None = None, nccl_code: int | None = None) -> Path:
        packages = packages or {}
        key = json.dumps([sorted(packages.items()), torch, nccl_code])
        if key in made:
            return made[key]
        root = tmp_path_factory.mktemp("venv")
        venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
        site = site_packages(root)
        for name, version in packages.items():
            add_dist(site, name, version)
        if torch is not None:
            pkg = site / "torch"
            pkg.mkdir()
            (pkg / "__init__.py").write_text(
                "raise ImportError('the fingerprint must not import torch')\n")
            (pkg / "version.py").write_text(TORCH_VERSION_PY.format(
                version=torch[0], cuda=torch[1], git="0123456789abcdef0123456789abcdef01234567"))
            add_dist(site, "torch", torch[0])
        if nccl_code is not None and build_fake_nccl(site / "nvidia/nccl/lib", nccl_code) is None:
            pytest.skip("no C compiler to build a fake libnccl.so.2")
        made[key] = root / "bin" / "python"
        return made[key]

    return make


#: The training venv most tests fingerprint: the article's scikit-learn 1.3.2 node.
NODE_PACKAGES = {"scikit-learn": "1.3.2", "numpy": "1.26.4", "nvidia-nccl-cu12": "2.21.5",
                 "nvidia-cudnn-cu12": "9.1.0.70"}
NODE_TORCH = ("2.4.0+cu121", "12.1")


@pytest.fixture(scope="session")
def node_python(make_venv: MakeVenv) -> Path:
    return make_venv(packages=NODE_PACKAGES, torch=NODE_TORCH)


@pytest.fixture
def nvml_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PREFLIGHT_NVML_FIXTURE naming a healthy 8x H100 node (driver 570.124.06, CUDA 12.8), for
    CLI runs that build their own context."""
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(topologies.healthy_8x_h100().to_json()))
    monkeypatch.setenv("PREFLIGHT_NVML_FIXTURE", str(path))
    return path


def run_cli(*args: str, env: Mapping[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m preflight ARGS`` as a real process (exit codes, stdout/stderr split)."""
    return subprocess.run([sys.executable, "-m", "preflight", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(env) if env is not None else None,
                          check=False)
