"""``launcher_env``: the torchrun / env:// / Slurm variables are complete, integers and consistent.

What: once a launcher is detected (torchrun: TORCHELASTIC_RUN_ID; env://: any of RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK; Slurm: SLURM_JOB_ID, SLURM_PROCID, SLURM_STEP_ID), the
variables it must set are present and read as integers the way torch reads them (``int()``), and
they agree: 0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE,
0 <= GROUP_RANK < GROUP_WORLD_SIZE, SLURM_PROCID < SLURM_NTASKS ...
(the variables are read by :mod:`preflight.jobenv.launcher`, judged here). The values of
MASTER_ADDR and MASTER_PORT are judged by ``master_port`` alone (this check only wants them
present).

Why: without RANK, init_process_group("env://") dies with "Invalid environment variable: RANK"
(launch with torchrun, or pass rank= and world_size=; PyTorch docs, "Environment variable
initialization" of torch.distributed); a stale or
hand-written WORLD_SIZE makes the rendezvous wait for ranks that never come. LOCAL_WORLD_SIZE
against the GPUs CUDA can see is judged by ``cuda_devices``.

Verdicts: SKIP outside any launcher ("not inside torchrun or a Slurm job") and in a Slurm prolog
(no ranks exist yet); FAIL for missing, non-integer or out-of-range variables; WARN for variables
that look hand-made (WORLD_SIZE not GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE, RANK not
GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK). Knobs: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from preflight.core.context import Context
from preflight.core.result import Finding, Result, Scope, Status, fold
from preflight.jobenv import launcher
from preflight.jobenv.launcher import Launcher, LauncherVars

NAME = "launcher_env"

REMEDY_LAUNCH = ("Launch with torchrun (torchrun --nnodes=N --nproc-per-node=G train.py), which "
                 "sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or pass rank= and "
                 "world_size= to init_process_group explicitly.")

_SHOWN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
          "SLURM_NODEID")


def _job(status: Status, reason: str, message: str, remedy: str) -> Finding:
    """A finding about the launcher's variables: always the job's own setting, never the node."""
    return Finding(status, reason, message, remedy, Scope.JOB)


def findings(env: Mapping[str, str], found: LauncherVars) -> list[Finding]:
    """Every problem with the launcher's variables, worst first."""
    if not found.launchers:
        return []
    issues = [_job(Status.FAIL, "LauncherVarNotInteger",
                   f"{name}={raw!r} is not an integer; torch does int(os.environ[{name!r}]) and "
                   "raises ValueError", f"export {name}=<integer> (or let torchrun / srun set it)")
              for name, raw in found.not_integers]
    if found.missing:
        missing = found.missing
        who = ("torchrun's worker environment" if Launcher.TORCHRUN in found.launchers
               else "env:// rendezvous")
        present = [n for n in launcher.RANK_MARKERS if n in env]
        issues.append(_job(
            Status.FAIL, "LauncherVarMissing",
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset or empty but "
            f"{who} needs {'it' if len(missing) == 1 else 'them'} (found "
            f"{', '.join(present) or 'none of RANK/WORLD_SIZE'}); "
            f"init_process_group(\"env://\") fails: \"environment variable {missing[0]} "
            "expected, but not set\" (or \"Invalid environment variable: "
            f"{missing[0]}\")",
            REMEDY_LAUNCH))
    if Launcher.TORCHRUN in found.launchers or Launcher.ENV in found.launchers:
        issues += _torch_consistency(found.ints)
    if Launcher.SLURM in found.launchers:
        issues += _slurm_consistency(found.ints, env, in_prolog=found.in_prolog)
    issues.sort(key=lambda i: -i.status)
    return issues


def _range(ints: Mapping[str, int], low: int, name: str, high_name: str) -> Finding | None:
    """``low <= ints[name] < ints[high_name]`` or a Finding (when both are known)."""
    value, high = ints.get(name), ints.get(high_name)
    if value is None:
        return None
    if value < low or (high is not None and value >= high):
        bound = f"0 <= {name} < {high_name}={high}" if high is not None else f"{name} >= {low}"
        return _job(Status.FAIL, "LauncherVarOutOfRange",
                     f"{name}={value} violates {bound}",
                     f"Do not set {name} by hand; let torchrun / srun set it (stale variables "
                     "from an outer job or a notebook are a common cause).")
    return None


def _torch_consistency(ints: Mapping[str, int]) -> list[Finding]:
    issues: list[Finding] = []
    for name, low in (("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1), ("GROUP_WORLD_SIZE", 1),
                      ("ROLE_WORLD_SIZE", 1)):
        found = _range(ints, low, name, "")
        if found:
            issues.append(found)
    for name, high in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                       ("GROUP_RANK", "GROUP_WORLD_SIZE")):
        found = _range(ints, 0, name, high)
        if found:
            issues.append(found)
    ws, lws = ints.get("WORLD_SIZE"), ints.get("LOCAL_WORLD_SIZE")
    if ws is not None and lws is not None and ws >= 1 and lws >= 1:
        if lws > ws:
            issues.append(_job(
                Status.FAIL, "LauncherVarOutOfRange",
                f"LOCAL_WORLD_SIZE={lws} is larger than WORLD_SIZE={ws}: more processes on this "
                "node than in the whole job",
                "Let torchrun set both (--nnodes, --nproc-per-node); do not export them by hand."))
        else:
            issues += _homogeneity(ints, ws, lws)
    return issues


def _homogeneity(ints: Mapping[str, int], ws: int, lws: int) -> list[Finding]:
    """torchrun with the same --nproc-per-node on every node: WORLD_SIZE = nodes x local, and
    RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK. Different --nproc-per-node per node is legal
    but rare, so a mismatch is a warning, not a failure."""
    nodes = ints.get("GROUP_WORLD_SIZE")
    remedy = ("Start every node with the same torchrun --nproc-per-node (and the same --nnodes); "
              "if that is intended, ignore this warning.")
    if nodes is not None and nodes >= 1:
        if nodes * lws != ws:
            return [_job(Status.WARN, "WorldSizeMismatch",
                          f"WORLD_SIZE={ws} but GROUP_WORLD_SIZE={nodes} x LOCAL_WORLD_SIZE={lws} "
                          f"= {nodes * lws}: nodes run different numbers of processes", remedy)]
    elif ws % lws:
        return [_job(Status.WARN, "WorldSizeMismatch",
                      f"WORLD_SIZE={ws} is not a multiple of LOCAL_WORLD_SIZE={lws}: nodes run "
                      "different numbers of processes", remedy)]
    rank, local, group = ints.get("RANK"), ints.get("LOCAL_RANK"), ints.get("GROUP_RANK")
    if None not in (rank, local, group) and ws % lws == 0:
        assert rank is not None and local is not None and group is not None
        want = group * lws + local
        if 0 <= local < lws and rank != want:
            return [_job(Status.WARN, "RankInconsistent",
                          f"RANK={rank} but GROUP_RANK={group} x LOCAL_WORLD_SIZE={lws} + "
                          f"LOCAL_RANK={local} = {want}: the variables do not come from one "
                          "torchrun", "Do not export RANK/LOCAL_RANK/GROUP_RANK by hand; let "
                          "torchrun set them.")]
    return []


def _slurm_consistency(ints: Mapping[str, int], env: Mapping[str, str], *,
                       in_prolog: bool) -> list[Finding]:
    issues: list[Finding] = []
    if "SLURM_JOB_ID" not in env and "SLURM_JOBID" not in env:
        issues.append(_job(Status.FAIL, "LauncherVarMissing",
                            "SLURM_PROCID/SLURM_STEP_ID are set but SLURM_JOB_ID is not: this is "
                            "not a complete Slurm job environment",
                            "Run inside an allocation (sbatch/salloc + srun); do not copy SLURM_* "
                            "variables into other shells or containers."))
    if in_prolog:
        return issues
    if "SLURM_STEP_ID" in env:
        missing = [n for n in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS") if n not in env]
        if missing:
            issues.append(_job(Status.FAIL, "LauncherVarMissing",
                                f"in a Slurm step (SLURM_STEP_ID={env['SLURM_STEP_ID']!r}) "
                                f"{', '.join(missing)} should be set by srun but "
                                f"{'is' if len(missing) == 1 else 'are'} not",
                                "Launch the tasks with srun inside the allocation."))
    nodes = ints.get("SLURM_NNODES", ints.get("SLURM_JOB_NUM_NODES"))
    checks = (("SLURM_PROCID", ints.get("SLURM_NTASKS"), "SLURM_NTASKS"),
              ("SLURM_NODEID", nodes, "SLURM_NNODES"),
              ("SLURM_LOCALID", ints.get("SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE"))
    for name, high, high_name in checks:
        value = ints.get(name)
        if value is None:
            continue
        if value < 0 or (high is not None and value >= high):
            bound = f"< {high_name}={high}" if high is not None else ">= 0"
            issues.append(_job(Status.FAIL, "LauncherVarOutOfRange",
                                f"{name}={value} violates 0 <= {name} {bound}",
                                "Do not set SLURM_* variables by hand; they come from srun."))
    return issues


def run(ctx: Context) -> Result:
    found = launcher.parse(ctx.env)
    issues = findings(ctx.env, found)
    details: dict[str, Any] = {
        "launchers": [x.value for x in found.launchers],
        "variables": {k: ctx.env[k] for k in (*launcher.TORCHRUN_VARS, *launcher.SLURM_MARKERS,
                                              "TORCHELASTIC_RUN_ID", "SLURM_NTASKS",
                                              "SLURM_LOCALID", "SLURM_NODEID")
                      if k in ctx.env},
    }
    if not found.launchers:
        return Result(NAME, Status.SKIP, "NoLauncher",
                      "no launcher variables: not inside torchrun or a Slurm job", details=details)
    if found.in_prolog and Launcher.SLURM in found.launchers \
            and len(found.launchers) == 1 and not issues:
        return Result(NAME, Status.SKIP, "SlurmProlog",
                      f"Slurm prolog of job {ctx.env.get('SLURM_JOB_ID', '?')}: ranks do not "
                      "exist yet, launcher variables are checked inside the job", details=details)
    names = " + ".join(x.value for x in found.launchers)
    values: dict[str, object] = {**found.ints}
    if "MASTER_PORT" in ctx.env:  # shown as given; master_port judges it
        values["MASTER_PORT"] = ctx.env["MASTER_PORT"]
    shown = ", ".join(f"{k}={values[k]}" for k in _SHOWN if k in values)
    addr = ctx.env.get("MASTER_ADDR")
    where = f", MASTER_ADDR={addr}" if addr else ""
    result = fold(NAME, issues, ok_reason="LauncherOk", summary=f"{names}: {shown}{where}",
                  details=details, summary_up_to=Status.PASS)
    if result.status is Status.PASS:
        return result
    return replace(result, message=f"{names}: {result.message}")
