"""The time of ``preflight ddp`` step by step, beside the field guide's bare script under torchrun.

Each run is a fresh ``python -m preflight ddp --json`` (as a person runs it); its JSON says
where the seconds went: the workers' start-up (interpreter, imports: torch and torch._dynamo,
which DDP imports, the CUDA context), each step's own seconds and phases, the wall time of the
ladder inside preflight. The process's wall time adds preflight's own start (its imports, NVML).
With ``--compare``, the field guide's script (benchmarks/field_guide_ddp.py) under torchrun with
the same number of ranks: the yardstick (target: the ladder <= 2x it). Usage::

    python benchmarks/ddp_ladder.py [--runs 3] [--compare] [--nproc N] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import describe, pythonpath  # benchmarks/machine.py (sys.path[0] is this folder)

REPO = Path(__file__).resolve().parent.parent


def ladder_run(env: dict[str, str], extra: list[str]) -> tuple[float, dict[str, Any], int]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "preflight", "ddp", "--json", *extra], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    wall = time.perf_counter() - t0
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"not JSON (exit {proc.returncode}): {proc.stdout[-500:]!r} "
                         f"{proc.stderr[-2000:]}") from None
    return wall, data, proc.returncode


def torchrun(python: str, nproc: int, env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                           str(REPO / "benchmarks" / "field_guide_ddp.py")], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    wall = time.perf_counter() - t0
    phases = next((line for line in proc.stdout.splitlines() if line.startswith("# phases")),
                  f"(exit {proc.returncode}) {proc.stderr[-300:]!r}")
    return wall, phases


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--compare", action="store_true",
                   help="also time the field guide's script under torchrun")
    p.add_argument("--nproc", type=int, help="ranks (default: preflight ddp's own choice)")
    p.add_argument("--python", default=sys.executable,
                   help="the training environment (the workers' and torchrun's interpreter)")
    a = p.parse_args()
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO)}
    extra = ["--python", a.python, *(["--nproc", str(a.nproc)] if a.nproc else [])]
    walls: list[float] = []
    inner: list[float] = []
    per_step: dict[str, list[float]] = {}
    start: dict[str, list[float]] = {}
    ranks = 0
    status = ""
    for i in range(a.runs):
        wall, data, rc = ladder_run(env, extra)
        print(f"# run {i + 1}: wall {wall:.2f} s, start-up {data.get('start_s')}; " + "; ".join(
            f"{s['name']} {s['status']} {s['seconds']} {s['phase_s']}" for s in data["steps"]
            if s["seconds"] is not None), flush=True)
        walls.append(wall)
        inner.append(float(data["elapsed_s"]))
        ranks = len(data.get("ranks") or [])
        status = f"{data['status']} (layer {data['layer']}, exit {rc})"
        for k, v in (data.get("start_s") or {}).items():
            start.setdefault(k, []).append(float(v))
        for s in data["steps"]:
            if s["seconds"] is not None:
                per_step.setdefault(s["name"], []).append(float(s["seconds"]))
    print(f"# preflight ddp, {a.runs} runs, {ranks} rank(s): {status}")
    print(f"# {describe()}")
    print(f"{'part':<40} {'median_s':>9} {'min_s':>7} {'max_s':>7}")

    def row(name: str, values: list[float]) -> None:
        print(f"{name:<40} {_med(values):>9} {min(values):>7.2f} {max(values):>7.2f}")

    row("process wall (preflight ddp --json)", walls)
    row("ladder inside preflight (elapsed_s)", inner)
    for k, v in start.items():
        row(f"  workers' start-up: {k}", v)
    for k, v in per_step.items():
        row(f"  step {k}", v)
    if a.compare:
        times, phases = [], ""
        for _ in range(a.runs):
            wall, phases = torchrun(a.python, ranks or 1, env)
            times.append(wall)
        row(f"field guide script, torchrun x{ranks or 1}", times)
        print(f"#   its last run: {phases}")
        print(f"# ratio ladder / torchrun (medians): "
              f"{statistics.median(walls) / statistics.median(times):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
