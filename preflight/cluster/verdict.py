"""The cluster verdict: what every phase found, as the JSON every node prints and node 0's table.

One place for the verdict (docs/cluster.md): node 0 fills a :class:`Verdict` as the phases run;
:meth:`Verdict.to_json` makes the findings, the exit code and the node rows; :func:`render` the
text. Everything a peer sent (a hostname, a message, an interface name) is made printable here
(:func:`preflight.core.textsafe.escape`) before a terminal sees it, and a remedy quotes it for the
shell (``shlex.quote``), or uses the node's address when the name is not a plain hostname.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping
from typing import Any

from preflight.cluster import parity
from preflight.cluster.localise import Conclusion
from preflight.cluster.roll import Roll
from preflight.core.result import SCHEMA_VERSION, ExitCode, Status, exit_code, worst
from preflight.core.textsafe import escape

_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
#: Findings that name node ranks list at most this many (the rest are counted).
MAX_LISTED = 64


def listed(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:MAX_LISTED]))
    return shown + (f" and {len(ranks) - MAX_LISTED} more" if len(ranks) > MAX_LISTED else "")


def ssh_target(arrival: Mapping[str, Any] | None, rank: int) -> str:
    """What to ssh to for a node: its hostname when it is a plain one, else its address."""
    a = arrival or {}
    host, addr = a.get("host"), a.get("addr")
    if isinstance(host, str) and _HOSTNAME.match(host):
        return shlex.quote(host)
    if isinstance(addr, str):
        try:
            return str(ipaddress.ip_address(addr))
        except ValueError:
            pass
    return f"<node {rank}>"


def round_json(name: str, res: Mapping[tuple[int, ...], Mapping[str, Any]], bar: float | None
               ) -> dict[str, Any]:
    return {"round": name, "bar_gbps": round(bar, 4) if bar is not None else None,
            "groups": [{"nodes": list(g), "status": r["status"],
                        "busbw_gbps": r.get("busbw_gbps"),
                        "link_efficiency": r.get("link_efficiency"),
                        "message": r.get("message", "")} for g, r in res.items()]}


class Verdict:
    """Findings of every phase, turned into the JSON every node prints (docs/cluster.md)."""

    def __init__(self, nnodes: int, roll: Roll, *, missing: list[int]) -> None:
        self.nnodes, self.roll, self.missing = nnodes, roll, missing
        self.checks: dict[int, dict[str, Any]] = {}
        self.unresponsive: dict[int, str] = {}
        self.differences: list[dict[str, Any]] = []
        self.allreduce: dict[str, Any] | None = None
        self.rounds: list[dict[str, Any]] = []
        self.conclusion: Conclusion | None = None
        #: with fewer than 3 nodes: the nodes whose own workers failed the world run
        self.failed: dict[int, str] = {}
        self.store: dict[str, int] = {}
        self.elapsed_s = 0.0
        #: --ddp: node 0's judgement of the DDP training over every node (ddp.world.judge_world)
        self.ddp: dict[str, Any] | None = None

    def _name(self, r: int) -> str:
        host = (self.roll.accepted.get(r) or {}).get("host")
        return f"node {r} ({host})" if host else f"node {r}"

    @property
    def slow(self) -> dict[int, str]:
        return dict(self.conclusion.slow) if self.conclusion else {}

    @property
    def failed_nodes(self) -> dict[int, str]:
        return {**self.failed, **(self.conclusion.failed if self.conclusion else {})}

    def findings(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def add(status: Status, reason: str, message: str, remedy: str) -> None:
            out.append({"status": status.word, "reason": reason, "message": message,
                        "remedy": remedy})

        acc = self.roll.accepted
        if self.missing:
            add(Status.FAIL, "NodesMissing",
                f"{len(self.missing)} of {self.nnodes} node(s) did not arrive: node rank(s) "
                f"{listed(self.missing)}",
                "Look at why their agent did not start (srun/kubectl logs for those nodes); "
                "every node must run preflight cluster with the same master.")
        for g in self.roll.garbage:
            who = self._name(g["node_rank"]) if g["node_rank"] is not None else "an agent"
            add(Status.FAIL, "NodeSentGarbage",
                f"{who} sent an invalid {g['what']}: {g['why']}",
                "Run the same preflight version on every node (preflight --version); if it is, "
                "something else writes to the master port's store: look at what connects to it "
                "(ss -tnp 'dport = :PORT' on node 0).")
        for r, phase in sorted(self.unresponsive.items()):
            add(Status.FAIL, "NodeUnresponsive",
                f"{self._name(r)} arrived but did not answer in {phase} before the deadline",
                f"Inspect that node (the agent may be stopped or hung): ssh "
                f"{ssh_target(acc.get(r), r)} "
                f"{shlex.quote('ps -eo pid,stat,cmd | grep preflight')}")
        for r, c in sorted(self.checks.items()):
            st = Status.parse(c["status"])
            if st >= Status.ERROR:
                bad = [f"{x['check']} {x['status']}: {x['message']}" for x in c["results"]
                       if Status.parse(x["status"]) >= Status.ERROR]
                add(st, "NodeChecksFailed", f"{self._name(r)}: " + "; ".join(bad),
                    "Run preflight check on that node for the remedies of each check.")
        if self.differences:
            add(Status.FAIL, "ParityMismatch",
                "; ".join(parity.describe(d) for d in self.differences[:MAX_LISTED]),
                "Make the odd node(s) match the majority (same image / venv / NCCL_* settings);"
                " preflight fingerprint --json on two nodes, then preflight diff A B.")
        self._bandwidth_findings(add)
        if self.ddp is not None and self.ddp["status"] in ("fail", "error"):
            add(Status.parse(self.ddp["status"]), "DdpWorldFailed",
                f"DDP over every rank of every node: {self.ddp['message']}",
                "preflight ddp on each node names a layer of its own (preflight docs ddp); "
                "between the nodes: MASTER_ADDR, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on "
                "every node, a firewall between them.")
        return out

    def _bandwidth_findings(self, add: Any) -> None:
        ar, acc = self.allreduce, self.roll.accepted
        c = self.conclusion
        if ar is not None:
            st = Status.parse(ar["status"])
            reason = ("WorldAllreduceFailed" if ar.get("reason") == "AllreduceFailed" else
                      "WorldAllreduceSlow" if st >= Status.ERROR else ar.get("reason", ""))
            if st >= Status.WARN:
                add(st, reason, f"the all-reduce over all nodes: {ar['message']}",
                    "See failed_nodes, slow_nodes and localisation for the node(s) to blame "
                    "(preflight docs cluster)." if st >= Status.ERROR else
                    "Give the network's floor (--min-busbw) or check the link speeds "
                    "(preflight docs cluster, 'The expectation from the hardware').")
        for r, why in sorted(self.failed_nodes.items()):
            add(Status.FAIL, "NodeFailed", f"{self._name(r)} failed (not slow): {why}",
                "Read the reason: NCCL's own words are quoted; ssh "
                f"{ssh_target(acc.get(r), r)} and rerun preflight bench there.")
        for r, why in sorted(self.slow.items()):
            iface = str((acc.get(r) or {}).get("interface") or "<nic>")
            remote = (f"ethtool {shlex.quote(iface)}; tc qdisc show dev {shlex.quote(iface)}; "
                      f"ip -s link show {shlex.quote(iface)}")
            add(Status.FAIL, "SlowNode", f"{self._name(r)} is slow: {why}",
                f"Drain it and look at its link and cables: ssh {ssh_target(acc.get(r), r)} "
                f"{shlex.quote(remote)}")
        if c is None:
            return
        measured_slow = [j for j in c.judged if j.state == "low"]
        world_slow = ar is not None and ar.get("reason") in ("BusbwLow", "BelowLink")
        if c.slow_by_floor_only() or (c.suspects and not c.good and measured_slow):
            add(Status.FAIL, "SlowNetwork",
                f"the groups across nodes are alike and below their floor (node(s) "
                f"{listed(c.suspects) or 'none'} not isolated): the network as a whole is slow, "
                "not one node", "Check the fabric (switch ports, NCCL_SOCKET_IFNAME / "
                "NCCL_IB_HCA on all nodes, the link speeds).")
        elif world_slow and not self.slow and not self.failed_nodes and not c.suspects:
            add(Status.FAIL, "SlowNetwork",
                "every pair of nodes reaches its bar but the all-reduce over all nodes does "
                "not: the fabric is slow under the full load (an oversubscribed spine, "
                "congestion), not one node", "Check the switches between the racks.")
        elif c.suspects and not any(j.outcome.busbw_gbps is not None for j in c.judged):
            add(Status.FAIL, "AllreduceFailedEverywhere",
                f"every all-reduce across nodes failed, in every pair (node(s) "
                f"{listed(c.suspects)}): a setting, driver or version common to the nodes, not "
                "one node; see the world all-reduce's reason",
                "Run preflight check on one node and preflight bench on two; compare NCCL_* and "
                "the interfaces (NCCL_SOCKET_IFNAME, NCCL_IB_HCA).")
        elif c.suspects:
            add(Status.FAIL, "NodesNotIsolated",
                f"node(s) {listed(c.suspects)} were in slow or failed groups but localisation "
                "could not tell which of them is at fault within its rounds",
                "Run preflight cluster again on those nodes with a few known good ones.")

    def to_json(self, *, full: bool = True) -> dict[str, Any]:
        findings = self.findings()
        if self.roll.usage:
            status, code = Status.ERROR, ExitCode.USAGE
            findings = [{"status": "error", "reason": "ClusterUsage",
                         "message": "; ".join(self.roll.usage[:MAX_LISTED]),
                         "remedy": "Start every agent with the same --nnodes, --timeout and "
                                   "--backend, each with its own --node-rank."}]
        else:
            status = worst(Status.parse(f["status"]) for f in findings)
            code = exit_code(status)
        c = self.conclusion
        out = {"schema_version": SCHEMA_VERSION, "mode": "cluster", "status": status.word,
               "exit_code": int(code), "nnodes": self.nnodes,
               "nodes": self.rows() if full else [],
               "missing_nodes": self.missing,
               "unresponsive_nodes": [{"node_rank": r, "phase": p}
                                      for r, p in sorted(self.unresponsive.items())],
               "restarted_nodes": sorted(self.roll.restarts),
               "garbage": list(self.roll.garbage[:MAX_LISTED]),
               "parity": {"status": "fail" if self.differences else "pass",
                          "differences": self.differences},
               "allreduce": self._allreduce_json(full),
               "slow_nodes": sorted(self.slow), "failed_nodes": sorted(self.failed_nodes),
               "localisation": {"rounds": self.rounds if full else [],
                                "unisolated": c.suspects if c else [],
                                "good": len(c.good) if c else None},
               "findings": findings, "store": self.store, "ddp": self.ddp,
               "elapsed_s": round(self.elapsed_s, 3)}
        if not full:
            out["rows_on"] = "node 0"
        return out

    def _allreduce_json(self, full: bool) -> dict[str, Any] | None:
        if self.allreduce is None or full:
            return self.allreduce
        keep = ("status", "reason", "message", "busbw_gbps", "world_size", "backend", "ok",
                "nodes", "link_efficiency", "link_basis", "engine")
        out = {k: self.allreduce.get(k) for k in keep}
        out["nodes"] = f"{len(self.allreduce.get('nodes') or [])} nodes"
        return out

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        odd: dict[int, list[str]] = {}
        for d in self.differences:
            for r in d["odd_nodes"]:
                odd.setdefault(int(r), []).append(d["key"])
        for r, a in sorted(self.roll.accepted.items()):
            if r in self.roll.late:
                continue
            c = self.checks.get(r)
            why = self._why(r, c, odd.get(r, []))
            bad = (r in self.slow or r in self.failed_nodes or r in self.unresponsive or odd.get(r)
                   or any(g["node_rank"] == r for g in self.roll.garbage))
            rows.append({"node_rank": r, "host": a.get("host"), "addr": a.get("addr"),
                         "interface": a.get("interface"), "nproc": a.get("nproc"),
                         "link": a.get("link"),
                         "status": "fail" if bad else c["status"] if c else "error",
                         "why": why, "results": c["results"] if c else [],
                         "fingerprint_sha256": c.get("fingerprint_sha256") if c else None})
        return rows

    def _why(self, r: int, c: Mapping[str, Any] | None, odd: list[str]) -> list[str]:
        """What made the node warn or fail: each check (and cluster phase) with its reason."""
        why = []
        if r in self.slow:
            why.append("slow (localisation)")
        if r in self.failed_nodes:
            why.append("failed (all-reduce)")
        if r in self.unresponsive:
            why.append(f"did not answer ({self.unresponsive[r]})")
        why += [f"sent an invalid {g['what']}" for g in self.roll.garbage if g["node_rank"] == r]
        if odd:
            why.append("parity: " + ", ".join(odd[:4]) + (" ..." if len(odd) > 4 else ""))
        for x in (c or {}).get("results", []):
            if Status.parse(x["status"]) >= Status.WARN:
                why.append(f"{x['check']} {x['status']} {x['reason']}")
        return why


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} GB/s"


def one_line(v: Mapping[str, Any]) -> str:
    f = v["findings"]
    head = f"cluster {v['status'].upper()}: {v['nnodes'] - len(v['missing_nodes'])}/" \
           f"{v['nnodes']} nodes"
    for key, word in (("slow_nodes", "slow"), ("failed_nodes", "failed"),
                      ("missing_nodes", "missing")):
        if v.get(key):
            head += f", {word}: {listed(list(v[key]))}"
    return escape(head + (f" ({f[0]['reason']}: {f[0]['message']})" if f else ""), 2000)


def render(v: Mapping[str, Any], *, full: bool, node_rank: int) -> str:
    """Node 0's table (``full``), or one line; every peer's text escaped."""
    if not full or not v["nodes"]:
        return f"node {node_rank}: {one_line(v)}"
    lines = [one_line(v), "", f"{'node':>4}  {'host':<20} {'addr':<16} {'status':<6} "
             f"{'link':<14} why"]
    for n in v["nodes"]:
        link = n.get("link") or {}
        speed = (f"{link['gbps']:g} Gb/s {link['transport']}" if link.get("gbps") is not None
                 else f"? {link.get('transport', '')}")
        why = "; ".join(n["why"]) or "-"
        lines.append(f"{n['node_rank']:>4}  {escape(str(n['host']), 20):<20} "
                     f"{escape(str(n['addr']), 16):<16} {n['status']:<6} {escape(speed, 14):<14} "
                     f"{escape(why, 200)}")
    for r in v["missing_nodes"][:MAX_LISTED]:
        lines.append(f"{r:>4}  {'(did not arrive)':<20}")
    ar = v.get("allreduce")
    if ar:
        eff = ar.get("link_efficiency")
        lines += ["", f"world all-reduce: {ar['status']}, busbw {_gbps(ar.get('busbw_gbps'))}"
                  + (f" ({eff:.2f} of the slowest link)" if eff is not None else "")
                  + f": {escape(str(ar.get('message', '')), 1000)}"]
    for rnd in v["localisation"]["rounds"]:
        groups = "; ".join(f"{g['nodes']} {g['status']} {_gbps(g['busbw_gbps'])}"
                           for g in rnd["groups"][:MAX_LISTED])
        bar = f" (bar {rnd['bar_gbps']:.4g} GB/s)" if rnd.get("bar_gbps") is not None else ""
        lines.append(f"round {rnd['round']}{bar}: {groups}")
    for f in v["findings"]:
        lines += ["", f"{f['status'].upper()} {f['reason']}: {escape(f['message'], 4000)}"]
        if f["remedy"]:
            lines.append(f"  remedy: {escape(f['remedy'], 1000)}")
    lines.append(f"\nverdict in {v['elapsed_s']:.1f} s; store: {v['store'].get('ops', 0)} requests "
                 "by node 0")
    return "\n".join(lines)
