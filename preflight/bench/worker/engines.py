"""What an interpreter can run, and the one choice of engine for each step (stdlib only).

:func:`facts` says what this interpreter can import for the engines, found without importing
them (``importlib.util.find_spec``), and which ``libnccl.so.2`` its own torch would load.
:func:`choose` turns a requested engine into the engines to try, in order, given those facts;
:func:`need` says in words what is missing when nothing fits. The worker calls both for each step
of its plan; the parent calls them before it starts workers (``preflight bench`` SKIPs when
preflight's own interpreter has no engine, the nccl4py engine may drive the training
environment's libnccl, ``preflight cluster`` picks one engine for every node); run as a script
(``python engines.py``) it prints the facts of that interpreter as JSON.

Engines:

* all-reduce: ``nccl4py`` (NVIDIA's NCCL bindings ``nccl.bindings`` with ``cuda.bindings``: no
  torch, the fast path) or ``torch`` (``torch.distributed``: the training environment's own
  torch; gloo on the CPU is always torch). ``auto``: nccl4py when it imports, else torch.
* speed: ``cuda`` (``cuda.bindings`` + cuBLAS found by ``cuda.pathfinder``), ``torch``, or
  ``cpu`` (a plumbing test without a GPU). ``auto``: cuda, then torch if cuda cannot load.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
from typing import Any

ALLREDUCE_ENGINES = ("auto", "torch", "nccl4py")
SPEED_ENGINES = ("auto", "cuda", "torch", "cpu")
#: The import names each engine needs (the first component is what ``facts`` looks for).
NEEDS = {"nccl4py": ("nccl", "cuda.bindings"), "torch": ("torch",),
         "cuda": ("cuda.bindings", "cuda.pathfinder"), "cpu": ()}
WORDS = {"nccl4py": "nccl4py (nccl.bindings and cuda.bindings)", "torch": "torch",
         "cuda": "cuda-bindings and cuda-pathfinder", "cpu": "nothing"}
_MODULES = ("torch", "nccl", "cuda.bindings", "cuda.pathfinder", "nvidia.nccl")


def _origin(name: str) -> str | None:
    """Where ``name`` would be imported from, without running it; None when it would not."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        # A dotted name whose parent is missing raises; a broken parent package too.
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        return spec.origin
    locations = list(spec.submodule_search_locations or ())
    return locations[0] if locations else spec.origin


def _libnccl(modules: dict[str, str | None]) -> str | None:
    """The libnccl.so.2 this environment's torch loads: the nvidia-nccl wheel's, a copy beside
    torch's libraries, else the soname when the loader finds one (LD_LIBRARY_PATH, the system)."""
    candidates = []
    wheel = modules.get("nvidia.nccl")
    if wheel:
        base = wheel if os.path.isdir(wheel) else os.path.dirname(wheel)
        candidates.append(os.path.join(base, "lib", "libnccl.so.2"))
    torch = modules.get("torch")
    if torch:
        candidates.append(os.path.join(os.path.dirname(torch), "lib", "libnccl.so.2"))
    for path in candidates:
        if os.path.isfile(path):
            return path
    try:
        ctypes.CDLL("libnccl.so.2")
    except OSError:
        return None
    return "libnccl.so.2"


def facts(*, libnccl: bool = True) -> dict[str, Any]:
    """``{"python": sys.executable, "modules": {name: origin or None}, "libnccl": path or None}``
    for this interpreter; imports none of the engines. ``libnccl=False`` (the worker itself)
    skips the library search, which may load the system's libnccl."""
    modules = {name: _origin(name) for name in _MODULES}
    return {"python": sys.executable, "modules": modules,
            "libnccl": _libnccl(modules) if libnccl else None}


def has(found: dict[str, Any], engine: str) -> bool:
    modules = found.get("modules") or {}
    return all(modules.get(name) for name in NEEDS[engine])


def choose(step: str, requested: str, found: dict[str, Any], *,
           backend: str = "nccl") -> tuple[str, ...]:
    """The engines to try for ``step`` (``speed`` or ``allreduce``), in order; empty when this
    interpreter can run none of them (:func:`need` says what is missing)."""
    if step == "speed":
        order = {"auto": ("cuda", "torch"), "cuda": ("cuda",), "torch": ("torch",),
                 "cpu": ("cpu",)}[requested]
    elif backend == "gloo" or requested == "torch":
        order = ("torch",)
    else:
        order = {"auto": ("nccl4py", "torch"), "nccl4py": ("nccl4py",)}[requested]
    return tuple(e for e in order if has(found, e))


def need(step: str, requested: str, *, backend: str = "nccl") -> str:
    """What ``step`` needs with ``requested``, in words: "torch or nccl4py (...)"."""
    if step == "speed":
        order = ("cuda", "torch") if requested == "auto" else (requested,)
    elif backend == "gloo" or requested == "torch":
        order = ("torch",)
    else:
        order = ("nccl4py", "torch") if requested == "auto" else (requested,)
    return " or ".join(WORDS[e] for e in order)


class Unavailable(ImportError):
    """An engine that imports but cannot run here (a CPU-only torch, no cuBLAS): the next
    engine of :func:`choose` is tried, and the reason is kept for the message."""


if __name__ == "__main__":
    json.dump(facts(), sys.stdout)
