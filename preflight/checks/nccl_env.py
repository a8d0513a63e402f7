"""``nccl_env``: NCCL_* / TORCH_NCCL_* settings that silently hurt a job.

Why: these variables outlive the debugging session that set them (a profile, a container image, a
module file) and then cost bandwidth or turn a crash into a hang without any error: P2P or SHM off
sends GPU traffic through host memory; NCCL_IB_DISABLE on an InfiniBand node falls back to TCP
sockets; a forced NCCL_ALGO/NCCL_PROTO overrides NCCL's tuning; NCCL_SOCKET_FAMILY other than
AF_INET/AF_INET6 is silently ignored; TORCH_NCCL_ASYNC_ERROR_HANDLING=0 stops the watchdog from
aborting a stuck collective, so a dead rank hangs the job instead of failing it (nccl.md sections 3,
4; the article, section 3). NCCL splits comma lists without trimming, so "eth0, eth1" never
matches eth1.

Verdict: WARN per finding, PASS listing the NCCL_* variables seen. No knobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from preflight.context import Context
from preflight.model import Result, Status

NAME = "nccl_env"

#: Variables NCCL reads as comma lists (whitespace is kept and breaks matching).
_LIST_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_ALGO", "NCCL_PROTO", "GLOO_SOCKET_IFNAME",
              "NCCL_NET_PLUGIN")
_TRUE = ("1", "y", "yes", "true", "on")


def _on(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def findings(env: Mapping[str, str], *, has_infiniband: bool,
             topo_file_exists: bool | None) -> list[tuple[str, str, str]]:
    """(reason, message, remedy) for each risky setting in ``env``; pure."""
    out = []
    if _on(env.get("NCCL_P2P_DISABLE")):
        out.append(("P2pDisabled", "NCCL_P2P_DISABLE=1 sends GPU-to-GPU traffic through host "
                    "memory instead of NVLink/PCIe peer-to-peer (a large bandwidth loss)",
                    "unset NCCL_P2P_DISABLE"))
    if env.get("NCCL_P2P_LEVEL", "").strip().upper() in ("LOC", "0"):
        out.append(("P2pDisabled", f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} disables "
                    "peer-to-peer between GPUs", "unset NCCL_P2P_LEVEL"))
    if _on(env.get("NCCL_SHM_DISABLE")):
        out.append(("ShmDisabled", "NCCL_SHM_DISABLE=1 makes intra-node traffic that cannot use "
                    "P2P go through the network stack", "unset NCCL_SHM_DISABLE and give the "
                    "container a bigger /dev/shm instead (--shm-size=16g)"))
    if _on(env.get("NCCL_IB_DISABLE")) and has_infiniband:
        out.append(("IbDisabled", "NCCL_IB_DISABLE=1 on a node with InfiniBand/RoCE devices: "
                    "inter-node traffic falls back to TCP sockets", "unset NCCL_IB_DISABLE"))
    topo = env.get("NCCL_TOPO_FILE")
    if topo and topo_file_exists is False:
        out.append(("TopoFileMissing", f"NCCL_TOPO_FILE={topo} does not exist on this node; "
                    "NCCL falls back to detection or fails",
                    "unset NCCL_TOPO_FILE, or ship the file with the image"))
    family = env.get("NCCL_SOCKET_FAMILY")
    if family is not None and family not in ("AF_INET", "AF_INET6"):
        out.append(("SocketFamilyIgnored", f"NCCL_SOCKET_FAMILY={family!r} is ignored by NCCL "
                    "(only AF_INET or AF_INET6 count)", "export NCCL_SOCKET_FAMILY=AF_INET (or "
                    "AF_INET6), or unset it"))
    for var in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        if env.get(var, "").strip() == "0":
            out.append(("AsyncErrorHandlingOff", f"{var}=0: the NCCL watchdog will not abort a "
                        "stuck collective, so a dead rank hangs the job instead of failing it",
                        f"unset {var} (torch's default is 3)"))
    for var in ("NCCL_ALGO", "NCCL_PROTO"):
        if env.get(var, "").strip():
            out.append(("TuningForced", f"{var}={env[var]} overrides NCCL's own choice of "
                        f"{'algorithm' if var == 'NCCL_ALGO' else 'protocol'}; often a leftover "
                        "from debugging, and slower on other topologies", f"unset {var}"))
    for var in _LIST_VARS:
        value = env.get(var)
        if value is not None and any(ch.isspace() for ch in value):
            fixed = ",".join(part.strip() for part in value.split(","))
            out.append(("WhitespaceInList", f"{var}={value!r} contains whitespace; NCCL does not "
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
    if found:
        return Result(NAME, Status.WARN, found[0][0], "; ".join(f[1] for f in found),
                      "; ".join(dict.fromkeys(f[2] for f in found)),
                      details={**details, "reasons": [f[0] for f in found]})
    listed = ", ".join(f"{k}={env[k]}" for k in seen) if seen else "none set"
    return Result(NAME, Status.PASS, "NcclEnvOk", f"no risky NCCL setting (NCCL_* seen: {listed})",
                  details=details)
