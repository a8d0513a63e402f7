"""Gather a node's fingerprint: the target interpreter's description, the driver, the hashes."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from preflight import __version__
from preflight.core.context import activity
from preflight.probes import pyenv
from preflight.probes.fingerprint.hashing import hash_path
from preflight.probes.gpu import GpuSnapshot

FINGERPRINT_VERSION = 1
#: Keys outside the canonical part (not hashed, not compared).
NON_CANONICAL = frozenset({"sha256", "meta"})
#: Longest the target interpreter may take to describe itself, seconds (also <= 80 % of the
#: check's deadline, so a hang is reported by us, naming the interpreter, not as a CheckTimeout).
PYENV_TIMEOUT_S = 8.0


def _cuda_text(code: int | None) -> str | None:
    """NVML's CUDA driver version int as text: 12080 -> "12.8"."""
    return None if code is None else f"{code // 1000}.{code % 1000 // 10}"


def canonical_sha256(fp: Mapping[str, Any]) -> str:
    """sha256 of the canonical part (everything but ``sha256`` and ``meta``), as sorted JSON."""
    body = {k: v for k, v in fp.items() if k not in NON_CANONICAL}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def build(env: Mapping[str, Any], *, driver: str | None, driver_cuda: int | None,
          hashes: Mapping[str, str], watched: Sequence[str],
          meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Assemble a fingerprint from a :func:`preflight.probes.pyenv.gather` answer and node facts.

    Pure, so tests can build one from data.
    """
    raw_torch = env.get("torch")
    torch: Mapping[str, Any] = raw_torch if isinstance(raw_torch, dict) else {}
    fp: dict[str, Any] = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "python": env.get("python"),
        "python_implementation": env.get("python_implementation"),
        "torch": torch.get("__version__"),
        "torch_git": torch.get("git_version"),
        "cuda": torch.get("cuda"),
        "cudnn": env.get("cudnn"),
        "nccl": env.get("nccl"),
        "driver": driver,
        "driver_cuda": _cuda_text(driver_cuda),
        "packages": dict(sorted((str(k), str(v)) for k, v in env.get("packages", {}).items())),
        "hashes": dict(sorted(hashes.items())),
    }
    fp["sha256"] = canonical_sha256(fp)
    fp["meta"] = {
        "watched": list(watched),
        "executable": env.get("executable"),
        "prefix": env.get("prefix"),
        "torch_version_py": torch.get("path"),
        "nccl_source": env.get("nccl_source"),
        "cudnn_source": env.get("cudnn_source"),
        "nccl4py": env.get("nccl4py"),
        **(meta or {}),
    }
    return fp


def gather(*, python: str | None, watched: Sequence[str], hash_paths: Sequence[str],
           env: Mapping[str, str], timeout_s: float,
           gpus: Callable[[], GpuSnapshot]) -> dict[str, Any]:
    """The fingerprint of a training environment.

    Args:
        python: the target interpreter (``--python``); None for the one running preflight.
        watched: the packages whose versions are recorded.
        hash_paths: files or trees whose sha256 is recorded.
        env: the environment the target interpreter runs with (the job's).
        timeout_s: how long the target interpreter may take to describe itself.
        gpus: the GPU snapshot (for the driver); its errors become notes in ``meta.errors``.

    Raises:
        pyenv.PyEnvError: ``python`` names an interpreter that is missing, hangs or fails.
    """
    watched = list(watched)
    if python:
        with activity(f"{python} describing its environment (deadline {timeout_s:g} s)"):
            described = pyenv.gather_foreign(python, watched, timeout_s=timeout_s, env=env)
    else:
        with activity("reading package metadata and ncclGetVersion"):
            described = pyenv.gather(watched)
    errors: list[str] = []
    driver = driver_cuda = None
    try:
        snap = gpus()
        driver, driver_cuda = snap.driver_version, snap.cuda_driver_version
        if not snap.available and snap.error:
            errors.append(f"driver: {snap.error}")
    except Exception as exc:  # the GPU checks report NVML trouble; the fingerprint goes on
        errors.append(f"driver: {type(exc).__name__}: {exc}")
    hashes = {}
    for path in hash_paths:
        with activity(f"hashing {path}"):
            hashes[path] = hash_path(path)
    return build(described, driver=driver, driver_cuda=driver_cuda, hashes=hashes,
                 watched=watched,
                 meta={"host": socket.gethostname(), "created_s": round(time.time(), 3),
                       "preflight_version": __version__, "errors": errors})
