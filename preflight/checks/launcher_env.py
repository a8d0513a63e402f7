"""``launcher_env``: the torchrun / env:// / Slurm variables are complete, integers and consistent.

What: once a launcher is detected (torchrun: TORCHELASTIC_RUN_ID; env://: any of RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK; Slurm: SLURM_JOB_ID, SLURM_PROCID, SLURM_STEP_ID), the
variables it must set are present and read as integers the way torch reads them (``int()``), and
they agree: 0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE,
0 <= GROUP_RANK < GROUP_WORLD_SIZE, SLURM_PROCID < SLURM_NTASKS ...
(pure logic in :mod:`preflight.jobenv.launcher`). The values of MASTER_ADDR and MASTER_PORT
are judged by ``master_port`` alone (this check only wants them present).

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

from dataclasses import replace
from typing import Any

from preflight.core.context import Context
from preflight.core.result import Result, Status, fold
from preflight.jobenv import launcher

NAME = "launcher_env"

_SHOWN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
          "SLURM_NODEID")


def run(ctx: Context) -> Result:
    found = launcher.analyse(ctx.env)
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
    if found.in_prolog and launcher.Launcher.SLURM in found.launchers \
            and len(found.launchers) == 1 and not found.issues:
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
    result = fold(NAME, found.issues, ok_reason="LauncherOk", summary=f"{names}: {shown}{where}",
                  details=details, summary_up_to=Status.PASS)
    if result.status is Status.PASS:
        return result
    return replace(result, message=f"{names}: {result.message}")
