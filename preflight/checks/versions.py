"""``versions``: this node's environment fingerprint, and whether it matches the golden one.

What: python, torch and the CUDA it was built with, cuDNN, NCCL (``ncclGetVersion``), the driver,
the watched packages and optional sha256 of code/data paths (see
:mod:`preflight.probes.fingerprint`),
read without importing torch. With a golden fingerprint (``--golden FILE``), every difference is
named: ``scikit-learn: 1.5.0 on this node, 1.3.2 in golden``.

Why: torchrun does not synchronise files, datasets or Python environments between nodes. A typical
case: scikit-learn differing between two machines, preprocessing differed slightly, and after
gradient sync the loss began to swing after 200 steps; days to find (docs/fingerprint.md). NCCL
versions that differ across nodes can also hang or fail the first collective.

Verdicts:
    PASS ``VersionsMatch`` (golden given, same) / ``VersionsRecorded`` (no golden) with a summary
    (torch X, CUDA Y, NCCL Z, driver D).
    FAIL ``VersionsDiffer``: differences from golden, with a pip command to converge.
    WARN ``HashPathProblem`` (no golden): a ``hash_paths`` entry is missing, unreadable or too big.
    A ``--python`` that does not exist or is not an interpreter (``/bin/false``, a directory) and
    a golden file that cannot be read or is not a fingerprint are the operator's configuration
    mistakes, the same on every node: :func:`check_targets` finds them before any check runs, and
    ``check`` exits 2 (``prolog`` logs them and lets the job run), never a drain. Should one
    appear only once the checks run (the venv unmounted meanwhile), it is ERROR
    ``PythonMissing`` / ``PythonBroken`` / ``GoldenUnreadable``: undecided, never a FAIL.
    A timeout of the target interpreter raises, so the runner reports ERROR (could not tell).

Knobs: ``golden`` (None), ``python`` (None = this interpreter), ``watched_packages`` (torch, numpy,
scikit-learn, transformers, accelerate, deepspeed, triton, nvidia-nccl-*, nvidia-cudnn-*),
``hash_paths`` (none).

The fingerprint goes into ``details["fingerprint"]`` (the runner lifts it into
``Report.fingerprint``); it is gathered once per run through ``ctx.cached("fingerprint")``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Collection
from typing import Any

from preflight.core.config import Config, ConfigError
from preflight.core.context import Context
from preflight.core.procgroup import GroupTimeout, run_in_group
from preflight.core.result import Result, Scope, Status
from preflight.probes import fingerprint as fpmod
from preflight.probes.pyenv import PyEnvError

NAME = "versions"
#: Differences quoted in the message; the rest are in details.
MAX_LISTED = 8
#: The checks that run the training interpreter (``python``): this one and the GPU workers.
PYTHON_USERS = (NAME, "allreduce", "gpu_speed")


def check_targets(config: Config, checks: Collection[str], *, timeout_s: float) -> None:
    """Refuse a golden file or a training interpreter that cannot be used, before any check runs.

    The golden file must be a readable fingerprint (``golden``, when ``versions`` runs); the
    interpreter (``python``, when a check of :data:`PYTHON_USERS` runs) must exist, be a file
    and run ``-I -c 'import sys'`` to exit 0 (``/bin/false`` does not). One that does not answer
    within ``timeout_s`` is left to the check (a slow shared filesystem is the node's state, not
    a typo); one that runs but describes no environment is the check's ``PythonBroken``.

    Raises:
        ConfigError: the message names the key, the path and what is wrong with it.
    """
    if config.golden and NAME in checks:
        try:
            fpmod.load(config.golden)
        except fpmod.FingerprintError as exc:
            raise ConfigError(f"golden {config.golden}: {exc} (make one on a known-good node: "
                              f"preflight fingerprint --json > {shlex.quote(config.golden)})"
                              ) from None
    if config.python and any(c in checks for c in PYTHON_USERS):
        problem = _interpreter_problem(config.python, timeout_s=timeout_s)
        if problem:
            raise ConfigError(f"python {config.python}: {problem}")


def _interpreter_problem(python: str, *, timeout_s: float) -> str | None:
    if os.path.isdir(python):
        return "is a directory, not an interpreter (name its bin/python)"
    try:
        proc = run_in_group([python, "-I", "-c", "import sys"], timeout_s=timeout_s)
    except GroupTimeout:
        return None
    except FileNotFoundError:
        return "no such file (a shared venv not mounted on this node looks like this)"
    except PermissionError:
        return "not executable"
    except OSError as exc:
        return f"cannot be run: {exc.strerror or exc}"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        return (f"is not a working Python interpreter (`{python} -I -c 'import sys'` exit "
                f"{proc.returncode}{': ' + err[-1][:200] if err else ''})")
    return None


def fingerprint_of(ctx: Context) -> dict[str, Any]:
    """This run's fingerprint, gathered once and shared (the check, the report, the metrics)."""
    cfg = ctx.config
    return ctx.cached("fingerprint", lambda: fpmod.gather(
        python=cfg.python, watched=cfg.watched_packages, hash_paths=cfg.hash_paths, env=ctx.env,
        timeout_s=min(fpmod.PYENV_TIMEOUT_S, 0.8 * cfg.check_timeout_s), gpus=ctx.gpus))


def _remedy(diffs: list[fpmod.Difference], python: str | None) -> str:
    pins = [f"{d.key}=={d.b}" for d in diffs if d.kind == "package" and d.b is not None]
    extra = [d.key for d in diffs if d.kind == "package" and d.b is None]
    other = [d.key for d in diffs if d.kind != "package"]
    steps = []
    if pins:
        py = shlex.quote(python) if python else "python"
        steps.append(f"{py} -m pip install " + " ".join(shlex.quote(p) for p in pins))
    if extra:
        steps.append(f"remove {', '.join(extra)} (not installed on the golden node)")
    if other:
        steps.append(f"align {', '.join(other)} with the golden node (same image, driver and "
                     "code everywhere)")
    return ("; ".join(steps) + ". Better: build every node from one image or lockfile, then "
            "refresh the golden file with: preflight fingerprint --json > golden.json")


def run(ctx: Context) -> Result:
    cfg = ctx.config
    try:
        fp = fingerprint_of(ctx)
    except PyEnvError as exc:
        if exc.kind == "timeout":
            # The interpreter did not answer in time (a hung shared filesystem): the runner's
            # ProbeTimeout, not a crash of preflight's.
            raise TimeoutError(str(exc)) from exc
        missing = exc.kind == "missing"
        return Result(
            NAME, Status.ERROR, "PythonMissing" if missing else "PythonBroken",
            f"training interpreter: {exc}",
            f"Install or mount the training environment at {cfg.python} on this node (a shared "
            "venv that is not mounted looks like this), or fix the python key / --python."
            if missing else f"Run {cfg.python} -c 'import sys' on this node and repair what it "
            "prints; a job launched with it would fail the same way.",
            details={"python": cfg.python}, scope=Scope.UNDECIDED)

    details: dict[str, Any] = {"sha256": fp["sha256"], "fingerprint": fp}
    summary = fpmod.summary(fp)
    if cfg.golden:
        details["golden"] = cfg.golden
        try:
            golden = fpmod.load(cfg.golden)
        except fpmod.FingerprintError as exc:
            return Result(NAME, Status.ERROR, "GoldenUnreadable",
                          f"cannot compare with the golden fingerprint: {exc}",
                          f"Fix the golden key / --golden: make the file on a known-good node "
                          f"with: preflight fingerprint --json > {shlex.quote(cfg.golden)}",
                          details=details, scope=Scope.UNDECIDED)
        diffs = fpmod.diff(fp, golden)
        if diffs:
            details["differences"] = [d.to_json() for d in diffs]
            listed = "; ".join(d.describe("on this node", "in golden") for d in diffs[:MAX_LISTED])
            more = f"; and {len(diffs) - MAX_LISTED} more" if len(diffs) > MAX_LISTED else ""
            return Result(NAME, Status.FAIL, "VersionsDiffer",
                          f"{len(diffs)} difference{'s' if len(diffs) != 1 else ''} from golden "
                          f"{cfg.golden}: {listed}{more}",
                          _remedy(diffs, cfg.python), details=details)
        return Result(NAME, Status.PASS, "VersionsMatch",
                      f"matches golden {cfg.golden} (sha256 {fp['sha256'][:12]}): {summary}",
                      details=details)
    bad = {p: h for p, h in fp["hashes"].items() if h.startswith("<")}
    if bad:
        return Result(NAME, Status.WARN, "HashPathProblem",
                      "hash_paths without a hash: " + "; ".join(f"{p}: {h}" for p, h in
                                                                bad.items()),
                      "Fix or remove these hash_paths entries; for a big dataset hash its "
                      "manifest file instead of the tree.", details=details)
    return Result(NAME, Status.PASS, "VersionsRecorded",
                  f"{summary} (sha256 {fp['sha256'][:12]}; no golden file to compare with)",
                  details=details)
