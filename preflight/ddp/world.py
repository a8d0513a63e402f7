"""Step 4 of the ladder: every rank of every node in one DDP training (``preflight cluster --ddp``).

The cluster agent calls :func:`node_step` on every node, with this node's place in the world
(:class:`preflight.bench.options.WorldSpec`: its first global rank, the world's size, the
cluster's store, a key prefix for this step): the node's workers, one per local GPU (CPU ranks
with gloo), run the field guide's training as global ranks, clients of that store, and the node
answers with what each of its ranks showed (JSON, bounded). Node 0 merges the answers with
:func:`judge_world`: the proofs over every rank of every node (parameters bitwise equal across
nodes, the shards of all ranks disjoint and covering the data set, ...), the device mapping as
each node judged it for its own ranks, and the first cause when a node failed (a rank named by
its node). Its layer is ``network``: every node passed alone, together they fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from preflight.bench.options import DdpOptions, DdpStep, RunOptions, WorldSpec
from preflight.bench.worker import wire
from preflight.core.context import Context
from preflight.core.result import Status, worst
from preflight.ddp import proofs
from preflight.ddp.ladder import FAILED_KINDS, DdpUsageError, plan

#: What a node answers: at most this many ranks' facts (more than any node's GPUs).
MAX_RANKS_PER_NODE = 64


def node_step(ctx: Context, *, world: WorldSpec, backend: str, nproc: int | None = None,
              timeout_s: float | None = None, env: Mapping[str, str] | None = None
              ) -> dict[str, Any]:
    """This node's part of the world step (see the module docstring); never raises for a
    worker's failure. ``env``: the workers' environment (default the job's, ``ctx.env``; the
    cluster agent adds GLOO_SOCKET_IFNAME for gloo across nodes)."""
    from preflight.bench.parent import WorkerRun

    try:
        local = plan(ctx, nproc=nproc, timeout_s=timeout_s)
    except DdpUsageError as exc:
        return {"status": "error", "reason": "DdpUsage", "message": str(exc), "ranks": [],
                "failure": None, "device": None, "nccl_warnings": [], "seconds": None}
    if local.options is None:
        reason, message, _ = local.undecided or ("DdpUndecided", "nothing to run", "")
        return {"status": "error", "reason": reason, "message": message, "ranks": [],
                "failure": None, "device": None, "nccl_warnings": [], "seconds": None}
    gpu = backend == "nccl"
    opts = DdpOptions(steps=(DdpStep(wire.DDP_WORLD, backend, gpu),),
                      nproc=local.options.nproc, timeout_s=local.options.timeout_s,
                      labels=local.options.labels, env=dict(env if env is not None else ctx.env),
                      python=local.options.python, world=world)
    run = WorkerRun(RunOptions(ddp=opts))
    try:
        failure = run.ddp_step(wire.DDP_WORLD)
    finally:
        run.finish()
    workers = run.workers
    times = [st.ddp_times.get(wire.DDP_WORLD) for st in workers]
    seconds = max((sum(t.values()) for t in times if t), default=None)
    warnings = list(dict.fromkeys(w for st in workers for w in st.nccl_warnings))[:20]
    if failure is not None:
        return {"status": "fail" if failure.kind in FAILED_KINDS else "error",
                "reason": "DdpWorldFailed", "message": failure.message, "ranks": [],
                "failure": {"kind": failure.kind,
                            "ranks": [st.rank + world.rank_offset for st in workers
                                      if st.rank in failure.ranks]},
                "device": None, "nccl_warnings": warnings, "seconds": seconds}
    raw = [st.ddp.get(wire.DDP_WORLD) for st in workers][:MAX_RANKS_PER_NODE]
    try:
        facts = [proofs.parse_facts(r) for r in raw if r is not None]
    except ValueError as exc:
        return {"status": "error", "reason": "DdpUndecided", "message": f"a rank's report is "
                f"malformed: {exc}", "ranks": [], "failure": None, "device": None,
                "nccl_warnings": warnings, "seconds": seconds}
    device = proofs.device_proof(facts, local.expected if gpu else None, local.cvd,
                                 expected_note=local.expected_note)
    return {"status": "pass", "reason": "DdpWorldRan", "message": "", "ranks": raw,
            "failure": None, "device": device.to_json(), "nccl_warnings": warnings,
            "seconds": seconds}


def cluster_step(ctx: Context, *, master_addr: str, master_port: int, node_rank: int,
                 nproc: Mapping[int, int], nodes: list[int], prefix: str, backend: str,
                 iface: str | None = None) -> dict[str, Any]:
    """:func:`node_step` as ``preflight cluster``'s agent runs it: this node's ranks follow
    those of the nodes before it in ``nodes``, clients of the cluster's store at
    ``master_addr:master_port`` with keys under ``prefix`` (``preflight-cluster/e1/s4/ddp/``);
    gloo across nodes uses the interface of the
    route to the master (``iface``) unless the job names one."""
    offset = sum(nproc[n] for n in nodes if n < node_rank)
    spec = WorldSpec(store_host=master_addr, store_port=master_port,
                     store_prefix=prefix, rank_offset=offset,
                     world_size=sum(nproc[n] for n in nodes))
    env = dict(ctx.env)
    if backend == "gloo" and iface and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = iface
    return node_step(ctx, world=spec, backend=backend, nproc=nproc[node_rank], env=env)


def step_deadline_s(ctx: Context) -> float:
    """How long node 0 waits for every node's answer: the workers' start-up and one step."""
    from preflight.bench.options import DDP_START_S

    return DDP_START_S + ctx.config.ddp_timeout_s


def judge_world(answers: Mapping[int, Mapping[str, Any]], *, nodes: list[int]) -> dict[str, Any]:
    """Node 0's verdict of the world step from each node's :func:`node_step` answer (a node
    missing from ``answers`` did not answer in time)."""
    silent = [n for n in nodes if n not in answers]
    broken = {n: a for n, a in answers.items() if a.get("status") != "pass"}
    if silent or broken:
        # The first cause: a node whose ranks failed on their own, before those that only hung
        # waiting for it.
        named = sorted(broken.items(), key=lambda kv: (
            (kv[1].get("failure") or {}).get("kind") in ("hung", "timeout"), kv[0]))
        parts = [f"node {n}: {a.get('message')}" for n, a in named]
        if silent:
            parts.append(f"node(s) {', '.join(map(str, silent))} did not answer")
        status = worst([Status.parse(str(a.get("status", "error"))) for a in broken.values()]
                       + ([Status.FAIL] if silent else []))
        return {"status": status.word, "layer": "network" if status is Status.FAIL else None,
                "message": "; ".join(parts), "proofs": [],
                "nccl_warnings": [w for a in broken.values() for w in a.get("nccl_warnings", [])
                                  ][:20]}
    try:
        facts = [proofs.parse_facts(r) for n in nodes for r in answers[n].get("ranks", [])]
    except ValueError as exc:
        return {"status": "error", "layer": None, "message": f"a rank's report is malformed: "
                f"{exc}", "proofs": [], "nccl_warnings": []}
    found = [p for p in proofs.judge(facts) if p.name != "device"]
    devices = [answers[n].get("device") or {} for n in nodes]
    bad_dev = [f"node {n}: {d.get('message')}" for n, d in zip(nodes, devices, strict=True)
               if d.get("status") == "fail"]
    device = proofs.Proof("device", False if bad_dev else None if all(
        d.get("status") == "n/a" for d in devices) else True,
        "; ".join(bad_dev) or f"every node's ranks on the GPU their LOCAL_RANK maps to "
                              f"({len(nodes)} nodes)")
    every = [device, *found]
    false = [p for p in every if p.ok is False]
    return {"status": "fail" if false else "pass", "layer": "network" if false else "none",
            "message": "; ".join(f"{p.title}: no: {p.message}" for p in false) or
                       f"every rank of {len(nodes)} nodes: "
                       f"{sum(1 for p in every if p.ok)} proofs hold",
            # Per-rank figures (digests, losses) stay out: every node fetches this verdict.
            "proofs": [{**p.to_json(), "figures": {k: v for k, v in p.figures.items()
                                                   if not isinstance(v, dict)}} for p in every],
            "nccl_warnings": [], "ranks": len(facts)}
