"""A stand-in for ``preflight check --json`` that the daemon's tests run as its child.

Usage: ``python fake_child.py MODE``. It builds real checks and runs them through the real runner
(per-check deadlines, exception -> ERROR), then prints the JSON report as ``preflight check`` does:

* ``ok``: two passing checks (``alpha``, ``beta``).
* ``raise``: ``beta`` raises -> ERROR CheckCrashed from the runner.
* ``hang-check``: ``beta`` sleeps past its 0.3 s deadline -> ERROR CheckTimeout from the runner.
* ``hang-run``: the whole process (and a grandchild it starts) hangs before printing anything ->
  the daemon must kill the process group at its deadline.
* ``garbage``: prints something that is not a report and exits 1.
* ``nice``: ``beta`` reports the process's niceness in its message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from preflight.checks.base import Check
from preflight.core.config import Config
from preflight.core.context import Context
from preflight.core.result import Result, Status
from preflight.core.runner import run_checks


def alpha(ctx: Context) -> Result:
    return Result("alpha", Status.PASS, "AlphaOk", "alpha is fine")


def main(mode: str) -> int:
    sys.stdin.read()  # the daemon's config; a real child parses it
    if mode == "hang-run":
        pid_file = Path(sys.argv[2])
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pid_file.write_text(f"{grandchild.pid}\n")
        time.sleep(600)
        return 0
    if mode == "garbage":
        print("Traceback (most recent call last): not json")
        return 1

    def beta(ctx: Context) -> Result:
        if mode == "raise":
            raise RuntimeError("probe exploded")
        if mode == "hang-check":
            time.sleep(30)
        if mode == "nice":
            return Result("beta", Status.PASS, "BetaOk", f"nice {os.nice(0)}")
        return Result("beta", Status.PASS, "BetaOk", "beta is fine")

    ctx = Context(config=Config(check_timeout_s=0.3), env={})
    report = run_checks(ctx, [Check("alpha", alpha, "a"), Check("beta", beta, "b")])
    json.dump(report.to_json(), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
