"""Who this agent is in the cluster: node rank, node count, master, from options or the launcher.

Pure: :func:`resolve` takes the parsed options and an environment mapping. Sources, first wins:
the option; ``NNODES`` / ``NODE_RANK``; torchrun (``GROUP_WORLD_SIZE`` / ``GROUP_RANK`` with
one process per node, else ``WORLD_SIZE`` / ``RANK`` divided by ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` / ``MASTER_PORT``); Slurm (``SLURM_NNODES``, ``SLURM_NODEID``, the first host of
``SLURM_JOB_NODELIST``); a Kubernetes gang passes ``--master-addr`` (pod 0's headless-service
name) and ``--node-rank`` (the pod's completion index) explicitly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The default master port when neither --master-port nor MASTER_PORT is given (torchrun's).
DEFAULT_MASTER_PORT = 29500
#: Default deadline of each phase, seconds.
DEFAULT_TIMEOUT_S = 60.0


class ClusterUsageError(ValueError):
    """Options or launcher variables that cannot describe a cluster run (exit code 2)."""


@dataclass(frozen=True)
class ClusterOptions:
    """Everything an agent needs to join; ``use_agent_store``: torchrun's own store already listens
    on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so node 0 joins it as a client too."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    timeout_s: float
    use_agent_store: bool = False
    sources: tuple[str, ...] = ()


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (``gpu[003-007,012],login1`` -> ``gpu003``).

    Raises:
        ValueError: not a hostlist.
    """
    text = nodelist.strip()
    m = re.match(r"([^\[\],\s]*)(?:\[([^\]]*)\])?([^,\[\]\s]*)", text)
    if not text or m is None or not (m.group(1) or m.group(2)):
        raise ValueError(f"not a Slurm hostlist: {nodelist!r}")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",", 1)[0]
    lo = first.split("-", 1)[0]
    if not lo.isdigit():
        raise ValueError(f"not a Slurm hostlist: {nodelist!r} (range {first!r})")
    return prefix + lo + suffix


def _int(raw: str | None, name: str) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ClusterUsageError(f"{name}={raw!r} is not an integer") from None


def _first_int(env: Mapping[str, str], names: Sequence[str]) -> tuple[int | None, str]:
    """The first of ``names`` set in ``env`` as an integer, and its name; (None, "") if none."""
    for name in names:
        value = _int(env.get(name), name)
        if value is not None:
            return value, name
    return None, ""


def resolve(*, nnodes: int | None, node_rank: int | None, master_addr: str | None,
            master_port: int | None, timeout_s: float | None,
            env: Mapping[str, str]) -> ClusterOptions:
    """Combine options and launcher variables; ClusterUsageError names what is missing or wrong."""
    sources: list[str] = []
    lws = _int(env.get("LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE")
    if nnodes is None:
        nnodes, name = _first_int(env, ("NNODES", "GROUP_WORLD_SIZE", "SLURM_NNODES",
                                        "SLURM_JOB_NUM_NODES"))
        if nnodes is not None:
            sources.append(f"nnodes from {name}")
        ws = _int(env.get("WORLD_SIZE"), "WORLD_SIZE")
        if nnodes is None and ws is not None and lws:
            nnodes, _ = divmod(ws, lws)
            sources.append("nnodes from WORLD_SIZE / LOCAL_WORLD_SIZE")
    if node_rank is None:
        node_rank, name = _first_int(env, ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID"))
        if node_rank is not None:
            sources.append(f"node rank from {name}")
        rank = _int(env.get("RANK"), "RANK")
        if node_rank is None and rank is not None and lws:
            node_rank = rank // lws
            sources.append("node rank from RANK / LOCAL_WORLD_SIZE")
    if master_addr is None:
        master_addr = (env.get("MASTER_ADDR") or "").strip() or None
        if master_addr:
            sources.append("master from MASTER_ADDR")
        elif env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"):
            raw = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
            try:
                master_addr = first_host(raw)
            except ValueError as exc:
                raise ClusterUsageError(str(exc)) from None
            sources.append("master from the first host of SLURM_JOB_NODELIST")
    if master_port is None:
        master_port = _int(env.get("MASTER_PORT"), "MASTER_PORT") or DEFAULT_MASTER_PORT
    missing = [what for what, v in (("--nnodes (or NNODES / SLURM_NNODES)", nnodes),
                                    ("--node-rank (or NODE_RANK / GROUP_RANK / SLURM_NODEID)",
                                     node_rank),
                                    ("--master-addr (or MASTER_ADDR / SLURM_JOB_NODELIST)",
                                     master_addr)) if v is None]
    if missing:
        raise ClusterUsageError("cannot tell " + ", ".join(missing) + ": pass them, or start "
                                "the agent under srun or torchrun (preflight docs cluster)")
    assert nnodes is not None and node_rank is not None and master_addr is not None
    if nnodes < 1:
        raise ClusterUsageError(f"--nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ClusterUsageError(f"node rank {node_rank} is outside 0..{nnodes - 1} (--nnodes "
                                f"{nnodes})")
    if not 0 < master_port < 65536:
        raise ClusterUsageError(f"master port {master_port} is outside 1..65535")
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not 0 < timeout <= 3600:
        raise ClusterUsageError(f"--timeout must be in (0, 3600] seconds, got {timeout:g}")
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true"
    return ClusterOptions(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                          master_port=master_port, timeout_s=timeout, use_agent_store=agent,
                          sources=tuple(sources))
