"""torchrun / env:// / Slurm variables: which launcher set them, read as integers the way torch
reads them.

Pure: :func:`parse` takes an environment mapping and returns plain data (the launchers seen, the
integers, the values that are not integers, the required variables that are missing); judging them
is the ``launcher_env`` check's work. Facts (torch/distributed/rendezvous.py;
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


class Launcher(enum.Enum):
    TORCHRUN = "torchrun"
    ENV = "env://"
    SLURM = "slurm"


@dataclass(frozen=True)
class LauncherVars:
    """What :func:`parse` read.

    Attributes:
        launchers: detected launchers, most specific first (torchrun before env://).
        ints: the variables that read as integers, by name.
        not_integers: (name, value) of the variables set to something ``int()`` rejects, in the
            order they are read (a required variable that is empty counts as missing instead).
        required: what the torch launcher must set (torchrun: every worker variable; env://:
            RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); empty without one.
        missing: the required variables that are unset or empty (torch treats both as unset).
        slurm_context: SLURM_SCRIPT_CONTEXT (``prolog_slurmd`` in a prolog), if set.
    """

    launchers: tuple[Launcher, ...]
    ints: Mapping[str, int] = field(default_factory=dict)
    not_integers: tuple[tuple[str, str], ...] = ()
    required: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
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


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """``int(env[name])`` as torch reads it; None when unset, empty or not an integer
    (``launcher_env`` reports that)."""
    return read_int(env.get(name))


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


def parse(env: Mapping[str, str]) -> LauncherVars:
    """Detect the launcher and read its variables: which are integers, which are missing."""
    launchers = detect(env)
    context = env.get("SLURM_SCRIPT_CONTEXT")
    if not launchers:
        return LauncherVars((), slurm_context=context)
    torch_launcher = Launcher.TORCHRUN in launchers or Launcher.ENV in launchers
    required: tuple[str, ...] = ()
    if torch_launcher:
        required = TORCHRUN_VARS if Launcher.TORCHRUN in launchers else ENV_RENDEZVOUS_VARS
    names = [*INTEGER_VARS] if torch_launcher else []
    if Launcher.SLURM in launchers:
        names += SLURM_INTEGER_VARS
    ints: dict[str, int] = {}
    bad: list[tuple[str, str]] = []
    for name in names:
        raw = env.get(name)
        if raw is None or (raw == "" and name in required):
            continue  # an empty required one is missing: torch treats it as unset
        value = read_int(raw)
        if value is None:
            bad.append((name, raw))
        else:
            ints[name] = value
    missing = tuple(n for n in required if not env.get(n))
    return LauncherVars(launchers, ints, tuple(bad), required, missing, context)


__all__ = ["ENV_RENDEZVOUS_VARS", "RANK_MARKERS", "SLURM_MARKERS", "TORCHRUN_VARS", "Launcher",
           "LauncherVars", "detect", "env_int", "parse", "read_int", "slurm_job_gpus"]
