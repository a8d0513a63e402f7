"""One agent per node: the phases of ``preflight cluster`` over the store (docs/cluster.md).

Node 0 drives: it opens an epoch (``preflight-cluster/e<n>/``), announces its ``--nnodes`` and
``--timeout`` (``lead``), reads the arrivals log (:mod:`preflight.cluster.roll`) until every node
rank arrived or its deadline passed, acknowledges each agent (``ok/<nonce>``: the step to start
from, or why it is refused), then publishes numbered steps (``step/<k>``: run the node checks; run
an all-reduce in these groups; the verdict) and reads each node's answer from the step's log. The
other nodes follow: every wait has a deadline taken from node 0's own (its ``lead``), so every node
ends on the verdict node 0 published, prints the same and exits with one code. What a node runs
(checks, its share of an all-reduce) comes from a :class:`Runner`: the bench workers for real,
synthetic figures in the scale simulation (benchmarks/cluster_sim.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from preflight.cluster import localise, parity, wire
from preflight.cluster.facts import choose_engine
from preflight.cluster.groups import floor_for, judge_across, merge, min_link
from preflight.cluster.options import ClusterOptions, ClusterUsageError
from preflight.cluster.roll import Entry, LogReader, Roll, write
from preflight.cluster.store import MasterLost, Rendezvous
from preflight.cluster.verdict import Verdict, round_json
from preflight.core.result import Status

#: Extra seconds a follower waits for node 0's next step beyond that step's own deadline.
SLACK_S = 5.0
#: After the verdict, node 0 keeps the store up this long for the others to read it.
LINGER_S = 5.0
#: Node 0 looks at a log at least this often while it waits (and at once when it completes).
LOOK_S = 0.5
#: A follower re-joins a new epoch (node 0 restarted in torchrun's store) at most this often.
MAX_REJOINS = 3
#: A follower's server-side waits last at most this long (the wait ends the moment its key is
#: set): 1,000 idle nodes cost the server 200 requests a second, and a new epoch is seen within.
FOLLOW_SLICE_S = 5.0


@dataclass(frozen=True)
class RunSettings:
    """What the nodes run: backend, ranks per node, all-reduce size and the floors."""

    backend: str
    nproc: int
    size_bytes: int
    min_busbw_gbps: float | None
    bandwidth: bool
    bench_timeout_s: float
    python: str
    #: the workers' engine as asked (auto, torch, nccl4py); node 0 decides one for every node
    engine: str = "auto"
    relative_floor: float = localise.RELATIVE_FLOOR
    link_floor: float = 0.5
    #: the node checks' deadline (a check may take check_timeout_s before the runner gives up)
    checks_timeout_s: float = 0.0
    #: --ddp: last, the DDP ladder's step 4 over every rank of every node (preflight/ddp/world.py)
    ddp: bool = False
    #: how long one node's DDP step may take (the workers' start-up and ddp_timeout_s)
    ddp_deadline_s: float = 0.0


class Runner(Protocol):
    """What one node runs for the agent."""

    def facts(self, nonce: str) -> dict[str, Any]:
        """This node's arrival (:func:`preflight.cluster.facts.node_facts`)."""
        ...

    def checks(self) -> dict[str, Any]:
        """The node checks, as JSON (status, results, fingerprint)."""
        ...

    def allreduce(self, *, key: str, tag: str, group: list[int], nproc: Callable[[int], int],
                  engine: str) -> dict[str, Any]:
        """This node's share of one group's all-reduce (store keys under ``key``)."""
        ...

    def ddp(self, *, key: str, nodes: list[int], nproc: Callable[[int], int]) -> dict[str, Any]:
        """This node's ranks of the DDP training over ``nodes`` (store keys under ``key``)."""
        ...


class Restarted(RuntimeError):
    """Node 0 opened a new epoch (it restarted): join it."""


def new_nonce() -> str:
    return os.urandom(8).hex()


class Agent:
    """The phases, for node 0 (:meth:`lead`) and the others (:meth:`follow`)."""

    def __init__(self, opts: ClusterOptions, settings: RunSettings, base: Rendezvous,
                 runner: Runner, *, host: str, progress: Callable[[str], None] | None = None,
                 nonce: str | None = None) -> None:
        self.opts, self.settings, self.base, self.runner = opts, settings, base, runner
        self.host = host
        self.nonce = nonce or new_nonce()
        self.progress = progress or (lambda _text: None)
        self.started = time.monotonic()
        self.store = base
        self.k = 0
        self.peer_ops: dict[int, int] = {}
        #: wake key -> the pause before node 0 looks again at a log already marked complete
        self._pauses: dict[str, float] = {}

    def run(self) -> dict[str, Any]:
        return self.lead() if self.opts.node_rank == 0 else self.follow()

    # ------------------------------------------------------------------ the other nodes

    def follow(self) -> dict[str, Any]:
        """A node other than 0: arrive, follow the steps to the verdict (or raise)."""
        for _ in range(MAX_REJOINS):
            try:
                return self._follow_epoch()
            except Restarted:
                self.progress("node 0 restarted: joining again")
                self.started = time.monotonic()
        raise MasterLost(f"node 0 restarted {MAX_REJOINS} times while this node waited")

    def _follow_epoch(self) -> dict[str, Any]:
        o = self.opts
        until = self.started + o.timeout_s
        # Node 0 counts the epoch up, then sets "started" (waited on server-side; in torchrun's
        # store an earlier run's is already there: a newer epoch is noticed while waiting).
        if not self.base.wait_for("started", until):
            raise MasterLost(f"node 0's agent did not start at {self.base.master} within "
                             f"{o.timeout_s:g} s")
        self.epoch = epoch = self.base.add("epoch", 0)
        self.store = self.base.scoped(f"e{epoch}")
        if not self._wait("lead", until):
            raise MasterLost(f"node 0's agent did not announce itself at {self.base.master} "
                             f"within {o.timeout_s:g} s")
        lead = self._read("lead", "lead", wire.lead)
        write(self.store, "arrive", o.node_rank, self.nonce, self.runner.facts(self.nonce),
              expect=lead["nnodes"] - 1)
        self.progress("arrived")
        # Node 0's deadline, not ours: it closes the arrivals, then takes every node at once.
        if not self._wait(f"ok/{self.nonce}", time.monotonic() + lead["timeout_s"] + SLACK_S):
            raise MasterLost(f"node 0 ({lead['host']}) did not take this node's arrival within "
                             f"{lead['timeout_s'] + SLACK_S:g} s; look at node 0's own output")
        ack = self._read(f"ok/{self.nonce}", "ack", wire.ack)
        if ack["refused"]:
            raise ClusterUsageError(ack["refused"])
        k, wait_s = ack["from_step"], lead["timeout_s"] + SLACK_S
        while True:
            if not self._wait(f"step/{k}", time.monotonic() + wait_s):
                raise MasterLost(f"node 0 ({self.base.master}) published no step {k} within "
                                 f"{wait_s:g} s: it stopped answering (SIGSTOP, overload) or "
                                 "died; look at node 0's own output")
            step = self._read(f"step/{k}", "verdict", wire.step)
            if step["do"] == "verdict":
                write(self.store, "got", o.node_rank, self.nonce, True)
                return dict(step["verdict"])
            if step["replaced"].get(o.node_rank, self.nonce) != self.nonce:
                raise ClusterUsageError(f"node rank {o.node_rank} was taken over by a newer "
                                        "agent; this one stops")
            if o.node_rank in step["nodes"]:
                answer = self._do(k, step)
                if answer is not None:
                    answer.update(nonce=self.nonce, store_ops=self.store.ops)
                    write(self.store, f"res/{k}", o.node_rank, self.nonce, answer,
                          expect=len(step["nodes"]) - (1 if 0 in step["nodes"] else 0))
            wait_s = float(step["deadline_s"]) + SLACK_S
            k += 1

    def _wait(self, key: str, until: float) -> bool:
        """Wait for ``key``; in torchrun's store, a new epoch (node 0 restarted) interrupts."""
        watch = self.opts.use_agent_store and self.opts.node_rank != 0
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            if self.store.wait_slice(key, min(FOLLOW_SLICE_S, left)):
                return True
            if watch and self.base.add("epoch", 0) != self.epoch:
                raise Restarted

    def _read(self, key: str, kind: str, check: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        try:
            return check(self.store.get(key, kind))
        except wire.Garbage as exc:
            raise MasterLost(f"the store's {key} (from node 0, or from anything that reaches "
                             f"{self.base.master}) is not valid: {exc}") from None

    def _do(self, k: int, step: Mapping[str, Any]) -> dict[str, Any] | None:
        me = self.opts.node_rank
        if step["do"] == "checks":
            self.progress("node checks")
            return self.runner.checks()
        nodes = list(step["nodes"])
        nproc = step["nproc"]
        if step["do"] == "ddp":
            self.progress("DDP over every node")
            return self.runner.ddp(key=f"s{k}/ddp/", nodes=nodes,
                                   nproc=lambda r: wire.nproc_of(nproc, r))
        for i, group in enumerate(wire.groups_of(step["groups"], nodes)):
            if me in group:
                self.progress(f"all-reduce {step['tag']} with nodes {group}")
                return self.runner.allreduce(key=f"s{k}/g{i}/", tag=step["tag"], group=group,
                                             nproc=lambda r: wire.nproc_of(nproc, r),
                                             engine=step["engine"])
        return None

    # ------------------------------------------------------------------ node 0

    def lead(self) -> dict[str, Any]:
        """Node 0: run every phase, publish and return the verdict."""
        o = self.opts
        self.epoch = self.base.add("epoch", 1)
        self.store = self.base.scoped(f"e{self.epoch}")
        self.store.set("lead", {"nonce": self.nonce, "nnodes": o.nnodes,
                                "timeout_s": o.timeout_s, "host": self.host[:wire.MAX_NAME]})
        self.base.set("started", self.epoch)
        self.roll = roll = Roll(o.nnodes, o.timeout_s, backend=self.settings.backend)
        roll.take(Entry(0, 0, self.nonce, self.runner.facts(self.nonce)), step=0, closed=False)
        self.arrivals = LogReader(self.store, "arrive", "arrival")
        self.progress("waiting for the other nodes")
        deadline = self.started + o.timeout_s
        while True:
            self._drain(step=0, closed=False)
            if all(r in roll.accepted for r in range(o.nnodes)) or time.monotonic() >= deadline:
                break
            self._look("arrive/all", deadline)
        roll.flush_acks(self.store)
        v = self.verdict = Verdict(o.nnodes, roll, missing=[r for r in range(o.nnodes)
                                                            if r not in roll.accepted])
        if roll.usage or 0 not in roll.accepted:
            return self._publish(v)
        self.engine = choose_engine(self.settings.engine, self.settings.backend,
                                    {r: a.get("nccl4py") for r, a in roll.accepted.items()})
        arrived = sorted(roll.accepted)
        checks_s = max(o.timeout_s, self.settings.checks_timeout_s)
        got, _ = self._step({"do": "checks", "deadline_s": checks_s}, arrived, kind="checks",
                            check=wire.checks_answer, mine=self.runner.checks,
                            what="node checks")
        v.checks = got
        flat = {r: parity.flatten(c.get("fingerprint"), roll.accepted[r]["facts"])
                for r, c in got.items()}
        v.differences = parity.compare(flat) if len(flat) > 1 else []
        alive = sorted(got)
        if self.settings.bandwidth and sum(self.nproc(r) for r in alive) >= 2 \
                and not roll.usage:
            self._bandwidth(v, alive)
        if self.settings.ddp and not roll.usage:
            self._ddp(v, [r for r in alive if r not in v.unresponsive])
        return self._publish(v)

    def nproc(self, rank: int) -> int:
        return int(self.roll.accepted[rank]["nproc"])

    def _drain(self, *, step: int, closed: bool) -> None:
        for e in self.arrivals.poll():
            self.roll.take(e, step=step, closed=closed)
        if closed:
            self.roll.flush_acks(self.store)

    def _look(self, wake: str, deadline: float) -> None:
        """Wait until ``wake`` is set (a log's last writer sets it) or LOOK_S passes. Once it is
        set while entries are still missing (an earlier writer between its count and its
        pointer), look again after a pause that doubles each time, up to LOOK_S: not 20 polls a
        second while that writer waits for a CPU."""
        left = deadline - time.monotonic()
        if left > 0 and self.store.wait_slice(wake, min(LOOK_S, left)):
            pause = self._pauses.get(wake, 0.05)
            self._pauses[wake] = min(LOOK_S, 2 * pause)
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

    def _step(self, step: dict[str, Any], nodes: list[int], *, kind: str,
              check: Callable[[Any], dict[str, Any]], mine: Callable[[], dict[str, Any]],
              what: str) -> tuple[dict[int, dict[str, Any]], set[int]]:
        """Publish step k for ``nodes``, run node 0's part, gather the others' answers (and the
        node ranks whose answer was not valid)."""
        k = self.k
        # The deadline runs from the publication, as on the other nodes (who wait for the next
        # step at most deadline_s + SLACK_S after their own part).
        deadline = time.monotonic() + float(step["deadline_s"])
        self.store.set(f"step/{k}", {**step, "nodes": wire.runs(nodes),
                                     "replaced": {str(r): n for r, n in
                                                  self.roll.replaced.items()}})
        got: dict[int, dict[str, Any]] = {}
        if 0 in nodes:
            got[0] = mine()
        want = {r for r in nodes if r != 0}
        log = LogReader(self.store, f"res/{k}", kind)
        self.progress(f"gathering {what}")
        bad: set[int] = set()
        while True:
            self._drain(step=k, closed=True)
            for e in log.poll():
                self._answer(e, want=want, check=check, got=got, bad=bad, what=what)
            if want <= set(got) | bad or time.monotonic() >= deadline:
                break
            self._look(f"res/{k}/all", deadline)
        for r in sorted(want - set(got) - bad):
            self.verdict.unresponsive.setdefault(r, what)
        self.k += 1
        return got, bad

    def _answer(self, e: Entry, *, want: set[int], check: Callable[[Any], dict[str, Any]],
                got: dict[int, dict[str, Any]], bad: set[int], what: str) -> None:
        if e.rank is None or e.rank not in want:
            if e.garbage:
                self.roll.garbage.append({"node_rank": e.rank, "what": what, "why": e.garbage})
            return
        if e.nonce != self.roll.nonce_of(e.rank):
            return  # an earlier agent of that node rank (it restarted): not its answer
        try:
            if e.garbage:
                raise wire.Garbage(e.garbage)
            answer = check(e.value)
        except wire.Garbage as exc:
            self.roll.garbage.append({"node_rank": e.rank, "what": what, "why": str(exc)})
            bad.add(e.rank)
            return
        self.peer_ops[e.rank] = max(self.peer_ops.get(e.rank, 0), answer.pop("store_ops", 0))
        got[e.rank] = answer

    def _allreduce(self, tag: str, rule: str | list[list[int]], nodes: list[int]
                   ) -> dict[tuple[int, ...], dict[str, Any]]:
        """One round: every group at once; each group's answers merged and judged."""
        s = self.settings
        nproc = {r: self.nproc(r) for r in nodes}
        step = {"do": "allreduce", "tag": tag, "groups": rule, "engine": self.engine,
                "nproc": wire.compact_nproc(nproc),
                "deadline_s": s.bench_timeout_s + self.opts.timeout_s}
        groups = wire.groups_of(rule, nodes)
        mine = next((g for g in groups if 0 in g), None)
        gi = groups.index(mine) if mine is not None else 0
        got, bad = self._step(step, nodes, kind="allreduce", check=wire.allreduce_answer,
                              mine=lambda: self.runner.allreduce(
                                  key=f"s{self.k}/g{gi}/", tag=tag, group=list(mine or []),
                                  nproc=lambda r: nproc[r], engine=self.engine),
                              what=f"all-reduce {tag}")
        out = {}
        for g in groups:
            merged = merge(g, got, [r for r in g if r in bad])
            if len(g) > 1:
                merged = judge_across(merged, backend=s.backend, link=self._link(g),
                                      min_busbw_gbps=s.min_busbw_gbps, link_floor=s.link_floor)
            out[tuple(g)] = merged
        return out

    def _link(self, group: list[int]) -> wire.Link | None:
        return min_link([self.roll.accepted[r].get("link") for r in group])

    def _floor(self, group: tuple[int, ...]) -> float | None:
        s = self.settings
        return floor_for(s.backend, self._link(list(group)), min_busbw_gbps=s.min_busbw_gbps,
                         link_floor=s.link_floor)

    def _bandwidth(self, v: Verdict, alive: list[int]) -> None:
        world = self._allreduce("world", "all", alive)[tuple(alive)]
        v.allreduce = world
        alive = [r for r in alive if r not in v.unresponsive]
        if len(alive) < 3:
            if not world.get("ok"):
                v.failed.update({r: "its own workers failed in the all-reduce over all nodes"
                                 for r in world.get("failed_nodes", []) if r in alive})
            return
        loc = localise.Localiser(alive, relative_floor=self.settings.relative_floor)
        multi = [r for r in alive if self.nproc(r) >= 2]
        if multi:
            res = self._allreduce("intra", "single", multi)
            loc.rounds += 1
            v.rounds.append(round_json("intra", res, None))
            for g, r in res.items():
                if Status.parse(r["status"]) >= Status.ERROR:
                    where = (loc.known_slow if r.get("reason") == "BusbwLow"
                             else loc.known_failed)
                    where[g[0]] = f"its own all-reduce (no network): {r['message']}"
        groups, tag = loc.first_groups(), "pairs"
        while groups:
            nodes = sorted({n for g in groups for n in g})
            rule: str | list[list[int]] = "pairs" if tag == "pairs" else [list(g) for g in groups]
            res = self._allreduce(tag, rule, nodes)
            for n in list(v.unresponsive):
                if n in loc.candidates:
                    loc.known_failed[n] = f"its agent did not answer in {v.unresponsive[n]}"
            loc.observe(tag, {g: localise.Outcome(
                r.get("busbw_gbps") if r.get("ok") else None, why=str(r.get("message", "")),
                floor_gbps=self._floor(g)) for g, r in res.items()})
            v.rounds.append(round_json(tag, res, loc.bar()))
            groups, tag = loc.next_groups(), "confirm"
        v.conclusion = loc.judge()

    def _ddp(self, v: Verdict, nodes: list[int]) -> None:
        """Every rank of every node in one DDP training, judged as one (preflight/ddp/world.py)."""
        from preflight.ddp.world import judge_world

        nproc = {r: self.nproc(r) for r in nodes}
        step = {"do": "ddp", "nproc": wire.compact_nproc(nproc),
                "deadline_s": self.settings.ddp_deadline_s + self.opts.timeout_s}
        got, _ = self._step(step, nodes, kind="ddp", check=wire.ddp_answer,
                            mine=lambda: self.runner.ddp(key=f"s{self.k}/ddp/", nodes=nodes,
                                                         nproc=lambda r: nproc[r]),
                            what="DDP over every node")
        v.ddp = judge_world(got, nodes=nodes)

    def _publish(self, v: Verdict) -> dict[str, Any]:
        v.store = {"ops": self.store.ops, "bytes": self.store.traffic.bytes,
                   "other_nodes_ops": sum(self.peer_ops.values())}
        v.elapsed_s = time.monotonic() - self.started
        verdict = v.to_json(full=True)
        # The others get the verdict without every node's rows (each node fetching every node's
        # results would be quadratic traffic at 1,000 nodes); node 0 prints them.
        k = self.k
        self.store.set(f"step/{k}", {"do": "verdict", "verdict": v.to_json(full=False)})
        # Keep the store up until every agent took the verdict (or LINGER_S passed); agents that
        # arrive now are told to read it.
        want = {r for r in self.roll.accepted if r != 0}
        seen: set[int] = set()
        got = LogReader(self.store, "got", "ack")
        until = time.monotonic() + LINGER_S
        while time.monotonic() < until and not want <= seen:
            self._drain(step=k, closed=True)
            seen.update(e.rank for e in got.poll() if e.rank is not None)
            self._look("got/all", until)
        return verdict
