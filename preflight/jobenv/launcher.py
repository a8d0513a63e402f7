"""torchrun / env:// / Slurm variables: detected, read as integers the way torch reads them, judged.

Pure: :func:`analyse` takes an environment mapping and returns what launcher it sees and every
problem found, each with a remedy. Facts (torch/distributed/rendezvous.py;
torch/distributed/run.py; Slurm srun(1) "OUTPUT ENVIRONMENT VARIABLES"):

- torchrun sets LOCAL_RANK, RANK, GROUP_RANK, ROLE_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE,
  ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
  TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE.
- ``init_process_group(init_method="env://")`` reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
  an unset or empty one is "environment variable RANK expected, but not set" (older torch:
  "Invalid environment variable: RANK"); values go through Python's ``int()``.
- Slurm: SLURM_JOB_ID in any job context; SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS,
  SLURM_NNODES in a step (srun). A prolog (SLURM_SCRIPT_CONTEXT=prolog_slurmd) has no ranks yet.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from preflight.core.result import Finding, Scope, Status

#: Variables torchrun sets for every worker (torch/distributed/elastic/agent/server/api.py).
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: What env:// rendezvous needs (torch/distributed/rendezvous.py).
ENV_RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Variables whose presence means a torch launcher (or a person imitating one) set the rank.
RANK_MARKERS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "TORCHELASTIC_RUN_ID")
INTEGER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
# MASTER_PORT is required (torchrun sets it) but its value is master_port's to judge.
SLURM_INTEGER_VARS = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
                      "SLURM_NTASKS", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
                      "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_STEP_ID")
SLURM_MARKERS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID", "SLURM_STEP_ID")

REMEDY_LAUNCH = ("Launch with torchrun (torchrun --nnodes=N --nproc-per-node=G train.py), which "
                 "sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or pass rank= and "
                 "world_size= to init_process_group explicitly.")


class Launcher(enum.Enum):
    TORCHRUN = "torchrun"
    ENV = "env://"
    SLURM = "slurm"


def _job(status: Status, reason: str, message: str, remedy: str) -> Finding:
    """A finding about the launcher's variables: always the job's own setting, never the node."""
    return Finding(status, reason, message, remedy, Scope.JOB)


@dataclass(frozen=True)
class LauncherEnv:
    """What :func:`analyse` found.

    Attributes:
        launchers: detected launchers, most specific first (torchrun before env://).
        ints: the variables that read as integers, by name.
        issues: problems, worst first.
        slurm_context: SLURM_SCRIPT_CONTEXT (``prolog_slurmd`` in a prolog), if set.
    """

    launchers: tuple[Launcher, ...]
    ints: Mapping[str, int] = field(default_factory=dict)
    issues: tuple[Finding, ...] = ()
    slurm_context: str | None = None

    @property
    def in_prolog(self) -> bool:
        return bool(self.slurm_context) and str(self.slurm_context).startswith("prolog")


def read_int(raw: str | None) -> int | None:
    """The value as torch reads it (``int(os.environ[...])``); None when unset, empty or not an
    integer. Never raises."""
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def slurm_job_gpus(env: Mapping[str, str]) -> list[int] | None:
    """Physical GPU indices Slurm gave the job on this node (SLURM_JOB_GPUS="0,1,2,3"); None when
    unset or not a list of integers."""
    raw = env.get("SLURM_JOB_GPUS")
    if not raw:
        return None
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        return None


def detect(env: Mapping[str, str]) -> tuple[Launcher, ...]:
    """Which launchers' variables are present (most specific first)."""
    found: list[Launcher] = []
    if "TORCHELASTIC_RUN_ID" in env:
        found.append(Launcher.TORCHRUN)
    elif any(k in env for k in RANK_MARKERS):
        found.append(Launcher.ENV)
    if any(k in env for k in SLURM_MARKERS):
        found.append(Launcher.SLURM)
    return tuple(found)


def analyse(env: Mapping[str, str]) -> LauncherEnv:
    """Detect the launcher and judge its variables: present, integers, consistent."""
    launchers = detect(env)
    context = env.get("SLURM_SCRIPT_CONTEXT")
    if not launchers:
        return LauncherEnv((), slurm_context=context)
    issues: list[Finding] = []
    ints: dict[str, int] = {}
    torch_launcher = Launcher.TORCHRUN in launchers or Launcher.ENV in launchers

    required: tuple[str, ...] = ()
    if torch_launcher:
        required = TORCHRUN_VARS if Launcher.TORCHRUN in launchers else ENV_RENDEZVOUS_VARS
    names = [*INTEGER_VARS] if torch_launcher else []
    if Launcher.SLURM in launchers:
        names += SLURM_INTEGER_VARS
    for name in names:
        raw = env.get(name)
        if raw is None or (raw == "" and name in required):
            continue  # an empty required one is reported as missing: torch treats it as unset
        value = read_int(raw)
        if value is None:
            issues.append(_job(
                Status.FAIL, "LauncherVarNotInteger",
                f"{name}={raw!r} is not an integer; torch does int(os.environ[{name!r}]) and "
                "raises ValueError", f"export {name}=<integer> (or let torchrun / srun set it)"))
        else:
            ints[name] = value

    if torch_launcher:
        missing = [n for n in required if not env.get(n)]
        if missing:
            who = ("torchrun's worker environment" if Launcher.TORCHRUN in launchers
                   else "env:// rendezvous")
            present = [n for n in RANK_MARKERS if n in env]
            issues.append(_job(
                Status.FAIL, "LauncherVarMissing",
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset or empty but "
                f"{who} needs {'it' if len(missing) == 1 else 'them'} (found "
                f"{', '.join(present) or 'none of RANK/WORLD_SIZE'}); "
                f"init_process_group(\"env://\") fails: \"environment variable {missing[0]} "
                "expected, but not set\" (or \"Invalid environment variable: "
                f"{missing[0]}\")",
                REMEDY_LAUNCH))
        issues += _torch_consistency(ints)
    if Launcher.SLURM in launchers:
        issues += _slurm_consistency(ints, env, in_prolog=bool(context and
                                                               context.startswith("prolog")))
    issues.sort(key=lambda i: -i.status)
    return LauncherEnv(launchers, ints, tuple(issues), context)


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


__all__ = ["ENV_RENDEZVOUS_VARS", "TORCHRUN_VARS", "Launcher", "LauncherEnv", "analyse",
           "detect", "read_int", "slurm_job_gpus"]
