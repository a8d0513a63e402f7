"""``nccl_env``: NCCL_* / TORCH_NCCL_* settings that silently hurt a job.

Why: these variables outlive the debugging session that set them (a profile, a container image, a
module file) and then cost bandwidth or turn a crash into a hang without any error: P2P or SHM off
sends GPU traffic through host memory; NCCL_IB_DISABLE on an InfiniBand node falls back to TCP
sockets; a forced NCCL_ALGO/NCCL_PROTO overrides NCCL's tuning; TORCH_NCCL_ASYNC_ERROR_HANDLING=0
stops the watchdog from aborting a stuck collective, so a dead rank hangs the job instead of failing
it (NCCL docs, "Environment Variables"; PyTorch docs, torch.distributed). NCCL splits comma lists
without trimming, so "eth0, eth1" never matches eth1. On/off variables are read as NCCL reads them
(an integer, non-zero = on: :func:`preflight.jobenv.netvars.nccl_flag`). NCCL_SOCKET_IFNAME and
NCCL_SOCKET_FAMILY belong to ``network``.

Verdict: WARN per finding (scope: job), PASS listing the NCCL_* variables seen. No knobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from preflight.core.context import Context
from preflight.core.result import Finding, Result, Scope, Status, fold
from preflight.jobenv.netvars import nccl_flag

NAME = "nccl_env"

#: Variables NCCL reads as comma lists (whitespace is kept and breaks matching);
#: NCCL_SOCKET_IFNAME is judged by ``network`` (one fault, one owner).
_LIST_VARS = ("NCCL_IB_HCA", "NCCL_ALGO", "NCCL_PROTO", "GLOO_SOCKET_IFNAME", "NCCL_NET_PLUGIN")


def findings(env: Mapping[str, str], *, has_infiniband: bool,
             topo_file_exists: bool | None) -> list[Finding]:
    """A WARN finding for each risky setting in ``env``: the job's own settings; pure."""
    out: list[Finding] = []
    if nccl_flag(env.get("NCCL_P2P_DISABLE")):
        out.append(_job("P2pDisabled", "NCCL_P2P_DISABLE=1 sends GPU-to-GPU traffic through host "
                    "memory instead of NVLink/PCIe peer-to-peer (a large bandwidth loss)",
                    "unset NCCL_P2P_DISABLE"))
    if env.get("NCCL_P2P_LEVEL", "").strip().upper() in ("LOC", "0"):
        out.append(_job("P2pDisabled", f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} disables "
                    "peer-to-peer between GPUs", "unset NCCL_P2P_LEVEL"))
    if nccl_flag(env.get("NCCL_SHM_DISABLE")):
        out.append(_job("ShmDisabled", "NCCL_SHM_DISABLE=1 makes intra-node traffic that cannot "
                        "use "
                    "P2P go through the network stack", "unset NCCL_SHM_DISABLE and give the "
                    "container a bigger /dev/shm instead (--shm-size=16g)"))
    if nccl_flag(env.get("NCCL_IB_DISABLE")) and has_infiniband:
        out.append(_job("IbDisabled", "NCCL_IB_DISABLE=1 on a node with InfiniBand/RoCE devices: "
                    "inter-node traffic falls back to TCP sockets", "unset NCCL_IB_DISABLE"))
    topo = env.get("NCCL_TOPO_FILE")
    if topo and topo_file_exists is False:
        out.append(_job("TopoFileMissing", f"NCCL_TOPO_FILE={topo} does not exist on this node; "
                    "NCCL falls back to detection or fails",
                    "unset NCCL_TOPO_FILE, or ship the file with the image"))
    for var in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        if env.get(var, "").strip() == "0":
            out.append(_job("AsyncErrorHandlingOff", f"{var}=0: the NCCL watchdog will not abort a "
                        "stuck collective, so a dead rank hangs the job instead of failing it",
                        f"unset {var} (torch's default is 3)"))
    for var in ("NCCL_ALGO", "NCCL_PROTO"):
        if env.get(var, "").strip():
            out.append(_job("TuningForced", f"{var}={env[var]} overrides NCCL's own choice of "
                        f"{'algorithm' if var == 'NCCL_ALGO' else 'protocol'}; often a leftover "
                        "from debugging, and slower on other topologies", f"unset {var}"))
    for var in _LIST_VARS:
        value = env.get(var)
        if value is not None and any(ch.isspace() for ch in value):
            fixed = ",".join(part.strip() for part in value.split(","))
            out.append(_job("WhitespaceInList", f"{var}={value!r} contains whitespace; NCCL does "
                            "not "
                        "trim list entries, so an entry with a space never matches",
                        f"export {var}={fixed}"))
    return out


def run(ctx: Context) -> Result:
    env = ctx.env
    ib = ctx.host_path("/sys/class/infiniband")
    has_ib = ib.is_dir() and any(ib.iterdir())
    topo = env.get("NCCL_TOPO_FILE")
    # A relative NCCL_TOPO_FILE is resolved by the job in its own working directory: not judged.
    topo_exists = ctx.host_path(topo).exists() if topo and topo.startswith("/") else None
    seen = sorted(k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_")))
    found = findings(env, has_infiniband=has_ib, topo_file_exists=topo_exists)
    details = {"variables": {k: env[k] for k in seen}}
    listed = ", ".join(f"{k}={env[k]}" for k in seen) if seen else "none set"
    return fold(NAME, found, ok_reason="NcclEnvOk",
                summary=f"no risky NCCL setting (NCCL_* seen: {listed})", details=details,
                summary_up_to=Status.PASS)


def _job(reason: str, message: str, remedy: str) -> Finding:
    """A WARN about the job's own environment."""
    return Finding(Status.WARN, reason, message, remedy, Scope.JOB)
