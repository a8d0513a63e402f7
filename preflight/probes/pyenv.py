"""What a Python environment holds, read without ``import torch``: versions of Python, torch (its
CUDA build), NCCL, cuDNN and a watched list of distributions.

Why without importing torch: ``import torch`` costs seconds and initialises CUDA libraries; the
``versions`` check must decide in well under 300 ms and must not touch the GPUs. Sources instead:

* ``torch/version.py`` (found with ``importlib.util.find_spec``, which locates but does not import
  the package), parsed with :mod:`ast`: it assigns ``__version__``, ``cuda``, ``git_version``...
  as literals, so nothing of torch is executed.
* ``importlib.metadata.distribution(name)`` for each watched name only (a scan of every installed
  distribution is slow on a big site-packages).
* ``ncclGetVersion`` through :mod:`ctypes` from ``libnccl.so.2`` of the ``nvidia-nccl-cu*`` wheel
  (the one a pip torch loads through its RPATH), else the system's; it returns an int such as
  22809 = 2.28.9 (NCCL_VERSION_CODE, nccl.h). Without a loadable library: the wheel's version,
  else None.

This module is deliberately **stdlib-only and Python 3.8 compatible at run time**: when the
training environment is another interpreter (``--python``, config key ``python``), its own source
is run there (``python -I -c <version guard + exec> <source> <json args>``) under a deadline, and
its JSON output read back, so one piece of code describes both this interpreter and a foreign one.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import Any

#: Wheels that ship libnccl.so.2 under ``nvidia/nccl/lib`` (pip torch depends on one of them).
NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
#: Wheels that ship cuDNN; their version is the cuDNN version (e.g. 9.10.2.21).
CUDNN_WHEELS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11")
#: Literal names read from torch/version.py.
TORCH_VERSION_KEYS = ("__version__", "cuda", "git_version", "hip", "rocm", "xpu", "debug")
#: Bytes of stderr quoted when the target interpreter fails.
STDERR_TAIL = 600


class PyEnvError(RuntimeError):
    """The target interpreter could not be run or did not answer as expected.

    Attributes:
        kind: ``missing`` (no such executable), ``timeout`` (deadline passed) or ``broken``
            (it ran but failed or printed no usable answer).
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_torch_version_py(text: str) -> dict[str, Any]:
    """The literal assignments of a ``torch/version.py`` (``__version__``, ``cuda``, ...).

    Only literals are taken (``ast.literal_eval``), so parsing runs none of its code; names whose
    value is not a literal are left out. Returns {} for text that is not valid Python.
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name) or target.id not in TORCH_VERSION_KEYS:
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if literal is None or isinstance(literal, (str, bool, int)):
            found[target.id] = literal
    return found


def nccl_version_text(code: int) -> str:
    """``ncclGetVersion``'s int as text: 22809 -> "2.28.9"; before 2.9 the code was
    major*1000 + minor*100 + patch (2708 -> "2.7.8")."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _distribution(name: str) -> Any:
    import importlib.metadata as md  # imported late: ~10 ms, and only this path needs it

    try:
        return md.distribution(name)
    except md.PackageNotFoundError:
        return None


def _torch_info() -> dict[str, Any]:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return {}
    locations = list(spec.submodule_search_locations or ()) if spec else []
    for location in locations:
        path = os.path.join(location, "version.py")
        try:
            with open(path, encoding="utf-8") as f:
                info = parse_torch_version_py(f.read())
        except (OSError, UnicodeDecodeError):
            continue
        info["path"] = path
        return info
    return {}


def _nccl_candidates(wheels: Sequence[Any], torch_dir: str | None) -> list[str]:
    """libnccl.so.2 files in the order a pip torch would use them: the nvidia-nccl wheel, then a
    copy next to torch's own libraries."""
    paths = [str(d.locate_file("nvidia/nccl/lib/libnccl.so.2")) for d in wheels]
    if torch_dir:
        paths.append(os.path.join(torch_dir, "lib", "libnccl.so.2"))
    return [p for p in paths if os.path.isfile(p)]


def _nccl_get_version(library: str) -> int | None:
    """Call ``ncclGetVersion(int*)`` in ``library``; None when it cannot be loaded or fails.

    ``ncclGetVersion`` only returns a compile-time constant: it starts no CUDA context and
    touches no GPU, so loading the library here is harmless.
    """
    import ctypes  # (only here: most runs find the version without loading the library)

    try:
        lib = ctypes.CDLL(library)
        fn = lib.ncclGetVersion
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    code = ctypes.c_int(0)
    if fn(ctypes.byref(code)) != 0 or code.value <= 0:  # 0 = ncclSuccess
        return None
    return code.value


def gather(watched: Sequence[str]) -> dict[str, Any]:
    """Describe the running interpreter's environment as a JSON-able dict.

    Args:
        watched: distribution names whose versions to report (absent ones are left out).

    Returns:
        ``{"python", "python_implementation", "executable", "prefix", "torch": {...},
        "packages": {name: version}, "nccl", "nccl_code", "nccl_source", "cudnn",
        "cudnn_source", "nccl4py"}``; versions not found are None (``nccl4py``: its version
        when cuda-bindings is installed beside it, so the bench's nccl4py engine can run there).
    """
    packages: dict[str, str] = {}
    dists: dict[str, Any] = {}
    for name in dict.fromkeys([*watched, *NCCL_WHEELS, *CUDNN_WHEELS]):
        dist = _distribution(name)
        if dist is None:
            continue
        dists[name] = dist
        if name in watched:
            packages[name] = str(dist.version)
    torch = _torch_info()
    torch_path = torch.get("path")
    torch_dir = os.path.dirname(torch_path) if torch_path else None

    nccl_wheels = [dists[n] for n in NCCL_WHEELS if n in dists]
    nccl = nccl_code = nccl_source = None
    for library in [*_nccl_candidates(nccl_wheels, torch_dir), "libnccl.so.2"]:
        code = _nccl_get_version(library)
        if code is not None:
            nccl, nccl_code, nccl_source = nccl_version_text(code), code, library
            break
    if nccl is None and nccl_wheels:
        wheel = nccl_wheels[0]
        nccl, nccl_source = str(wheel.version), f"{wheel.metadata['Name']} wheel metadata"

    # Whether this environment can run the bench's nccl4py engine itself (metadata, no import).
    nccl4py_dist, bindings_dist = _distribution("nccl4py"), _distribution("cuda-bindings")
    nccl4py = (str(nccl4py_dist.version) if nccl4py_dist is not None and bindings_dist is not None
               else None)

    cudnn = cudnn_source = None
    for name in CUDNN_WHEELS:
        if name in dists:
            cudnn, cudnn_source = str(dists[name].version), f"{name} wheel metadata"
            break
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "torch": torch,
        "packages": packages,
        "nccl": nccl,
        "nccl_code": nccl_code,
        "nccl_source": nccl_source,
        "cudnn": cudnn,
        "cudnn_source": cudnn_source,
        "nccl4py": nccl4py,
    }


#: Run first in the target interpreter, in syntax even Python 2 parses, so that a too-old
#: interpreter says so plainly instead of failing on this module's syntax or imports.
_BOOT = """\
import sys
if sys.version_info < (3, 8):
    sys.stderr.write("Python %s is too old: preflight describes Python >= 3.8 environments"
                     % sys.version.split()[0])
    sys.exit(3)
source = sys.argv.pop(1)
exec(compile(source, "<preflight pyenv probe>", "exec"), {"__name__": "__main__"})
"""


def _source() -> str:
    with open(__file__, encoding="utf-8") as f:
        return f.read()


def gather_foreign(python: str, watched: Sequence[str], *, timeout_s: float,
                   env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:func:`gather` run inside another interpreter (the training venv's ``python``).

    ``-I`` isolates it from PYTHONPATH, the user site and the current directory, so the answer is
    what that interpreter has installed, not what preflight's own environment adds. ``env`` (the
    job's environment) is passed for LD_LIBRARY_PATH, which decides the system libnccl.

    Raises:
        PyEnvError: the interpreter is missing, passed ``timeout_s``, or gave no valid answer.
    """
    # Imported here: this module's source also runs alone in the foreign interpreter.
    from preflight.core.procgroup import GroupTimeout, run_in_group

    argv = [python, "-I", "-c", _BOOT, _source(), json.dumps(list(watched))]
    try:
        proc = run_in_group(argv, timeout_s=timeout_s, env=env)
    except FileNotFoundError:
        raise PyEnvError(f"python interpreter {python} does not exist", kind="missing") from None
    except PermissionError:
        raise PyEnvError(f"python interpreter {python} is not executable",
                         kind="missing") from None
    except GroupTimeout as exc:
        # Its whole process group is dead: a wrapper script's own children included.
        raise PyEnvError(f"{python} did not describe its environment within {timeout_s:g} s "
                         f"(killed its process group {exc.pgid})", kind="timeout") from None
    except OSError as exc:
        raise PyEnvError(f"cannot run {python}: {exc.strerror or exc}", kind="missing") from None
    stderr = proc.stderr.decode("utf-8", "replace").strip()[-STDERR_TAIL:]
    if proc.returncode != 0:
        raise PyEnvError(f"{python} exited with status {proc.returncode} while describing its "
                         f"environment: {stderr or '(no stderr)'}", kind="broken")
    try:
        data = json.loads(proc.stdout.decode("utf-8", "replace"))
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("packages"), dict):
        raise PyEnvError(f"{python} printed no environment description (stdout "
                         f"{proc.stdout[:200]!r}; stderr {stderr!r})", kind="broken")
    return data


if __name__ == "__main__":  # run by gather_foreign() inside the target interpreter
    json.dump(gather(json.loads(sys.argv[1]) if len(sys.argv) > 1 else []), sys.stdout)
