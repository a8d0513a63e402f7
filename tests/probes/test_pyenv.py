"""The environment probe: torch/version.py parsing, ncclGetVersion decoding, this interpreter and
a real second one (a throwaway venv) described without importing torch."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.probes import pyenv
from tests.venvs import NODE_PACKAGES, MakeVenv, build_fake_nccl

WATCHED = ["torch", "numpy", "scikit-learn", "deepspeed"]


def test_parse_real_torch_version_py() -> None:
    """The real torch 2.13 CPU wheel's version.py gives what `import torch` would."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch is not installed in this interpreter")
    text = (Path(spec.submodule_search_locations[0]) / "version.py").read_text()
    info = pyenv.parse_torch_version_py(text)
    assert info["__version__"] == importlib.metadata.version("torch")
    assert "cuda" in info
    assert len(info["git_version"]) == 40


def test_parse_takes_only_literals() -> None:
    text = ("import os\n__version__ = '2.4.0+cu121'\ncuda: Optional[str] = '12.1'\n"
            "git_version = os.environ['X']\nhip = None\nunrelated = 'x'\n")
    assert pyenv.parse_torch_version_py(text) == {"__version__": "2.4.0+cu121", "cuda": "12.1",
                                                  "hip": None}
    assert pyenv.parse_torch_version_py("def (:\n") == {}


@given(st.text(max_size=300))
def test_parse_never_raises(text: str) -> None:
    assert isinstance(pyenv.parse_torch_version_py(text), dict)


@pytest.mark.parametrize(("code", "text"), [(22809, "2.28.9"), (21805, "2.18.5"),
                                            (22105, "2.21.5"), (2708, "2.7.8"),
                                            (2604, "2.6.4")])
def test_nccl_version_text(code: int, text: str) -> None:
    assert pyenv.nccl_version_text(code) == text


def test_this_interpreter_without_importing_torch() -> None:
    """In a fresh process: the versions come back and torch is still not in sys.modules."""
    script = ("import json, sys; from preflight.probes import pyenv; "
              "env = pyenv.gather(['torch', 'pytest', 'no-such-dist']); "
              "print(json.dumps([env['packages'], env['torch'].get('__version__'), "
              "'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    import json

    packages, torch_version, imported = json.loads(out)
    assert packages["pytest"] == importlib.metadata.version("pytest")
    assert "no-such-dist" not in packages
    assert imported is False
    if "torch" in packages:
        assert torch_version == packages["torch"]


def test_foreign_interpreter(node_python: Path) -> None:
    """A second interpreter's packages, torch build and wheel versions; its torch/__init__ raises
    on import, so a correct answer proves torch was read, not imported."""
    env = pyenv.gather_foreign(str(node_python), WATCHED, timeout_s=20)
    assert env["packages"] == {"torch": "2.4.0+cu121", "numpy": "1.26.4",
                               "scikit-learn": "1.3.2"}
    assert env["torch"]["__version__"] == "2.4.0+cu121"
    assert env["torch"]["cuda"] == "12.1"
    assert env["prefix"] == str(node_python.parent.parent)
    # No libnccl in this venv: the NCCL wheel's version stands in, and says so.
    assert env["nccl"] == NODE_PACKAGES["nvidia-nccl-cu12"]
    assert env["nccl_source"] == "nvidia-nccl-cu12 wheel metadata"
    assert env["cudnn"] == "9.1.0.70"


def test_foreign_ignores_pythonpath(node_python: Path, tmp_path: Path) -> None:
    """-I: preflight's own PYTHONPATH does not leak packages into the training venv's answer."""
    from tests.venvs import add_dist

    add_dist(tmp_path, "deepspeed", "0.14.0")
    env = pyenv.gather_foreign(str(node_python), WATCHED, timeout_s=20,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert "deepspeed" not in env["packages"]


def test_ncclgetversion_through_ctypes(make_venv: MakeVenv) -> None:
    """A real shared library in nvidia/nccl/lib: its ncclGetVersion wins over the wheel's
    version (it is what torch loads)."""
    python = make_venv(packages={"nvidia-nccl-cu12": "2.21.5"}, nccl_code=22809)
    env = pyenv.gather_foreign(str(python), [], timeout_s=20)
    assert env["nccl"] == "2.28.9"
    assert env["nccl_code"] == 22809
    assert env["nccl_source"].endswith("nvidia/nccl/lib/libnccl.so.2")


def test_system_libnccl_through_ld_library_path(make_venv: MakeVenv, tmp_path: Path) -> None:
    """No NCCL wheel: the library the dynamic loader finds (LD_LIBRARY_PATH of the job)."""
    lib = build_fake_nccl(tmp_path / "lib", 21805)
    if lib is None:
        pytest.skip("no C compiler to build a fake libnccl.so.2")
    python = make_venv(packages={"numpy": "2.0.0"})
    env = pyenv.gather_foreign(str(python), [], timeout_s=20,
                               env={"LD_LIBRARY_PATH": str(lib.parent), "PATH": "/usr/bin"})
    assert (env["nccl"], env["nccl_source"]) == ("2.18.5", "libnccl.so.2")
    bare = pyenv.gather_foreign(str(python), [], timeout_s=20, env={"PATH": "/usr/bin"})
    assert bare["nccl"] is None


def test_missing_interpreter(tmp_path: Path) -> None:
    with pytest.raises(pyenv.PyEnvError, match="does not exist") as err:
        pyenv.gather_foreign(str(tmp_path / "nope" / "python"), WATCHED, timeout_s=5)
    assert err.value.kind == "missing"


def _fake_python(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return exe


def test_broken_interpreter_quotes_stderr(tmp_path: Path) -> None:
    exe = _fake_python(tmp_path, "echo 'ImportError: libpython3.11.so.1.0' >&2; exit 127")
    with pytest.raises(pyenv.PyEnvError, match=r"status 127.*libpython3\.11") as err:
        pyenv.gather_foreign(str(exe), WATCHED, timeout_s=5)
    assert err.value.kind == "broken"


def test_garbage_answer(tmp_path: Path) -> None:
    exe = _fake_python(tmp_path, "echo 'Python 2.7 says hello'")
    with pytest.raises(pyenv.PyEnvError, match="printed no environment description") as err:
        pyenv.gather_foreign(str(exe), WATCHED, timeout_s=5)
    assert err.value.kind == "broken"


def test_hung_interpreter_is_killed(tmp_path: Path) -> None:
    """The deadline holds and the hung process is gone afterwards (nothing left on the node)."""
    pidfile = tmp_path / "pid"
    exe = _fake_python(tmp_path, f"echo $$ > {pidfile}; exec sleep 60")
    t0 = time.monotonic()
    with pytest.raises(pyenv.PyEnvError, match=r"within 0\.5 s") as err:
        pyenv.gather_foreign(str(exe), WATCHED, timeout_s=0.5)
    assert time.monotonic() - t0 < 30  # the interpreter sleeps 60 s; the deadline is 0.5 s
    assert err.value.kind == "timeout"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _pyenv_python(version: str) -> str | None:
    """An interpreter of another minor version, if this machine has one (pyenv); else None."""
    import glob

    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python3")))
    return found[-1] if found else None


@pytest.mark.parametrize("version", ["3.8", "3.13"])
def test_other_python_versions_answer(version: str) -> None:
    python = _pyenv_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    env = pyenv.gather_foreign(python, ["pip", "setuptools"], timeout_s=20)
    assert env["python"].startswith(version + ".")


def test_too_old_python_says_so() -> None:
    python = _pyenv_python("3.7")
    if python is None:
        pytest.skip("no Python 3.7 on this machine")
    with pytest.raises(pyenv.PyEnvError, match=r"Python 3\.7\.\d+ is too old: preflight "
                       r"describes Python >= 3\.8 environments") as err:
        pyenv.gather_foreign(python, ["pip"], timeout_s=20)
    assert err.value.kind == "broken"
