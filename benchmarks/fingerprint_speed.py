"""How long the environment fingerprint takes: the ``versions`` check must stay well under 300 ms
so that ``preflight check --no-bandwidth`` decides in < 1 s.

Each row is timed in a fresh process (a Slurm prolog starts cold: importlib.metadata, ctypes and
the torch/version.py read are first-time costs), N runs, median / min / max in milliseconds:

* ``gather (this python)``: :func:`preflight.probes.pyenv.gather` over the default watch list.
* ``versions check (runner)``: the whole check through the runner (fixture GPU probe, so NVML
  is excluded).
* ``gather --python``: the same through a subprocess of the interpreter (the ``--python`` path).
* ``hash_path(preflight/)``: sha256 of the package's source tree (~40 files).
* ``cli: check --only versions (all)``: the command as an operator runs it, interpreter start
  and every import included.

Preflight's own imports are not timed in the first four rows (``preflight check`` pays them once
for all checks); the probe's first-time costs are. On a shared machine the minimum is the figure
to quote; the median shows contention.

Usage: python benchmarks/fingerprint_speed.py [--runs 7] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import describe, pythonpath  # benchmarks/machine.py (sys.path[0] is this folder)

REPO = Path(__file__).resolve().parent.parent

#: Each row: (setup, timed). Setup (imports of preflight's own modules, which `preflight check`
#: pays once for all checks) is not timed; the first-time costs of the probe itself are.
TIMED = """
import json, sys, time
{setup}
t0 = time.perf_counter()
{timed}
print(json.dumps((time.perf_counter() - t0) * 1e3))
"""

ROWS = {
    "gather (this python)": ("""
from preflight.core.config import DEFAULT_WATCHED_PACKAGES
from preflight.probes import pyenv
""", "pyenv.gather(list(DEFAULT_WATCHED_PACKAGES))"),
    "versions check (runner)": ("""
from preflight.core.config import Config
from preflight.core.context import Context
from preflight.probes.gpu import FixtureGpuProbe
from preflight.core.runner import run_checks, select
from preflight.checks import CHECKS
from tests import topologies
ctx = Context(config=Config(), env={{}}, gpu_probe=FixtureGpuProbe(topologies.healthy_8x_h100()))
""", """r = run_checks(ctx, select(CHECKS, only=["versions"])).results[0]
assert r.status.word == "pass", r"""),
    "gather --python (subprocess)": ("""
from preflight.core.config import DEFAULT_WATCHED_PACKAGES
from preflight.probes import pyenv
""", "pyenv.gather_foreign({python!r}, list(DEFAULT_WATCHED_PACKAGES), timeout_s=10)"),
    "hash_path(preflight/)": ("from preflight.probes.fingerprint import hash_path",
                              "assert len(hash_path({tree!r})) == 64"),
}


def time_row(setup: str, timed: str, runs: int) -> list[float]:
    out = []
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO)}
    for _ in range(runs):
        code = TIMED.format(setup=setup, timed=timed)
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120, check=True)
        out.append(float(json.loads(proc.stdout.strip().splitlines()[-1])))
    return out


def time_cli(args: list[str], runs: int) -> list[float]:
    import time

    out = []
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO)}
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "preflight", *args], cwd=REPO, env=env,
                       capture_output=True, timeout=120, check=False)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the --python row (default: this one)")
    args = ap.parse_args()
    print(f"# {describe()}, "
          f"{args.runs} fresh processes per row")
    print(f"{'what':<32} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    fill = {"python": args.python, "tree": str(REPO / "preflight")}
    results = {name: time_row(setup.format(**fill), timed.format(**fill), args.runs)
               for name, (setup, timed) in ROWS.items()}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        from tests import topologies

        json.dump(topologies.healthy_8x_h100().to_json(), f)
    os.environ["PREFLIGHT_NVML_FIXTURE"] = f.name
    try:
        results["cli: check --only versions (all)"] = time_cli(
            ["check", "--only", "versions", "--json"], args.runs)
    finally:
        os.unlink(f.name)
    for name, times in results.items():
        print(f"{name:<32} {statistics.median(times):>10.1f} {min(times):>8.1f} "
              f"{max(times):>8.1f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
