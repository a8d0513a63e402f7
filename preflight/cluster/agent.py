"""One agent per node: the phases of ``preflight cluster`` over the store (docs/cluster.md).

Node 0 drives: it gathers arrivals, then publishes numbered steps (``step/<k>``: run the node
checks; run an all-reduce in these groups; the verdict) and gathers each node's answer
(``res/<k>/<node_rank>``) until every node answered or the step's deadline passed. The other
nodes follow the steps; each wait has a deadline, so no node hangs when node 0 or a peer stops.
Every node ends on the verdict node 0 published, so all print the same and exit with one code.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from preflight.bench import visible_gpus
from preflight.bench.parent import BenchOptions, WorldSpec, run_workers
from preflight.bench.procs import interpreter_facts
from preflight.bench.verdict import judge
from preflight.bench.worker import engines, wire
from preflight.checks import CHECKS, GPU_LOAD_CHECKS, master_port
from preflight.cluster import localise, parity
from preflight.cluster.options import ClusterOptions, ClusterUsageError
from preflight.cluster.store import GroupRelay, MasterLost, Rendezvous
from preflight.core.context import Context
from preflight.core.result import SCHEMA_VERSION, ExitCode, Status, exit_code, worst
from preflight.core.runner import run_checks, select
from preflight.probes.net import probe_interfaces, resolve_host, route_source

log = logging.getLogger(__name__)

#: Extra seconds a follower waits for node 0's next step beyond that step's own deadline.
SLACK_S = 5.0
#: After the verdict, node 0 keeps the store up this long for the others to read it.
LINGER_S = 5.0


@dataclass(frozen=True)
class RunSettings:
    """What the node runs: backend, GPUs (ranks) per node, all-reduce size, floor."""

    backend: str
    nproc: int
    size_bytes: int
    min_busbw_gbps: float | None
    bandwidth: bool
    bench_timeout_s: float
    python: str
    #: the workers' engine as asked (--engine, config bench_engine): auto, torch or nccl4py;
    #: node 0 decides one for every node (:func:`choose_engine`)
    engine: str = "auto"
    #: --ddp: the DDP ladder's step 4 over every rank of every node (preflight/ddp/world.py)
    ddp: bool = False


def has_nccl4py(python: str) -> bool | None:
    """Whether the workers' interpreter can import nccl4py (the GPU workers' own engine choice,
    :mod:`preflight.bench.worker.engines`); None when it could not be asked within 10 s."""
    found = interpreter_facts(python)
    return None if found is None else engines.has(found, "nccl4py")


def choose_engine(requested: str, backend: str, nccl4py: Mapping[int, bool | None]) -> str:
    """One engine for every node of the run, decided by node 0 from what each node can import.

    The nccl4py engine (no torch in the workers: ~0.6 s of imports against ~4 s) when asked for,
    or with ``auto`` when every node's workers can import it; else torch. gloo is torch's.
    """
    if backend == "gloo" or requested == "torch":
        return "torch"
    if requested == "nccl4py":
        return "nccl4py"
    return "nccl4py" if nccl4py and all(v is True for v in nccl4py.values()) else "torch"


Progress = Callable[[str], None]


def node_facts(ctx: Context, opts: ClusterOptions, settings: RunSettings) -> dict[str, Any]:
    """What this node tells the others on arrival: who it is, and the facts parity compares."""
    try:
        family, target = resolve_host(opts.master_addr, timeout_s=min(5.0, opts.timeout_s))[0]
        addr: str | None = route_source(family, target)
    except (OSError, TimeoutError, IndexError):
        addr = None
    iface = probe_interfaces().owner(addr) if addr else None
    snap = ctx.gpus()
    gpus, count, _ = visible_gpus(ctx)
    nccl4py = (has_nccl4py(settings.python)
               if settings.backend == "nccl" and settings.engine == "auto" and settings.bandwidth
               else None)
    return {"host": socket.gethostname(), "addr": addr, "pid": os.getpid(),
            "nnodes": opts.nnodes, "nproc": settings.nproc, "backend": settings.backend,
            "nccl4py": nccl4py,
            "interface": iface.name if iface else None,
            "facts": {"gpu_count": count if snap.available else None,
                      "gpu_model": ", ".join(sorted({g.name for g in gpus if g.name})) or None,
                      "mtu": iface.mtu if iface else None,
                      "env": {k: v for k, v in sorted(ctx.env.items())
                              if k.startswith(("NCCL_", "GLOO_"))}}}


def run_node_checks(ctx: Context) -> dict[str, Any]:
    """The checks of ``preflight check --no-bandwidth``, as JSON (results + fingerprint).

    Without ``master_port`` too: the rendezvous has just proven that MASTER_ADDR resolves and its
    port answers, and on node 0 that port is the cluster's own store (it would read as in use)."""
    skip = [*GPU_LOAD_CHECKS, master_port.NAME]
    report = run_checks(ctx, select(CHECKS, skip=skip), mode="cluster")
    data = report.to_json()
    fp = data.get("fingerprint") or {}
    return {"status": data["status"], "results": data["results"], "fingerprint": fp,
            "fingerprint_sha256": fp.get("sha256")}


def run_group(ctx: Context, opts: ClusterOptions, settings: RunSettings, *,
              nproc: Mapping[int, int], iface: str | None, group: list[int], prefix: str,
              floor_gbps: float | None, engine: str = "torch",
              relay: GroupRelay | None = None) -> dict[str, Any]:
    """This node's share of an all-reduce over the nodes of ``group`` (global ranks in node order;
    torch: every rank a client of the cluster's store under ``prefix``; nccl4py: the unique id
    goes through ``relay``, the store under the same prefix)."""
    me = opts.node_rank
    offset = sum(nproc[r] for r in group if r < me)
    world = sum(nproc[r] for r in group)
    env = dict(ctx.env)
    if settings.backend == "gloo" and iface and "GLOO_SOCKET_IFNAME" not in env:
        # Gloo binds the address the hostname resolves to unless told; use the master's route.
        env["GLOO_SOCKET_IFNAME"] = str(iface)
    spec = None if len(group) == 1 else WorldSpec(
        store_host=opts.master_addr, store_port=opts.master_port,
        store_prefix=f"preflight-cluster/{prefix}/", rank_offset=offset, world_size=world,
        relay=relay)
    labels = tuple(f"node {me} CPU {i}" if settings.backend == "gloo" else f"node {me} cuda:{i}"
                   for i in range(settings.nproc))
    warmup, iters = wire.ITERATIONS[settings.backend]
    bench = BenchOptions(backend=settings.backend, nproc=settings.nproc,
                         sizes=(settings.size_bytes,), timeout_s=settings.bench_timeout_s,
                         iters=iters, warmup=warmup,
                         labels=labels, env=env, python=settings.python, world=spec,
                         engine=engine)
    record = run_workers(bench)
    gpus = visible_gpus(ctx)[0][: settings.nproc] if len(group) == 1 else ()
    result = judge(record, gpus=gpus, min_busbw_gbps=floor_gbps)
    out = result.to_json()
    out["failure_kind"] = record.failure.kind if record.failure else None
    return out


class Agent:
    """The phases, for node 0 (:meth:`lead`) and the others (:meth:`follow`)."""

    def __init__(self, ctx: Context, opts: ClusterOptions, settings: RunSettings,
                 store: Rendezvous, *, progress: Progress | None = None) -> None:
        self.ctx, self.opts, self.settings, self.store = ctx, opts, settings, store
        self.progress = progress or (lambda _text: None)
        self.started = time.monotonic()
        self.k = 0
        self.peer_ops: dict[int, int] = {}
        self.nproc: dict[int, int] = {}
        self.info: dict[str, Any] = {}
        #: the workers' engine for every node, decided by node 0 after the arrivals
        self.engine = "torch"

    def _deadline(self, seconds: float) -> float:
        return time.monotonic() + seconds

    # ------------------------------------------------------------------ every node

    def arrive(self) -> dict[str, Any]:
        """Register; ClusterUsageError when another agent already took this node rank."""
        me = self.opts.node_rank
        info = node_facts(self.ctx, self.opts, self.settings)
        if self.store.add(f"claim/{me}", 1) > 1:
            raise ClusterUsageError(f"node rank {me} is taken twice: another agent already "
                                    f"registered as node {me}; give every node its own "
                                    "--node-rank")
        self.store.put("arrive", me, info)
        self.progress("arrived")
        return info

    def _do(self, k: int, step: Mapping[str, Any], nproc: Mapping[int, int]) -> Any:
        me = self.opts.node_rank
        if step["do"] == "checks":
            self.progress("node checks")
            return run_node_checks(self.ctx)
        if step["do"] == "ddp":
            from preflight.ddp.world import cluster_step

            self.progress("DDP over every node")
            return cluster_step(self.ctx, master_addr=self.opts.master_addr,
                                master_port=self.opts.master_port, node_rank=me, nproc=nproc,
                                nodes=list(step["nodes"]), prefix=f"s{k}/ddp",
                                backend=self.settings.backend, iface=self.info.get("interface"))
        for i, group in enumerate(step["groups"]):
            if me in group:
                self.progress(f"all-reduce {step['tag']} with nodes {group}")
                return run_group(self.ctx, self.opts, self.settings, nproc=nproc,
                                 iface=self.info.get("interface"), group=list(group),
                                 prefix=f"s{k}/g{i}",
                                 # --min-busbw is the network's floor; inside one node the
                                 # built-in table per GPU model and count judges.
                                 floor_gbps=None if step["tag"] == "intra"
                                 else self.settings.min_busbw_gbps,
                                 engine=str(step.get("engine", "torch")),
                                 relay=GroupRelay(self.store, f"s{k}/g{i}/"))
        return None

    def follow(self) -> dict[str, Any]:
        """A node other than 0: follow the steps to the verdict (or raise MasterLost)."""
        self.info = self.arrive()
        nproc: dict[int, int] = {}
        wait_s = self.opts.timeout_s + SLACK_S  # node 0 waits up to timeout_s for arrivals
        k = 0
        while True:
            if not self.store.wait_for(f"step/{k}", self._deadline(wait_s)):
                raise MasterLost(f"node 0 ({self.store.master}) published no step {k} within "
                                 f"{wait_s:g} s: it stopped answering (SIGSTOP, overload) or "
                                 "died; look at node 0's own output")
            step = self.store.get(f"step/{k}")
            if step["do"] == "verdict":
                return dict(step["verdict"])
            if k == 0:
                nproc = {int(r): int(n) for r, n in step["nproc"].items()}
            if self.opts.node_rank in nproc:
                answer = self._do(k, step, nproc)
                if answer is not None:
                    # The store traffic this node made so far, for the cost figures.
                    answer["store_ops"] = self.store.ops
                    self.store.put(f"res/{k}", self.opts.node_rank, answer)
            wait_s = float(step["deadline_s"]) + SLACK_S
            k += 1

    # ------------------------------------------------------------------ node 0

    def lead(self) -> dict[str, Any]:
        """Node 0: run every phase, publish and return the verdict."""
        o = self.opts
        self.info = self.arrive()
        self.progress("waiting for the other nodes")
        arrivals = self.store.gather("arrive", range(o.nnodes), self._deadline(o.timeout_s))
        missing = [r for r in range(o.nnodes) if r not in arrivals]
        v = Verdict(o.nnodes, arrivals, missing)
        self.nproc = {r: int(a["nproc"]) for r, a in arrivals.items()}
        self.engine = choose_engine(self.settings.engine, self.settings.backend,
                                    {r: a.get("nccl4py") for r, a in arrivals.items()})
        bad_n = {r: a["nnodes"] for r, a in arrivals.items() if a["nnodes"] != o.nnodes}
        if bad_n:
            v.usage = (f"the nodes disagree on the node count: node 0 has --nnodes {o.nnodes}, "
                       + ", ".join(f"node {r} has {n}" for r, n in sorted(bad_n.items()))
                       + "; start every agent with the same --nnodes (or the same launcher "
                       "variables)")
            return self._publish(0, v)
        # A check may take its own deadline (check_timeout_s) before the runner gives up on it.
        checks_s = max(o.timeout_s, self.ctx.config.check_timeout_s + SLACK_S)
        checks = self._step({"do": "checks", "deadline_s": checks_s,
                             "nproc": {str(r): a["nproc"] for r, a in arrivals.items()}},
                            sorted(arrivals), "node checks")
        v.checks = checks
        v.unresponsive.update({r: "node checks" for r in arrivals if r not in checks})
        flat = {r: parity.flatten(c.get("fingerprint"), arrivals[r]["facts"])
                for r, c in checks.items()}
        v.differences = parity.compare(flat) if len(flat) > 1 else []
        alive = sorted(checks)
        total = sum(int(arrivals[r]["nproc"]) for r in alive)
        if self.settings.bandwidth and total >= 2:
            self._world_and_localise(v, alive)
        if self.settings.ddp:
            from preflight.ddp.world import judge_world, step_deadline_s

            nodes = [r for r in alive if r not in v.unresponsive]
            got = self._step({"do": "ddp", "nodes": nodes, "deadline_s": step_deadline_s(
                self.ctx) + o.timeout_s}, nodes, "DDP over every node")
            v.unresponsive.update({r: "DDP over every node" for r in nodes if r not in got})
            v.ddp = judge_world(got, nodes=nodes)
        return self._publish(self.k, v)

    def _step(self, step: dict[str, Any], nodes: list[int], what: str) -> dict[int, Any]:
        k = self.k
        # The deadline runs from the publication, as on the other nodes (who wait for the next
        # step at most deadline_s + SLACK_S after their own part), not from the end of our part.
        deadline = self._deadline(float(step["deadline_s"]))
        self.store.set(f"step/{k}", step)
        mine = self._do(k, step, self.nproc) if 0 in nodes else None
        if mine is not None:
            self.store.put(f"res/{k}", 0, mine)
        self.progress(f"gathering {what}")
        got = self.store.gather(f"res/{k}", nodes, deadline)
        for r, answer in got.items():
            self.peer_ops[r] = max(self.peer_ops.get(r, 0), int(answer.pop("store_ops", 0)))
        self.k += 1
        return got

    def _group_run(self, v: Verdict, tag: str, groups: list[list[int]]
                   ) -> dict[tuple[int, ...], dict[str, Any]]:
        deadline = self.settings.bench_timeout_s + self.opts.timeout_s
        nodes = sorted(r for g in groups for r in g)
        got = self._step({"do": "allreduce", "tag": tag, "groups": groups,
                          "deadline_s": deadline, "engine": self.engine}, nodes,
                         f"all-reduce {tag}")
        v.unresponsive.update({r: f"all-reduce {tag}" for r in nodes if r not in got})
        return {tuple(g): merge_group(g, got) for g in groups}

    def _world_and_localise(self, v: Verdict, alive: list[int]) -> None:
        world = self._group_run(v, "world", [alive])[tuple(alive)]
        v.allreduce = world
        if Status.parse(world["status"]) <= Status.WARN or len(alive) < 2:
            return
        floor_given = self.settings.min_busbw_gbps
        alive = [r for r in alive if r not in v.unresponsive]
        multi = [[r] for r in alive if self.nproc[r] >= 2]
        if multi:
            res = self._group_run(v, "intra", multi)
            v.rounds.append(round_json("intra", res, None))
            for g, r in res.items():
                if Status.parse(r["status"]) >= Status.ERROR:
                    v.slow[g[0]] = f"its own all-reduce (no network): {r['message']}"
        pair_list, odd = localise.pairs([r for r in alive if r not in v.unresponsive])
        if not pair_list:
            return
        res = self._group_run(v, "pairs", [list(p) for p in pair_list])
        figures = {g: (r.get("busbw_gbps") if r["status"] != "error" and r["ok"] else None)
                   for g, r in res.items()}
        floor = localise.floor_of(figures, floor_given)
        v.rounds.append(round_json("pairs", res, floor))
        bad = localise.bad_groups(figures, floor)
        suspects = sorted({n for g in bad for n in g} | set(odd))
        good = [n for g in figures if g not in bad for n in g if n not in v.unresponsive]
        suspects = [s for s in suspects if s not in v.unresponsive]
        if not suspects:
            return
        matched, unmatched = localise.match(suspects, good)
        v.unmatched = unmatched
        if matched:
            res = self._group_run(v, "suspects", [list(p) for p in matched])
            figures = {g: (r.get("busbw_gbps") if r["ok"] else None) for g, r in res.items()}
            v.rounds.append(round_json("suspects", res, floor))
            for g in localise.bad_groups(figures, floor):
                fig = figures[g]
                v.slow[g[0]] = (f"with node {g[1]} (which passed) busbw "
                                f"{'failed' if fig is None else f'{fig:.4g} GB/s'}, floor "
                                f"{floor:.4g} GB/s" if floor is not None else "failed")

    def _publish(self, k: int, v: Verdict) -> dict[str, Any]:
        v.store = {"ops": self.store.ops, "bytes": self.store.bytes,
                   "other_nodes_ops": sum(self.peer_ops.values())}
        v.elapsed_s = time.monotonic() - self.started
        verdict = v.to_json()
        # The others get the verdict without every node's check results (kilobytes per node,
        # fetched by every node: quadratic at 1,000 nodes); node 0 prints them.
        compact = {**verdict, "nodes": [{**n, "results": [], "results_on": "node 0"}
                                        for n in verdict["nodes"]]}
        self.store.set(f"step/{k}", {"do": "verdict", "verdict": compact})
        # Keep the store up until every arrived node took the verdict (or LINGER_S passed).
        self.store.gather("got", [r for r in v.arrivals if r != 0], self._deadline(LINGER_S))
        return verdict

    def ack(self) -> None:
        """A follower tells node 0 it has the verdict (so node 0 can stop the store)."""
        self.store.put("got", self.opts.node_rank, True)


def merge_group(group: list[int], got: Mapping[int, Any]) -> dict[str, Any]:
    """One all-reduce over several nodes: node results merged, the first cause named."""
    answers = {r: got[r] for r in group if r in got}
    silent = [r for r in group if r not in got]
    base = dict(answers[min(answers)]) if answers else {"status": "error", "busbw_gbps": None}
    named = []
    for r, res in sorted(answers.items()):
        if res["status"] in ("fail", "error") and res.get("failure_kind") not in (None, "hung",
                                                                                 "timeout"):
            named.append(f"node {r}: {res['message']}")
    statuses = [Status.parse(a["status"]) for a in answers.values()] or [Status.ERROR]
    status = worst([*statuses, *([Status.FAIL] if silent else [])])
    if silent:
        named.append(f"node(s) {', '.join(map(str, silent))} did not report (agent stopped)")
    if named:
        base["message"] = "; ".join(named)
    base["status"] = status.word
    base["nodes"] = group
    base["ok"] = status <= Status.WARN and bool(answers) and not silent
    return base


def round_json(name: str, res: Mapping[tuple[int, ...], Mapping[str, Any]], floor: float | None
               ) -> dict[str, Any]:
    return {"round": name, "floor_gbps": floor,
            "groups": [{"nodes": list(g), "status": r["status"], "busbw_gbps":
                        r.get("busbw_gbps"), "message": r.get("message", "")}
                       for g, r in res.items()]}


class Verdict:
    """Findings of every phase, turned into the JSON every node prints (docs/cluster.md)."""

    def __init__(self, nnodes: int, arrivals: Mapping[int, Any], missing: list[int]) -> None:
        self.nnodes, self.arrivals, self.missing = nnodes, dict(arrivals), missing
        self.usage: str | None = None
        self.checks: dict[int, Any] = {}
        self.unresponsive: dict[int, str] = {}
        self.differences: list[dict[str, Any]] = []
        self.allreduce: dict[str, Any] | None = None
        self.rounds: list[dict[str, Any]] = []
        self.slow: dict[int, str] = {}
        self.unmatched: list[int] = []
        self.store: dict[str, int] = {}
        self.elapsed_s = 0.0
        self.ddp: dict[str, Any] | None = None

    def _name(self, r: int) -> str:
        host = self.arrivals.get(r, {}).get("host")
        return f"node {r} ({host})" if host else f"node {r}"

    def findings(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def add(status: Status, reason: str, message: str, remedy: str) -> None:
            out.append({"status": status.word, "reason": reason, "message": message,
                        "remedy": remedy})

        if self.missing:
            add(Status.FAIL, "NodesMissing",
                f"{len(self.missing)} of {self.nnodes} node(s) did not arrive: node rank(s) "
                f"{', '.join(map(str, self.missing))}",
                "Look at why their agent did not start (srun/kubectl logs for those nodes); "
                "every node must run preflight cluster with the same master.")
        for r, phase in sorted(self.unresponsive.items()):
            add(Status.FAIL, "NodeUnresponsive",
                f"{self._name(r)} arrived but did not answer in {phase} before the deadline",
                f"Inspect that node (ps, dmesg; the agent may be stopped or hung): ssh "
                f"{self.arrivals.get(r, {}).get('host', 'NODE')} 'ps -eo pid,stat,cmd | grep "
                "preflight'")
        for r, c in sorted(self.checks.items()):
            st = Status.parse(c["status"])
            if st >= Status.ERROR:
                bad = [f"{x['check']} {x['status']}: {x['message']}" for x in c["results"]
                       if Status.parse(x["status"]) >= Status.ERROR]
                add(st, "NodeChecksFailed", f"{self._name(r)}: " + "; ".join(bad),
                    "Run preflight check on that node for the remedies of each check.")
        if self.differences:
            add(Status.FAIL, "ParityMismatch",
                "; ".join(parity.describe(d) for d in self.differences),
                "Make the odd node(s) match the majority (same image / venv / NCCL_* settings);"
                " preflight fingerprint --json on two nodes, then preflight diff A B.")
        if self.allreduce is not None and Status.parse(self.allreduce["status"]) > Status.WARN:
            add(Status.parse(self.allreduce["status"]), "WorldAllreduce" +
                ("Slow" if self.allreduce.get("reason") == "BusbwLow" else "Failed"),
                f"the all-reduce over all nodes: {self.allreduce['message']}",
                "See slow_nodes and localisation for the node to blame (docs/cluster.md).")
        for r, why in sorted(self.slow.items()):
            add(Status.FAIL, "SlowNode", f"{self._name(r)} is slow: {why}",
                "Drain it and check its NIC (ethtool -S, link speed, tc qdisc show) and cables.")
        if self.ddp is not None and self.ddp["status"] in ("fail", "error"):
            add(Status.parse(self.ddp["status"]), "DdpWorldFailed",
                f"DDP over every rank of every node: {self.ddp['message']}",
                "preflight ddp on each node names a layer of its own (docs/ddp.md); between the "
                "nodes: MASTER_ADDR, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on every node, a "
                "firewall between them.")
        if self.unmatched:
            add(Status.FAIL, "SlowNetwork",
                f"more suspects than good nodes ({', '.join(map(str, self.unmatched))} not "
                "isolated): the network as a whole is slow, not one node",
                "Check the fabric (switch ports, NCCL_SOCKET_IFNAME / NCCL_IB_HCA on all nodes).")
        return out

    def to_json(self) -> dict[str, Any]:
        findings = self.findings()
        if self.usage is not None:
            status, code = Status.ERROR, ExitCode.USAGE
            findings = [{"status": "error", "reason": "ClusterUsage", "message": self.usage,
                         "remedy": ""}]
        else:
            status = worst(Status.parse(f["status"]) for f in findings)
            code = exit_code(status)
        nodes = []
        for r, a in sorted(self.arrivals.items()):
            c = self.checks.get(r)
            st = ("fail" if r in self.slow or r in self.unresponsive
                  or any(str(r) in d["odd_nodes"] or r in d["odd_nodes"]
                         for d in self.differences)
                  else c["status"] if c else "error")
            nodes.append({"node_rank": r, "host": a.get("host"), "addr": a.get("addr"),
                          "interface": a.get("interface"), "nproc": a.get("nproc"),
                          "status": st, "results": c["results"] if c else [],
                          "fingerprint_sha256": c.get("fingerprint_sha256") if c else None})
        return {"schema_version": SCHEMA_VERSION, "mode": "cluster", "status": status.word,
                "exit_code": int(code), "nnodes": self.nnodes, "nodes": nodes,
                "missing_nodes": self.missing,
                "unresponsive_nodes": [{"node_rank": r, "phase": p}
                                       for r, p in sorted(self.unresponsive.items())],
                "parity": {"status": "fail" if self.differences else "pass",
                           "differences": self.differences},
                "allreduce": self.allreduce, "slow_nodes": sorted(self.slow),
                "localisation": {"rounds": self.rounds, "unisolated": self.unmatched},
                "findings": findings, "store": self.store, "ddp": self.ddp,
                "elapsed_s": round(self.elapsed_s, 3)}

