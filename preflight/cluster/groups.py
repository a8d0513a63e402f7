"""One all-reduce group across nodes: this node's share of it (the bench workers), the merge of
every node's answer into one result, and its judgement against the floors.

A group that failed is reported as failed with what its workers said, never as slow: the bench
parent keeps the tail of each failed rank's log (``RankState.traceback``), and the workers run
with ``NCCL_DEBUG=WARN`` (unless the job sets ``NCCL_DEBUG``), so NCCL's own reason reaches the
verdict ("Duplicate GPU detected", "Bootstrap : no socket interface found").

A figure across nodes is judged against ``--min-busbw`` and, with nccl, against the slowest
node's link: NCCL reaches 0.92-0.98 of an RDMA port's line rate (NVIDIA: 12 GB/s per 100 Gb/s
NIC, 24 per 200, 46-48 per 400: nccl-tests#29, #119, #290) but only 0.3-0.9 of an Ethernet
link over its socket transport, depending on NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD
(nccl#209, nccl#450). Below ``cluster_link_floor`` (0.5) of the link an RDMA run FAILs and a
socket run WARNs. gloo on CPU is a plumbing test: its efficiency is shown, never judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from preflight.bench import visible_gpus
from preflight.bench.options import BenchOptions, WorldSpec
from preflight.bench.parent import run_workers
from preflight.bench.records import RunRecord
from preflight.bench.verdict import judge
from preflight.cluster import wire
from preflight.core.context import Context
from preflight.core.result import Status, worst

#: Timed iterations (and warm-ups) of a cluster all-reduce: enough that healthy pairs agree
#: within a few % (docs/cluster.md, "How noisy").
ITERS = {"nccl": 20, "gloo": 10}
WARMUP = {"nccl": 5, "gloo": 2}
#: The bench parent's failure kinds that mean "this node's workers waited for others".
WAITED = ("hung", "timeout")
#: Failure kinds by how surely they are the node's own (and the first cause of the others).
_CAUSE = {"stalled": 0, "died": 1, "error": 2, "spawn": 3, "slow_start": 4}
#: At most this many distinct NCCL WARN lines are kept per node.
MAX_WARNINGS = 8


def record_warnings(record: RunRecord) -> list[str]:
    """The distinct ``NCCL WARN`` messages of this node's workers (the bench parent keeps the
    first ones of each worker's log), first first."""
    seen = dict.fromkeys(" ".join(w.split()) for st in record.ranks for w in st.nccl_warnings)
    return [w for w in seen if w][:MAX_WARNINGS]


def worker_env(env: Mapping[str, str], *, backend: str, iface: str | None) -> dict[str, str]:
    """The environment of this node's workers for a group across nodes."""
    out = dict(env)
    if backend == "gloo" and iface and "GLOO_SOCKET_IFNAME" not in out:
        # Gloo binds the address the hostname resolves to unless told; use the master's route.
        out["GLOO_SOCKET_IFNAME"] = iface
    # NCCL's own words for a failure (the job's NCCL_DEBUG, when set, is kept).
    out.setdefault("NCCL_DEBUG", "WARN")
    return out


def run_share(ctx: Context, *, me: int, group: Sequence[int], nproc: Callable[[int], int],
              backend: str, size_bytes: int, timeout_s: float, python: str, engine: str,
              iface: str | None, master: tuple[str, int], prefix: str, relay: Any,
              min_busbw_gbps: float | None) -> dict[str, Any]:
    """This node's workers for one group (global ranks in node order, every rank a client of the
    cluster's store under ``prefix``, or the nccl4py unique id through ``relay``)."""
    offset = sum(nproc(r) for r in group if r < me)
    world = sum(nproc(r) for r in group)
    local = nproc(me)
    spec = None if len(group) == 1 else WorldSpec(
        store_host=master[0], store_port=master[1], store_prefix=prefix, rank_offset=offset,
        world_size=world, relay=relay)
    labels = tuple(f"node {me} CPU {i}" if backend == "gloo" else f"node {me} cuda:{i}"
                   for i in range(local))
    bench = BenchOptions(backend=backend, nproc=local, sizes=(size_bytes,), timeout_s=timeout_s,
                         iters=ITERS[backend], warmup=WARMUP[backend], labels=labels,
                         env=worker_env(ctx.env, backend=backend, iface=iface), python=python,
                         world=spec, engine=engine)
    record = run_workers(bench)
    gpus = visible_gpus(ctx)[0][:local] if len(group) == 1 else ()
    # Inside one node the built-in table per GPU model judges; across nodes node 0 does.
    result = judge(record, gpus=gpus, min_busbw_gbps=min_busbw_gbps if len(group) == 1 else None)
    out = result.to_json()
    out["failure_kind"] = record.failure.kind if record.failure else None
    out["nccl_warnings"] = record_warnings(record)
    return out


def merge(group: Sequence[int], got: Mapping[int, Mapping[str, Any]],
          garbage: Sequence[int] = ()) -> dict[str, Any]:
    """Every node's answer for one group as one result: the worst status, the smallest figure,
    and the first cause named (nodes whose own workers failed, not those that waited)."""
    answers = {r: got[r] for r in group if r in got}
    silent = [r for r in group if r not in got and r not in garbage]
    base: dict[str, Any] = (dict(answers[min(answers)]) if answers else
                            {"status": "error", "busbw_gbps": None, "reason": "NoAnswer",
                             "message": ""})
    named = []
    own: list[int] = []
    # The strongest cause first: a rank that stopped or died explains the others' late start.
    for r, res in sorted(answers.items(), key=lambda kv: (_CAUSE.get(
            str(kv[1].get("failure_kind")), len(_CAUSE)), kv[0])):
        if res["status"] in ("fail", "error") and res.get("failure_kind") not in (None, *WAITED):
            named.append(f"node {r}: {res['message']}")
            own.append(r)
    own.sort()
    statuses = [Status.parse(a["status"]) for a in answers.values()] or [Status.ERROR]
    status = worst([*statuses, *([Status.FAIL] if silent or garbage else [])])
    if silent:
        named.append(f"node(s) {', '.join(map(str, silent))} did not report (agent stopped)")
    if garbage:
        named.append(f"node(s) {', '.join(map(str, garbage))} sent an invalid answer")
    warns = list(dict.fromkeys(w for a in answers.values()
                               for w in a.get("nccl_warnings", [])))[:MAX_WARNINGS]
    if named:
        base["message"] = "; ".join(named)
    if warns and status > Status.WARN:
        base["message"] = f"{base.get('message', '')}; NCCL said: {' | '.join(warns)}"
    figures = [a["busbw_gbps"] for a in answers.values() if a.get("busbw_gbps") is not None]
    failed = status >= Status.ERROR or any(a.get("failure_kind") for a in answers.values())
    base.update(status=status.word, nodes=list(group), nccl_warnings=warns,
                ok=not failed and not silent and not garbage and bool(answers),
                busbw_gbps=min(figures) if figures and not failed else None,
                failed_nodes=own or ([] if not failed else sorted(set(silent) | set(garbage))))
    return base


def min_link(links: Sequence[Mapping[str, Any] | None]) -> wire.Link | None:
    """The slowest of the nodes' links, None when any is unknown."""
    parsed = [wire.Link.parse(x) for x in links if x is not None]
    if len(parsed) < len(links) or any(x.gbps is None for x in parsed) or not parsed:
        return None
    return min(parsed, key=lambda x: x.gbps or 0.0)


def floor_for(backend: str, link: wire.Link | None, *, min_busbw_gbps: float | None,
              link_floor: float) -> float | None:
    """A group's absolute floor in GB/s: --min-busbw, and with nccl over RDMA the link fraction."""
    floors = [f for f in (min_busbw_gbps,) if f is not None]
    if backend == "nccl" and link is not None and link.gbps and link.transport == "rdma":
        floors.append(link_floor * link.gbps / 8)
    return max(floors) if floors else None


def judge_across(merged: dict[str, Any], *, backend: str, link: wire.Link | None,
                 min_busbw_gbps: float | None, link_floor: float) -> dict[str, Any]:
    """``merged`` with its verdict across nodes (status, reason, message, link efficiency)."""
    out = dict(merged)
    bw = out.get("busbw_gbps")
    eff = bw / (link.gbps / 8) if bw is not None and link is not None and link.gbps else None
    out.update(link_bytes_per_second=link.gbps * 1e9 / 8 if link and link.gbps else None,
               link_basis=link.basis if link else None,
               link_efficiency=round(eff, 4) if eff is not None else None,
               link_transport=link.transport if link else None)
    if not out.get("ok"):
        out["status"] = worst([Status.parse(out["status"]), Status.FAIL]).word
        out["reason"] = "AllreduceFailed"
        return out
    assert bw is not None
    at = f"busbw {bw:.4g} GB/s across {len(out['nodes'])} nodes"
    eff_text = (f", {eff:.2f} of the slowest node's link ({link.basis})"
                if eff is not None and link is not None else "")
    if min_busbw_gbps is not None and bw < min_busbw_gbps:
        out.update(status="fail", reason="BusbwLow",
                   message=f"{at}, below --min-busbw {min_busbw_gbps:g} GB/s{eff_text}")
    elif backend == "nccl" and eff is not None and eff < link_floor and link is not None:
        out.update(status="fail" if link.transport == "rdma" else "warn",
                   reason="BelowLink" if link.transport == "rdma" else "SocketLinkUnderused",
                   message=f"{at}{eff_text}, below {link_floor:g} of it (NCCL reaches "
                           + ("0.92-0.98 of an RDMA link" if link.transport == "rdma" else
                              "0.3-0.9 of an Ethernet link over sockets, with tuning") + ")")
    elif backend == "nccl" and eff is None and min_busbw_gbps is None:
        out.update(status="warn", reason="NoReference",
                   message=f"{at}; no floor: the link speed of a node is unknown and no "
                           "--min-busbw was given")
    else:
        out.update(status="pass", reason="AllreduceOk", message=f"{at}{eff_text}")
    return out
