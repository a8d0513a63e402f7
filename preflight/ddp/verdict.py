"""The DDP ladder's outcome: each step, the layer the first failing one names, the evidence, and
how it is shown (a table, JSON, one check Result for ``check --ddp``).

The layers (the field guide's method, its section 6.3: change one variable at a time):

- ``environment``: the single step fails: one rank alone on its GPU, nothing distributed
  involved: CUDA, the driver, the torch build, the device mapping;
- ``communication``: the single step passes and gloo fails: the rendezvous, gloo's TCP
  connections, ``GLOO_SOCKET_IFNAME``;
- ``nccl``: gloo passes and NCCL fails: NCCL's NIC selection, ``/dev/shm``, P2P, its
  transports (with NCCL's WARN lines and the node checks that bear on it);
- ``network``: every node passes alone and the world step across nodes fails (cluster mode);
- ``none``: every step passed: the node and the launcher are fine, the model and data are next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from preflight.core.result import SCHEMA_VERSION, Result, Scope, Status
from preflight.core.textsafe import escape
from preflight.ddp.proofs import Proof

#: The layer each step's failure names.
LAYERS = {"single": "environment", "gloo": "communication", "nccl": "nccl", "world": "network"}
#: What each step is, in words.
STEP_TITLES = {"single": "each rank alone on its GPU, no process group",
               "gloo": "every local rank, DDP over gloo",
               "nccl": "every local rank, DDP over NCCL",
               "world": "every rank of every node, DDP"}
#: The step numbers of the field guide's ladder.
STEP_NUMBERS = {"single": 1, "gloo": 2, "nccl": 3, "world": 4}
NONE_MESSAGE = ("the node and the launcher are fine: look at the model and data (field guide "
                "sections 4 and 5: the DataLoader and DistributedSampler, DDP's wrapping order, "
                "unused parameters, device mismatches)")
REMEDIES = {
    "environment": "One rank alone on one GPU fails, so nothing distributed is to blame: fix the "
                   "CUDA error named above (the driver: nvidia-smi; the torch build: python -c "
                   "'import torch; print(torch.__version__, torch.version.cuda, "
                   "torch.cuda.is_available())'; the device mapping: preflight check --only "
                   "cuda_devices,gpu_visible).",
    "communication": "gloo fails where each GPU works alone: the rendezvous or gloo's own TCP "
                     "connections. GLOO_SOCKET_IFNAME must name an interface of this node "
                     "(ip -br addr; unset, gloo uses the address the hostname resolves to: "
                     "getent hosts $(hostname)); a firewall must let the ranks connect on "
                     "ephemeral ports; preflight check --only network,master_port.",
    "nccl": "gloo works and NCCL fails: NCCL's NIC selection (NCCL_SOCKET_IFNAME, NCCL_IB_HCA), "
            "/dev/shm (preflight check --only shm), P2P and SHM (NCCL_P2P_DISABLE, "
            "NCCL_SHM_DISABLE), the driver; rerun with NCCL_DEBUG=INFO (preflight ddp --debug "
            "keeps each rank's log).",
    "network": "every node passes alone and the nodes fail together: the network between them "
               "(MASTER_ADDR, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on every node, a firewall "
               "between the nodes); preflight cluster names the slow or unreachable node.",
}
#: The variables whose value bears on each layer: named in the evidence when the job sets them.
LAYER_VARIABLES = {
    "environment": ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK"),
    "communication": ("GLOO_SOCKET_IFNAME", "GLOO_DEVICE_TRANSPORT", "MASTER_ADDR",
                      "MASTER_PORT"),
    "nccl": ("NCCL_",),
    "network": ("NCCL_", "GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT"),
}
#: The node checks run when a layer fails, for its evidence.
LAYER_CHECKS = {"environment": ("gpu_visible", "cuda_devices"),
                "communication": ("network", "master_port"),
                "nccl": ("network", "shm", "nccl_env"),
                "network": ("network",)}


@dataclass(frozen=True)
class StepResult:
    """One step of the ladder. ``status``: PASS (every proof holds), FAIL (a proof is false, or
    a rank failed, stalled or hung), ERROR (undecided: the workers could not start in time, a
    rank's report was unreadable), SKIP (needs GPUs; not run because an earlier step failed)."""

    name: str
    status: Status
    message: str
    ranks: int = 0
    backend: str | None = None
    seconds: float | None = None
    proofs: tuple[Proof, ...] = ()
    failure_kind: str | None = None
    failed_ranks: tuple[int, ...] = ()
    phase_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return STEP_TITLES.get(self.name, self.name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "number": STEP_NUMBERS.get(self.name),
                "title": self.title, "status": self.status.word,
                "seconds": round(self.seconds, 4) if self.seconds is not None else None,
                "message": self.message, "ranks": self.ranks, "backend": self.backend,
                "proofs": [p.to_json() for p in self.proofs],
                "failure": {"kind": self.failure_kind, "ranks": list(self.failed_ranks)}
                if self.failure_kind else None,
                "phase_s": {k: round(v, 4) for k, v in self.phase_s.items()}}


@dataclass(frozen=True)
class LadderResult:
    """The outcome of ``preflight ddp`` (and of the ``ddp`` check)."""

    status: Status
    layer: str | None
    reason: str
    message: str
    remedy: str = ""
    steps: tuple[StepResult, ...] = ()
    #: the node checks that bear on the failing layer (their JSON), the job's variables of that
    #: layer, NCCL's WARN lines
    evidence: Mapping[str, Any] = field(default_factory=dict)
    scope: Scope = Scope.NODE
    #: the workers' start-up, slowest rank's seconds: interpreter, imports, cuda_context
    start_s: Mapping[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    #: what the run left: processes, the store's port, GPU processes, NCCL's /dev/shm files
    leftovers: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)
    ranks: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    debug_log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "mode": "ddp", "status": self.status.word,
                "layer": self.layer, "scope": self.scope.value, "reason": self.reason,
                "message": self.message, "remedy": self.remedy,
                "steps": [s.to_json() for s in self.steps], "evidence": dict(self.evidence),
                "start_s": {k: round(v, 4) for k, v in self.start_s.items()},
                "elapsed_s": round(self.elapsed_s, 3), "leftovers": dict(self.leftovers),
                "environment": dict(self.environment), "ranks": [dict(r) for r in self.ranks],
                "notes": list(self.notes), "debug_log": self.debug_log}

    def to_result(self, name: str = "ddp") -> Result:
        """The ``ddp`` check's Result (``check --ddp``, ``prolog --ddp``): the layer's verdict,
        the whole run in ``details["ddp"]``."""
        details = {"layer": self.layer, "steps": {s.name: s.status.word for s in self.steps},
                   "elapsed_s": round(self.elapsed_s, 3), "ddp": self.to_json()}
        return Result(name, self.status, self.reason, self.message, self.remedy,
                      details=details, scope=self.scope)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def where_seconds_go(result: LadderResult) -> str:
    """"start-up 5.6 (interpreter 0.1, imports 5.3, CUDA context 0.2); single 0.31; gloo 0.20
    (init 0.05, DDP 0.01, train 0.1); wall 6.6 s"."""
    parts = []
    if result.start_s:
        inner = ", ".join(f"{k.replace('cuda_context', 'CUDA context')} {v:.2f}"
                          for k, v in result.start_s.items())
        parts.append(f"workers' start-up {sum(result.start_s.values()):.2f} ({inner})")
    for s in result.steps:
        if s.seconds is None:
            continue
        inner = ", ".join(f"{k} {v:.2f}" for k, v in s.phase_s.items() if v >= 0.005)
        parts.append(f"{s.name} {s.seconds:.2f}" + (f" ({inner})" if inner else ""))
    parts.append(f"wall {result.elapsed_s:.2f}")
    return "; ".join(parts) + " s"


def leftovers_text(left: Mapping[str, Any]) -> str:
    if not left:
        return "not checked (no worker started)"
    bad = []
    if left.get("processes"):
        bad.append(f"worker processes still alive: {left['processes']}")
    if left.get("port_free") is False:
        bad.append(f"the store's port {left.get('port')} still bound")
    if left.get("gpu_processes"):
        bad.append(f"GPU processes of the run: {left['gpu_processes']}")
    if bad:
        return "; ".join(bad)
    what = [f"{left.get('workers', 0)} worker(s) reaped"]
    if left.get("port") is not None:
        what.append(f"port {left['port']} free")
    if left.get("gpu_processes") == []:
        what.append("no GPU process of the run")
    removed = left.get("shm_removed") or []
    what.append(f"removed {len(removed)} NCCL file(s) left in /dev/shm" if removed
                else "nothing of NCCL's in /dev/shm")
    return "nothing: " + ", ".join(what)


def render_table(result: LadderResult) -> str:
    """The steps, each step's proofs, the verdict and where the seconds went."""
    ranks = ", ".join(f"rank {r.get('rank')} {r.get('label')}" for r in result.ranks)
    lines = [f"preflight ddp: {len(result.ranks)} local rank(s): {ranks}" if ranks
             else "preflight ddp: no worker started"]
    lines.append(f"  {'step':<55} {'status':<6} {'seconds':>7}  message")
    for s in result.steps:
        head = f"{STEP_NUMBERS.get(s.name, '-')} {s.name}: {s.title}"
        lines.append(f"  {head:<55} {s.status.name:<6} {_seconds(s.seconds):>7}  "
                     f"{escape(s.message, 600)}")
        for p in s.proofs:
            mark = "n/a" if p.ok is None else "PASS" if p.ok else "FAIL"
            lines.append(f"      {mark:<4} {p.title}: {escape(p.message, 600)}")
    layer = f", layer {result.layer}" if result.layer else ""
    lines.append(f"verdict: {result.status.name} {result.reason}{layer}: "
                 f"{escape(result.message, 2000)}")
    if result.remedy and result.status >= Status.WARN:
        lines.append(f"fix: {result.remedy}")
    for note in result.notes:
        lines.append(f"note: {escape(note, 600)}")
    lines.append(f"seconds: {where_seconds_go(result)}")
    lines.append(f"left behind: {leftovers_text(result.leftovers)}")
    return "\n".join(lines)


def evidence_text(checks: Sequence[Mapping[str, Any]], variables: Mapping[str, str],
                  warnings: Sequence[str]) -> str:
    """"the job sets GLOO_SOCKET_IFNAME=nosuch0; network FAIL GlooIfnameMissing: ...; NCCL
    WARN: ..." (checks that passed are left out: they bear on nothing)."""
    parts = []
    if variables:
        parts.append("the job sets " + ", ".join(f"{k}={escape(v, 80)}"
                                                 for k, v in variables.items()))
    for c in checks:
        if c.get("status") in ("warn", "fail", "error"):
            parts.append(f"{c.get('check')} {str(c.get('status')).upper()} {c.get('reason')}: "
                         f"{escape(str(c.get('message')), 400)}")
    if warnings:
        parts.append("NCCL WARN: " + " | ".join(escape(w, 300) for w in warnings[:5]))
    return "; ".join(parts)
