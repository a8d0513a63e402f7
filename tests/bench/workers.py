"""Finding the GPU workers among processes, as a person would with ps: by the worker script on
their command line, and their rank from the plan there."""

from __future__ import annotations

import json

import psutil

from preflight.bench.procs import WORKER_SCRIPT


def plan_of(proc: psutil.Process) -> dict[str, object] | None:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return None
    if str(WORKER_SCRIPT) not in cmd or "--plan" not in cmd:
        return None
    plan = json.loads(cmd[cmd.index("--plan") + 1])
    return plan if isinstance(plan, dict) else None


def workers(parent: int | None = None) -> list[psutil.Process]:
    """The GPU workers among ``parent``'s descendants (default: this process's)."""
    root = psutil.Process(parent) if parent is not None else psutil.Process()
    return [p for p in root.children(recursive=True) if plan_of(p) is not None]


def rank(parent: int | None, r: int) -> psutil.Process | None:
    """The worker of all-reduce rank ``r`` (or speed worker ``r``)."""
    for p in workers(parent):
        plan = plan_of(p) or {}
        ar = plan.get("allreduce")
        found = ar.get("rank") if isinstance(ar, dict) else None
        if found == r:
            return p
    return None
