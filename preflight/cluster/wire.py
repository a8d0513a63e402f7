"""What the agents say to each other through the store, and the checks every value passes.

Every byte read from the store is untrusted: any process that reaches the master port can write
any key. A value is decoded only within a size limit, then checked for the type and range of
every field the agents use; anything else raises :class:`Garbage`, which names what was wrong,
and the node it claims to come from is reported (``NodeSentGarbage``) instead of the run
stopping. Text from peers is kept as sent (bounded) and made printable where it is shown
(:mod:`preflight.core.textsafe`). Pure.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from preflight.bench.method import MAX_NPROC
from preflight.cluster.localise import pairs
from preflight.core.result import Status

#: Largest --nnodes an agent accepts (the simulation runs 1,024; a fleet of 16,384 nodes is far
#: beyond what one TCPStore serves within a minute).
MAX_NODES = 16384
#: Size limits per value, bytes: an arrival is ~1 kB, node checks 5-20 kB (results and the
#: fingerprint), an all-reduce answer ~2 kB, a DDP answer ~1 kB per rank (its sample indices);
#: a verdict grows with the nodes that are named.
LIMITS = {"arrival": 64 << 10, "checks": 1 << 20, "allreduce": 64 << 10, "ack": 4 << 10,
          "lead": 4 << 10, "step": 1 << 20, "verdict": 16 << 20, "uid": 4 << 10,
          "ddp": 2 << 20}
#: Longest text field kept from a peer (a message, a remedy), and the longest name (a host).
MAX_TEXT = 4096
MAX_NAME = 255
MAX_ITEMS = 256


class Garbage(ValueError):
    """A value that is not what the protocol says (too big, not JSON, a wrong type)."""


def encode(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def decode(raw: bytes | str, kind: str) -> Any:
    """JSON within the size limit of ``kind`` (a key of :data:`LIMITS`)."""
    limit = LIMITS[kind]
    if len(raw) > limit:
        raise Garbage(f"its {kind} value is {len(raw):,} bytes, more than {limit:,}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Garbage(f"its {kind} value is not JSON") from None


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise Garbage(what)


def text(d: Mapping[str, Any], key: str, *, limit: int = MAX_TEXT,
         optional: bool = False) -> str | None:
    v = d.get(key)
    if v is None and optional:
        return None
    _need(isinstance(v, str), f"{key} is {_kind(v)}, expected text")
    assert isinstance(v, str)
    _need(len(v) <= limit, f"{key} is {len(v):,} characters, more than {limit:,}")
    return v


def integer(d: Mapping[str, Any], key: str, lo: int, hi: int, *,
            optional: bool = False) -> int | None:
    v = d.get(key)
    if v is None and optional:
        return None
    _need(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
          f"{key} is {_shown(v)}, expected a whole number in {lo}..{hi}")
    assert isinstance(v, int)
    return v


def number(d: Mapping[str, Any], key: str, lo: float, hi: float, *,
           optional: bool = False) -> float | None:
    v = d.get(key)
    if v is None and optional:
        return None
    _need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
          and lo <= v <= hi, f"{key} is {_shown(v)}, expected a number in {lo:g}..{hi:g}")
    assert isinstance(v, (int, float))
    return float(v)


def mapping(d: Mapping[str, Any], key: str, *, optional: bool = False) -> dict[str, Any] | None:
    v = d.get(key)
    if v is None and optional:
        return None
    _need(isinstance(v, dict), f"{key} is {_kind(v)}, expected an object")
    assert isinstance(v, dict)
    _need(len(v) <= MAX_ITEMS * 4, f"{key} has {len(v):,} entries")
    return v


def status(d: Mapping[str, Any], key: str = "status") -> str:
    v = text(d, key, limit=8)
    try:
        Status.parse(str(v))
    except ValueError:
        raise Garbage(f"{key} is {_shown(v)}, not a status") from None
    return str(v)


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false",
            type(None): "null"}.get(type(v), f"a {type(v).__name__}")


def _shown(v: Any) -> str:
    raw = json.dumps(v) if isinstance(v, (int, float, str, bool, type(None))) else _kind(v)
    return raw if len(raw) <= 40 else raw[:37] + "..."


def nonce(d: Mapping[str, Any]) -> str:
    v = text(d, "nonce", limit=32)
    _need(bool(v) and all(c in "0123456789abcdef" for c in str(v)), "nonce is not hex")
    return str(v)


@dataclass(frozen=True)
class Link:
    """The link a node's NCCL uses across nodes: ``transport`` rdma or socket; ``gbps`` in Gb/s
    (1e9 bit/s) summed over what NCCL selects, None when unknown; ``basis`` how it was read;
    ``virtual``: a software interface (veth, bridge) whose speed is nominal."""

    transport: str
    gbps: float | None
    basis: str
    virtual: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"transport": self.transport, "gbps": self.gbps, "basis": self.basis,
                "virtual": self.virtual}

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Link:
        t = text(d, "transport", limit=8)
        _need(t in ("rdma", "socket"), f"link transport is {_shown(t)}")
        virtual = d.get("virtual", False)
        _need(isinstance(virtual, bool), "link virtual is not true/false")
        return cls(str(t), number(d, "gbps", 0, 1e6, optional=True),
                   str(text(d, "basis", limit=400)), bool(virtual))


def arrival(d: Any) -> dict[str, Any]:
    """An agent's registration (facts.node_facts); returns the checked copy."""
    _need(isinstance(d, dict), f"its arrival is {_kind(d)}, expected an object")
    out: dict[str, Any] = {
        "node_rank": integer(d, "node_rank", 0, MAX_NODES - 1),
        "nonce": nonce(d),
        "host": text(d, "host", limit=MAX_NAME),
        "pid": integer(d, "pid", 0, 1 << 31),
        "nnodes": integer(d, "nnodes", 1, MAX_NODES),
        "timeout_s": number(d, "timeout_s", 0.001, 3600.0),
        "nproc": integer(d, "nproc", 1, MAX_NPROC),
        "backend": text(d, "backend", limit=8),
        "interface": text(d, "interface", limit=64, optional=True),
    }
    _need(out["backend"] in ("nccl", "gloo"), f"backend is {_shown(out['backend'])}")
    addr = text(d, "addr", limit=64, optional=True)
    if addr is not None:
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            raise Garbage(f"addr is {_shown(addr)}, not an IP address") from None
    out["addr"] = addr
    nccl4py = d.get("nccl4py")
    _need(nccl4py is None or isinstance(nccl4py, bool), "nccl4py is not true/false/null")
    out["nccl4py"] = nccl4py
    link = mapping(d, "link", optional=True)
    out["link"] = Link.parse(link).to_json() if link is not None else None
    facts = mapping(d, "facts")
    assert facts is not None
    env = mapping(facts, "env")
    assert env is not None
    _need(len(env) <= MAX_ITEMS and all(isinstance(k, str) and isinstance(v, str)
                                        and len(k) <= 128 and len(v) <= MAX_TEXT
                                        for k, v in env.items()), "facts.env is not text: text")
    out["facts"] = {"gpu_count": integer(facts, "gpu_count", 0, 4096, optional=True),
                    "gpu_model": text(facts, "gpu_model", limit=MAX_NAME, optional=True),
                    "mtu": integer(facts, "mtu", 0, 1 << 20, optional=True),
                    "env": dict(env)}
    return out


def _result(r: Any) -> dict[str, Any]:
    _need(isinstance(r, dict), f"a check result is {_kind(r)}")
    details = mapping(r, "details", optional=True) or {}
    return {"check": text(r, "check", limit=64), "status": status(r),
            "scope": text(r, "scope", limit=16, optional=True) or "node",
            "reason": text(r, "reason", limit=64), "message": text(r, "message"),
            "remedy": text(r, "remedy", optional=True) or "", "details": details,
            "duration_s": number(r, "duration_s", 0, 1e6, optional=True) or 0.0}


def checks_answer(d: Any) -> dict[str, Any]:
    """A node's node-check answer: status, results, fingerprint."""
    _need(isinstance(d, dict), f"its node checks are {_kind(d)}, expected an object")
    results = d.get("results")
    _need(isinstance(results, list) and len(results) <= MAX_ITEMS,
          f"results is {_kind(results)}, expected a list")
    assert isinstance(results, list)
    fp = mapping(d, "fingerprint", optional=True)
    if fp is not None:
        for key in ("packages", "hashes"):
            sub = fp.get(key)
            _need(sub is None or (isinstance(sub, dict) and len(sub) <= MAX_ITEMS * 4),
                  f"fingerprint.{key} is {_kind(sub)}, expected an object")
    return {"nonce": nonce(d), "status": status(d), "results": [_result(r) for r in results],
            "fingerprint": fp,
            "fingerprint_sha256": text(d, "fingerprint_sha256", limit=64, optional=True),
            "store_ops": integer(d, "store_ops", 0, 1 << 40, optional=True) or 0}


#: The bench parent's failure kinds (RunRecord.failure.kind), and None when the run completed.
FAILURE_KINDS = ("stalled", "hung", "died", "error", "timeout", "spawn", "slow_start")


def allreduce_answer(d: Any) -> dict[str, Any]:
    """A node's share of one all-reduce: its judged result, and NCCL's WARN lines."""
    _need(isinstance(d, dict), f"its all-reduce answer is {_kind(d)}, expected an object")
    kind = d.get("failure_kind")
    _need(kind is None or kind in FAILURE_KINDS, f"failure_kind is {_shown(kind)}")
    warns = _warnings(d, 16)
    return {"nonce": nonce(d), "status": status(d), "reason": text(d, "reason", limit=64),
            "message": text(d, "message") or "",
            "busbw_gbps": number(d, "busbw_gbps", 0, 1e7, optional=True),
            "world_size": integer(d, "world_size", 0, MAX_NODES * MAX_NPROC, optional=True),
            "failure_kind": kind, "nccl_warnings": list(warns),
            "store_ops": integer(d, "store_ops", 0, 1 << 40, optional=True) or 0}


def _warnings(d: Mapping[str, Any], most: int) -> list[str]:
    warns = d.get("nccl_warnings", [])
    _need(isinstance(warns, list) and len(warns) <= most
          and all(isinstance(w, str) and len(w) <= 400 for w in warns),
          "nccl_warnings is not a short list of text")
    return list(warns)


def ddp_answer(d: Any) -> dict[str, Any]:
    """A node's part of the DDP training over every node (preflight.ddp.world.node_step): the
    fields node 0's judgement reads, checked; each rank's facts are checked there."""
    _need(isinstance(d, dict), f"its DDP answer is {_kind(d)}, expected an object")
    ranks = d.get("ranks", [])
    _need(isinstance(ranks, list) and len(ranks) <= MAX_NPROC
          and all(isinstance(r, dict) for r in ranks), "ranks is not a list of objects")
    failure = mapping(d, "failure", optional=True)
    if failure is not None:
        failure = {"kind": text(failure, "kind", limit=16),
                   "ranks": _ranks(failure.get("ranks", []), "failure.ranks")[:MAX_NPROC]}
    device = mapping(d, "device", optional=True)
    if device is not None:
        device = {**device, "status": text(device, "status", limit=8),
                  "message": text(device, "message", optional=True) or ""}
    return {"nonce": nonce(d), "status": status(d), "reason": text(d, "reason", limit=64),
            "message": text(d, "message") or "", "ranks": list(ranks), "failure": failure,
            "device": device, "nccl_warnings": _warnings(d, 20),
            "seconds": number(d, "seconds", 0, 1e6, optional=True),
            "store_ops": integer(d, "store_ops", 0, 1 << 40, optional=True) or 0}


def ack(d: Any) -> dict[str, Any]:
    """Node 0's answer to an arrival: the step to start from, or why the agent is refused."""
    _need(isinstance(d, dict), "the ack is not an object")
    return {"nonce": nonce(d), "from_step": integer(d, "from_step", 0, 1 << 20),
            "refused": text(d, "refused", optional=True)}


def lead(d: Any) -> dict[str, Any]:
    """What node 0 announces before the arrivals: its node count and deadline."""
    _need(isinstance(d, dict), "node 0's announcement is not an object")
    return {"nonce": nonce(d), "nnodes": integer(d, "nnodes", 1, MAX_NODES),
            "timeout_s": number(d, "timeout_s", 0.001, 3600.0),
            "host": text(d, "host", limit=MAX_NAME)}


def _ranks(v: Any, what: str) -> list[int]:
    _need(isinstance(v, list) and len(v) <= MAX_NODES
          and all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_NODES
                  for r in v), f"{what} is not a list of node ranks")
    return list(v)


def runs(ranks: Iterable[int]) -> list[list[int]]:
    """Node ranks as inclusive runs, ``[0, 1, 2, 5]`` -> ``[[0, 2], [5, 5]]``: a step names all
    its nodes in a few bytes however many they are (each node fetches every step)."""
    out: list[list[int]] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def expand(v: Any, what: str = "nodes") -> list[int]:
    """The node ranks of :func:`runs` output, checked."""
    _need(isinstance(v, list) and len(v) <= MAX_NODES, f"{what} is not a list of runs")
    out: list[int] = []
    for item in v:
        _need(isinstance(item, list) and len(item) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
              and 0 <= item[0] <= item[1] < MAX_NODES, f"{what} has a bad run")
        out.extend(range(item[0], item[1] + 1))
        _need(len(out) <= MAX_NODES, f"{what} names more than {MAX_NODES} nodes")
    return sorted(set(out))


#: How a step's nodes form groups: one group of all, each node alone, consecutive pairs; or an
#: explicit list of groups (the confirm round).
GROUP_RULES = ("all", "single", "pairs")


def step(d: Any) -> dict[str, Any]:
    """A step from node 0 (or anything that wrote the key): what to run, with its deadline."""
    _need(isinstance(d, dict), f"the step is {_kind(d)}, expected an object")
    do = text(d, "do", limit=16)
    if do == "verdict":
        v = mapping(d, "verdict")
        assert v is not None
        status(v)
        integer(v, "exit_code", 0, 3)
        return {"do": "verdict", "verdict": v}
    _need(do in ("checks", "allreduce", "ddp"), f"do is {_shown(do)}")
    out: dict[str, Any] = {"do": do, "deadline_s": number(d, "deadline_s", 0.001, 86400.0),
                           "nodes": expand(d.get("nodes", []))}
    replaced = mapping(d, "replaced", optional=True) or {}
    _need(all(k.isdigit() and isinstance(v, str) for k, v in replaced.items()),
          "replaced is not rank: nonce")
    out["replaced"] = {int(k): v for k, v in replaced.items()}
    if do == "checks":
        env = mapping(d, "env", optional=True) or {}
        _need(all(isinstance(v, str) and len(v) <= MAX_NAME for v in env.values())
              and set(env) <= {"MASTER_ADDR", "MASTER_PORT"}, "env is not the master's")
        out["env"] = env
        multi = d.get("multi_node", True)
        _need(isinstance(multi, bool), "multi_node is not true/false")
        out["multi_node"] = multi
        return out
    nproc = mapping(d, "nproc")
    assert nproc is not None
    out["nproc"] = {"default": integer(nproc, "default", 1, MAX_NPROC),
                    "except": _nproc_except(nproc.get("except", {}))}
    if do == "ddp":
        return out
    tag = text(d, "tag", limit=16)
    _need(tag in ("world", "intra", "pairs", "confirm"), f"tag is {_shown(tag)}")
    out["tag"] = tag
    engine = text(d, "engine", limit=16)
    _need(engine in ("torch", "nccl4py"), f"engine is {_shown(engine)}")
    out["engine"] = engine
    groups = d.get("groups")
    if isinstance(groups, str):
        _need(groups in GROUP_RULES, f"groups is {_shown(groups)}")
        out["groups"] = groups
    else:
        _need(isinstance(groups, list) and len(groups) <= MAX_NODES, "groups is not a list")
        assert isinstance(groups, list)
        out["groups"] = [_ranks(g, "a group") for g in groups]
    floor = d.get("floor_gbps")
    _need(floor is None or (isinstance(floor, (int, float)) and not isinstance(floor, bool)
                            and math.isfinite(floor) and floor >= 0), "floor_gbps is wrong")
    out["floor_gbps"] = floor
    return out


def _nproc_except(v: Any) -> dict[int, int]:
    _need(isinstance(v, dict) and len(v) <= MAX_NODES, "nproc.except is not an object")
    out = {}
    for k, n in v.items():
        _need(isinstance(k, str) and k.isdigit() and isinstance(n, int)
              and not isinstance(n, bool) and 1 <= n <= MAX_NPROC, "nproc.except is wrong")
        out[int(k)] = n
    return out


def compact_nproc(nproc: Mapping[int, int]) -> dict[str, Any]:
    """Ranks per node as the most common count and the exceptions (a few bytes at any N)."""
    counts: dict[int, int] = {}
    for n in nproc.values():
        counts[n] = counts.get(n, 0) + 1
    default = max(counts, key=lambda n: (counts[n], -n)) if counts else 1
    return {"default": default,
            "except": {str(r): n for r, n in sorted(nproc.items()) if n != default}}


def groups_of(rule: str | list[list[int]], nodes: list[int]) -> list[list[int]]:
    """The groups of a step: its rule applied to its nodes (every node computes the same)."""
    if not isinstance(rule, str):
        return [list(g) for g in rule]
    if rule == "all":
        return [list(nodes)]
    if rule == "single":
        return [[r] for r in nodes]
    return [list(g) for g in pairs(nodes)[0]]


def nproc_of(nproc: Mapping[str, Any], rank: int) -> int:
    return int(nproc["except"].get(rank, nproc["default"]))
